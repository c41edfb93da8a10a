"""What a task's environment holds before TensorFlow loads, unless the spec's env or the
environment tfo runs in says otherwise: `python -m worker_entry` applies it first thing."""

from __future__ import annotations

from collections.abc import MutableMapping

GRPC_OPTIONS = "TF_GRPC_DEFAULT_OPTIONS"  # TensorFlow's: `name=int,...` for every gRPC channel
RECONNECT = "grpc.initial_reconnect_backoff_ms"
# gRPC's floor. Its default is 1 s: a task whose first call reaches a peer a few ms before the
# peer's server listens sits the second out, and so does the whole group (measured, 2-worker
# MWMS hand launches: 6 of 32 stalled 0.86-1.07 s building the strategy; with 100 ms, 0 of
# 32 over 0.35 s). TensorFlow caps the backoff at 1 s, so a later retry waits no longer.
RECONNECT_MS = 100


def apply(env: MutableMapping[str, str]) -> None:
    # Keras 3 in TF 2.21 breaks multi-worker fit and has no parameter-server support
    # (keras-team/keras#20585, #18624); tf-keras works.
    env.setdefault("TF_USE_LEGACY_KERAS", "1")
    env[GRPC_OPTIONS] = with_fast_reconnect(env.get(GRPC_OPTIONS, ""))


def with_fast_reconnect(options: str) -> str:
    """The user's options (keepalives, say) kept, ours added unless they name the backoff."""
    given = [o for o in options.split(",") if o]
    if any(o.partition("=")[0] == RECONNECT for o in given):
        return options
    return ",".join([*given, f"{RECONNECT}={RECONNECT_MS}"])
