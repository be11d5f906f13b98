"""Boundary-send logs through PyTorch (docs/logs.md): the group's sends to
chosen peers (pipeline-stage neighbours) are teed into a host-memory log,
tagged by iteration and micro-batch, and replayed to a replacement so only
the failed stage recomputes.

    torch_eccl.log.configure(64 << 20, peers=[stage - 1, stage + 1])
    torch_eccl.log.set_tag(iteration, microbatch)     # before the sends it tags
    dist.send(activation, stage + 1)                  # logged
    torch_eccl.log.truncate(oldest_needed + 1)        # after a durable snapshot
    torch_eccl.log.replay(peer, first, last)          # to a replacement
    torch_eccl.log.discard(iteration)                 # an interrupted iteration's first attempt
"""

from __future__ import annotations

import torch.distributed as dist

POLICIES = {"error": 0, "block": 1, "evict": 2}


def _backend(group):
    from . import backend

    return backend(group)


def configure(capacity_bytes: int, peers=None, when_full: str = "error", group: dist.ProcessGroup | None = None):
    """``capacity_bytes`` = 0 turns logging off; ``peers`` None logs every peer."""
    if when_full not in POLICIES:
        raise ValueError(f"torch_eccl.log.configure: when_full {when_full!r} is not one of {sorted(POLICIES)}")
    _backend(group).log_configure(int(capacity_bytes), [int(p) for p in (peers or [])], POLICIES[when_full])


def set_tag(iteration: int, microbatch: int = 0, group: dist.ProcessGroup | None = None) -> None:
    _backend(group).log_set_tag(int(iteration), int(microbatch))


def truncate(iteration: int, group: dist.ProcessGroup | None = None) -> None:
    """Frees every record older than ``iteration``."""
    _backend(group).log_truncate(int(iteration))


def discard(from_iteration: int, group: dist.ProcessGroup | None = None) -> None:
    """Drops every record of ``from_iteration`` or later."""
    _backend(group).log_discard(int(from_iteration))


def replay(peer: int, from_iteration: int, to_iteration: int, group: dist.ProcessGroup | None = None) -> None:
    """Re-sends the records for ``peer`` tagged in [from, to], in order; the
    peer receives them with the ``dist.recv`` calls it would have made."""
    _backend(group).log_replay(int(peer), int(from_iteration), int(to_iteration))
