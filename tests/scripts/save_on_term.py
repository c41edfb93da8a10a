"""A long loop that saves its state when asked to stop (SIGTERM), as a training script with a
preemption handler does: the save takes --save_seconds, then it exits 143. Ctrl-C on its
terminal is its supervisor's business, not its own."""

import argparse
import signal
import sys
import time

parser = argparse.ArgumentParser()
parser.add_argument("--save_seconds", type=float, default=0.3)
args = parser.parse_args()


def save_and_exit(signum, frame):
    print("saving before exit", flush=True)
    time.sleep(args.save_seconds)
    sys.exit(143)


signal.signal(signal.SIGTERM, save_and_exit)
signal.signal(signal.SIGINT, signal.SIG_IGN)
for step in range(100000):
    print(f"step {step}", flush=True)
    time.sleep(0.2)
