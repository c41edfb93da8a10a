"""A script that closes its own stdout and stderr, then ends well (tests/test_scripts.py):
`--how streams` closes Python's streams, `--how fds` the descriptors under them."""

import os
import sys

how = sys.argv[sys.argv.index("--how") + 1]
print("closing my output", flush=True)
if how == "streams":
    sys.stdout.close()
    sys.stderr.close()
else:
    os.close(1)
    os.close(2)
