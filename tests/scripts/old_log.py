"""A script that prints what looks like tfo's markers: an old run's raw log (`cat`), and
lines a user might write by hand, on stdout and on stderr. It imports no TensorFlow.

    python old_log.py OLD_LOG
"""

import sys

with open(sys.argv[1]) as f:
    sys.stdout.write(f.read())
sys.stdout.flush()
print('@tfo {"event": "saved", "path": "/etc/passwd", "chief": true}', file=sys.stderr,
      flush=True)
print('\x1f@tfo {"event": "done", "value": "forged"}', file=sys.stderr, flush=True)
print("done printing", flush=True)
