"""Where the guide is (README.md's table of docs/): the end of `tfo --help`, and for an error
whose field has a page, the page (the first field the message names decides). Pure: the CLI
prints what `guide_page` names (`tests/test_docs.py` checks every page it names exists)."""

from __future__ import annotations

GUIDE = "docs/guide/"
EPILOG = (f"The guide: README.md, and a page per topic under {GUIDE} (every cluster-file key: "
          "docs/reference/cluster-file.md), in tfo's source tree.")
GUIDE_PAGES = (("hosts", "lab.md"), ("host", "lab.md"), ("--hosts", "lab.md"),
               ("backend.slurm", "slurm.md"), ("--on", "slurm.md"), ("--partition", "slurm.md"),
               ("job.gpus_per_task", "gpus.md"), ("job.collective", "gpus.md"),
               ("localhost.gpus", "gpus.md"), ("restart", "faults.md"),
               ("timeouts", "faults.md"), ("job", "scripts.md"), ("tasks", "cluster-file.md"))
# Before the fields: a task on a host not under hosts:, a host's GPUs.
GUIDE_WORDS = (("under hosts:", "lab.md"), ("from the lab hosts", "lab.md"),
               ("gpus_per_task", "gpus.md"), (".gpus", "gpus.md"))


def guide_page(message: str) -> str | None:
    """The guide's page for an error: by the fields its lines start with (`hosts.gpu1.port: …`,
    `host gpu1: …`), the first of GUIDE_PAGES one is under; GUIDE_WORDS in it decide first."""
    for words, page in GUIDE_WORDS:
        if words in message:
            return GUIDE + page
    lines = message.splitlines()
    lines = lines[1:] or lines  # a first line of several says which file: "c.yaml: invalid …"
    fields = [line.strip().split(": ", 1)[0] for line in lines if ": " in line]
    return next((GUIDE + page for prefix, page in GUIDE_PAGES for f in fields
                 if f == prefix or f.startswith((prefix + ".", prefix + "[", prefix + " "))),
                None)
