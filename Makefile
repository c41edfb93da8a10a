# make run: set up .venv and run the 2-worker job on localhost:20000/20001.
# make test: set up .venv (sshd for the SSH tests, Slurm for the Slurm tests, Prometheus for
# the metrics test) and run the whole suite, in three pytest-xdist workers on 2 cores (a
# test mostly waits on its TensorFlow processes: stall windows, epochs, restarts); tests
# sharing fixed ports, an SSH lab or the Slurm lab run in one worker each: tests/conftest.py.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test bench lint clean sshd slurm prometheus pyc docs

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[tf,test,profile]'
	touch $(STAMP)

# Bytecode for our own modules, as a non-editable pip install would leave it: where
# PYTHONDONTWRITEBYTECODE is set (CI here), every `tfo` would otherwise compile them again
# (about 70 ms of a 0.3 s `tfo plan`). Cheap when nothing changed.
pyc: $(STAMP)
	@$(BIN)/python -m compileall -q orchestrator worker_entry bench >/dev/null

run: $(STAMP) pyc
	$(BIN)/tfo run clusters/localhost.yaml

# The SSH tests run real sshd processes: install openssh-server when it is missing.
sshd:
	@test -x /usr/sbin/sshd || { export DEBIAN_FRONTEND=noninteractive; \
	  apt-get update -qq && apt-get install -y -qq --no-install-recommends \
	  openssh-server openssh-client iproute2 >/dev/null; }

# The Slurm tests run a private cluster (tests/slurmlab.py): Debian's Slurm and munge.
slurm:
	@test -x /usr/sbin/slurmctld -a -x /usr/sbin/slurmd -a -x /usr/bin/srun -a \
	  -x /usr/sbin/munged || { export DEBIAN_FRONTEND=noninteractive; \
	  apt-get update -qq && apt-get install -y -qq --no-install-recommends \
	  slurmctld slurmd slurm-client munge iproute2 util-linux >/dev/null; }

# tests/test_metrics.py scrapes a real job with a real Prometheus server: Debian's.
prometheus:
	@test -x /usr/bin/prometheus || { export DEBIAN_FRONTEND=noninteractive; \
	  apt-get update -qq && apt-get install -y -qq --no-install-recommends prometheus >/dev/null; }

test: $(STAMP) pyc sshd slurm prometheus
	$(BIN)/ruff check orchestrator worker_entry tests bench
	$(BIN)/pytest -q -rfEs -n 3 --dist loadgroup --durations=25

# make bench: every figure against its target (about 25 minutes on 2 cores);
# writes bench/results.json and bench/results.png. Installs the `bench` extra (matplotlib).
bench: $(STAMP) pyc
	$(BIN)/python -c 'import matplotlib, dill' 2>/dev/null || $(BIN)/pip install --quiet -e '.[bench]'
	$(BIN)/python bench/run.py

# make docs: docs/reference/cluster-file.md (from the cluster file's models) and
# docs/reference/cli.md (every command's --help); tests/test_docs.py fails when they are stale.
docs: $(STAMP)
	$(BIN)/python -m orchestrator.cli.docgen

lint: $(STAMP)
	$(BIN)/ruff check orchestrator worker_entry tests bench

clean:
	rm -rf $(VENV) runs
