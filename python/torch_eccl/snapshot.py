"""Peer-memory snapshots of a ``state_dict`` (docs/snapshots.md).

A state dict (a model's, an optimizer's, or a dict of several) is put by
name: every tensor under its dotted path (``model.layer.weight``,
``optim.state.0.exp_avg``), and what is not a tensor (hyperparameters, step
counts as numbers, the dict's shape) as one small blob under
``<prefix>.__structure__``, so :func:`get_state_dict` rebuilds a dict that
``load_state_dict`` takes, with nothing to hand in. A version may hold any
subset of the tensors (``names=``): each name keeps its latest committed
copy, and :func:`versions` says which version each comes from.

    torch_eccl.snapshot.configure(replicas=1)
    torch_eccl.snapshot.put_state_dict(step, {"model": model.state_dict(),
                                              "optim": optimizer.state_dict()})
    torch_eccl.snapshot.commit(step)            # replicates in the background
    ...
    # after torch_eccl.recover(), on every rank (a replacement: once promoted):
    version = torch_eccl.snapshot.restore()
    state = torch_eccl.snapshot.get_state_dict()
    model.load_state_dict(state["model"]); optimizer.load_state_dict(state["optim"])
"""

from __future__ import annotations

import io
import pickle
from datetime import timedelta

import torch
import torch.distributed as dist

STRUCTURE = "__structure__"


class _TensorSlot:
    """Where a tensor sits in the structure: its name, shape, dtype, device."""

    def __init__(self, name: str, t: torch.Tensor):
        self.name = name
        self.shape = tuple(t.shape)
        self.dtype = t.dtype
        self.device = str(t.device)


def _backend(group):
    from . import backend

    return backend(group)


