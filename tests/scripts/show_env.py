"""Prints what a script sees of its task, as one JSON line: argv, sys.path[0], __name__,
and the environment tfo promises (README: "Bring your own script")."""

import json
import os
import sys
import time

NAMES = ("TF_CONFIG", "TFO_TASK", "TFO_IS_CHIEF", "TFO_MODEL_DIR", "TFO_BACKUP_DIR",
         "TFO_ATTEMPT", "TFO_RUN_DIR", "TMPDIR", "TF_USE_LEGACY_KERAS", "TF_GRPC_DEFAULT_OPTIONS",
         "SLURM_CPUS_PER_TASK")
print("SHOW " + json.dumps({"argv": sys.argv, "path0": sys.path[0], "name": __name__,
                            "env": {n: os.environ.get(n) for n in NAMES}}), flush=True)
if "--fail" in sys.argv:
    raise ValueError("the learning rate is negative")
if "--sleep" in sys.argv:  # never opens its port
    time.sleep(float(sys.argv[sys.argv.index("--sleep") + 1]))
