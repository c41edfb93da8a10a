"""A task without TensorFlow, for tests of what happens around it: it listens on its
TF_CONFIG port (its wrapper's READY), says so, and exits 0 after SECONDS (argv[1])."""

import json
import os
import socket
import sys
import time

config = json.loads(os.environ["TF_CONFIG"])
task = config["task"]
port = int(config["cluster"][task["type"]][task["index"]].rsplit(":", 1)[1])
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("", port))
server.listen()
print(f"listening on {port}", flush=True)
until = time.monotonic() + float(sys.argv[1])
while time.monotonic() < until:
    time.sleep(min(1.0, max(0.0, until - time.monotonic())))
print("done", flush=True)