def _flatten(obj, path: str, tensors: dict):
    """The structure of `obj` with every tensor replaced by a slot; the
    tensors go into `tensors` by dotted path."""
    if isinstance(obj, torch.Tensor):
        tensors[path] = obj
        return _TensorSlot(path, obj)
    if isinstance(obj, dict):
        return {k: _flatten(v, f"{path}.{k}", tensors) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        items = [_flatten(v, f"{path}.{i}", tensors) for i, v in enumerate(obj)]
        return items if isinstance(obj, list) else tuple(items)
    return obj


def _rebuild(obj, fill):
    if isinstance(obj, _TensorSlot):
        return fill(obj)
    if isinstance(obj, dict):
        return {k: _rebuild(v, fill) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_rebuild(v, fill) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_rebuild(v, fill) for v in obj)
    return obj


def configure(replicas: int | None = None, max_in_flight_bytes: int = 0, group: dist.ProcessGroup | None = None):
    """Collective over the group (a replacement calls it once promoted).
    ``replicas``: copies of each rank's state on other ranks (None:
    ECCL_SNAPSHOT_REPLICAS, default 1). Called again after the group
    shrank, or after :func:`restore` raised :class:`ShardsLost`, it starts
    the snapshots over on the ranks, dropping every copy: read what the
    departed ranks left with :func:`get_held` first."""
    _backend(group).snapshot_configure(-1 if replicas is None else int(replicas), int(max_in_flight_bytes))


def put_state_dict(version: int, state, prefix: str = "state", names=None, group: dist.ProcessGroup | None = None):
    """Copies ``state``'s tensors (CPU or CUDA) into ``version`` and its
    structure beside them. ``names``: only the tensors whose dotted path is
    in it (a sparse version); the others keep their latest committed copy."""
    tensors: dict[str, torch.Tensor] = {}
    structure = _flatten(state, prefix, tensors)
    b = _backend(group)
    blob = io.BytesIO()
    pickle.dump(structure, blob)
    b.snapshot_put(int(version), f"{prefix}.{STRUCTURE}", torch.frombuffer(bytearray(blob.getvalue()), dtype=torch.uint8))
    wanted = None if names is None else set(names)
    for name, t in tensors.items():
        if wanted is None or name in wanted:
            b.snapshot_put(int(version), name, t.detach())


def put(version: int, name: str, t: torch.Tensor, group: dist.ProcessGroup | None = None) -> None:
    """Copies one tensor (CPU or CUDA) into ``version`` under ``name``."""
    _backend(group).snapshot_put(int(version), str(name), t.detach())


def get(name: str, out: torch.Tensor, group: dist.ProcessGroup | None = None) -> int:
    """Copies this rank's committed ``name`` into ``out`` (its size must
    match) and returns the version it comes from."""
    return _backend(group).snapshot_get(str(name), out)


def commit(version: int, group: dist.ProcessGroup | None = None) -> None:
    """This rank's puts for ``version`` are done; replication starts and
    this returns at once."""
    _backend(group).snapshot_commit(int(version))


def wait(version: int, timeout: timedelta | None = None, group: dist.ProcessGroup | None = None) -> None:
    """Until ``version`` committed on every rank's replicas (or it failed)."""
    ms = 0 if timeout is None else int(timeout.total_seconds() * 1000)
    _backend(group).snapshot_wait(int(version), ms)


def committed(group: dist.ProcessGroup | None = None) -> int:
    return _backend(group).snapshot_committed()


def versions(group: dist.ProcessGroup | None = None) -> dict[str, int]:
    """Every name this rank has and the version its committed copy is from."""
    return {name: version for name, version, _bytes in _backend(group).snapshot_list()}


def held(group: dist.ProcessGroup | None = None) -> dict[tuple[int, str], int]:
    """The copies this rank holds of other ranks' state: ``(owner, name)``
    to the version each comes from. ``owner`` is a rank of the group as it
    was when the snapshots were configured or restored: after a shrink,
    until :func:`configure` starts them over, the departed ranks keep their
    numbers here."""
    return {(owner, name): version for owner, name, version, _bytes in _backend(group).snapshot_list_held()}


def get_held(owner: int, name: str, out: torch.Tensor, group: dist.ProcessGroup | None = None) -> int:
    """Copies the held copy of ``owner``'s ``name`` into ``out`` (its size
    must match) and returns its version. Local: this is how a survivor
    takes over state whose every other copy died."""
    return _backend(group).snapshot_get_held(int(owner), str(name), out)


# ecclSnapshotRestoreState_t (eccl.h)
_RESTORE_SHARDS_LOST, _RESTORE_VIEW_SHRANK = 1, 2


class ShardsLost(RuntimeError):
    """:func:`restore` found shards that no rank's memory holds (every
    replica died with its owner); every rank raises it. Go on with
    :func:`load` (the persisted version) or, where the state came back
    another way, start over with :func:`configure`."""


class ViewShrank(RuntimeError):
    """:func:`restore` on a view smaller than the snapshots' (one recovery
    replaced a rank and dropped another): every rank raises it, the
    newcomer too; start over with :func:`configure` on every rank."""


def restore(group: dist.ProcessGroup | None = None) -> int:
    """Collective after the group's view changed (torch_eccl.recover, or a
    replacement once promoted): a replacement gets its rank's state from
    the survivors' memory. Returns the version the ranks agreed on; raises
    :class:`ShardsLost` where some shards are in no memory (the rest is
    restored), :class:`ViewShrank` where the view shrank."""
    b = _backend(group)
    try:
        return b.snapshot_restore()
    except RuntimeError as e:
        # By what the restore found, not by its text: a peer that died
        # during it raises with the same code as lost shards.
        state = b.snapshot_restore_state()
        if state == _RESTORE_SHARDS_LOST:
            raise ShardsLost(str(e)) from e
        if state == _RESTORE_VIEW_SHRANK:
            raise ViewShrank(str(e)) from e
        raise


def get_state_dict(prefix: str = "state", group: dist.ProcessGroup | None = None):
    """The committed state put under ``prefix``, rebuilt on the devices it
    came from (each tensor from its own latest committed version)."""
    b = _backend(group)
    have = {name: size for name, _version, size in b.snapshot_list()}
    key = f"{prefix}.{STRUCTURE}"
    if key not in have:
        raise KeyError(f"torch_eccl.snapshot: no committed state under {prefix!r} on this rank")
    blob = torch.empty(have[key], dtype=torch.uint8)
    b.snapshot_get(key, blob)
    structure = pickle.loads(blob.numpy().tobytes())

    def fill(slot: _TensorSlot):
        t = torch.empty(slot.shape, dtype=slot.dtype, device=slot.device)
        b.snapshot_get(slot.name, t)
        return t

    return _rebuild(structure, fill)


def persist(directory: str, group: dist.ProcessGroup | None = None) -> None:
    """Writes the newest committed version under ``directory`` in the background."""
    _backend(group).snapshot_persist(str(directory))


def persist_wait(timeout: timedelta | None = None, group: dist.ProcessGroup | None = None) -> int:
    ms = 0 if timeout is None else int(timeout.total_seconds() * 1000)
    return _backend(group).snapshot_persist_wait(ms)


def load(directory: str, group: dist.ProcessGroup | None = None) -> int:
    """Collective: the newest version every rank persisted under
    ``directory``, replicated anew. On a new job's configured group, or
    after :func:`restore` raised that shards are in no memory (every rank
    goes back to the persisted version)."""
    return _backend(group).snapshot_load(str(directory))
