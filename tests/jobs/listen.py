"""A light task: listens on its TF_CONFIG port (so the wrapper reports it ready), then
sleeps `argv[1]` seconds (default: until stopped) and exits 0. No TensorFlow."""

import json
import os
import socket
import sys
import time

config = json.loads(os.environ["TF_CONFIG"])
task = config["task"]
port = int(config["cluster"][task["type"]][int(task["index"])].rsplit(":", 1)[1])
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("", port))
server.listen()
time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 1e9)
