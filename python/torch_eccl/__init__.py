"""eccl as a torch.distributed backend.

Importing this package registers the backend "eccl" for CPU tensors::

    import torch_eccl  # noqa: F401
    torch.distributed.init_process_group("eccl")          # torchrun, env://

Under ``eccl-run`` (ranks and standbys), ``torch_eccl.init_process_group()``
does the same from eccl's environment and lets a standby wait for its rank.
c10d's reconfigure API (``torch.distributed._reconfigure``) moves a group to a
new membership as eccl's delta; the functions below cover what it cannot
express: recovery after a failure, planned migration, grow, and the stats.
See docs/pytorch.md.
"""

from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.constants import default_pg_timeout

from . import _C
from ._C import ProcessGroupEccl

__all__ = [
    "ProcessGroupEccl",
    "backend",
    "init_process_group",
    "wait_for_promotion",
    "recover",
    "prepare",
    "prepare_status",
    "switchover",
    "migration_send",
    "migration_recv",
    "grow",
    "await_promotion",
    "stats",
    "make_job",
    "POLICIES",
    "snapshot",
    "log",
    "sandbox",
    "sandbox_record",
    "try_promotion",
]

BACKEND_NAME = "eccl"
POLICIES = {"replace": 0, "shrink": 1, "replace_or_shrink": 2}

# The job of eccl-run (ECCL_UNIQUE_ID) is the default group's: the first
# group this process makes with eccl-run's world size takes it; later groups
# (new_group) rendezvous through their store and make jobs of their own.
_env_job_taken = False
# A standby promoted by wait_for_promotion: the next group adopts it.
_promotion_pending = False


def _job_for(size: int) -> str:
    global _env_job_taken
    job = os.environ.get("ECCL_UNIQUE_ID", "")
    if not job or _env_job_taken:
        return ""
    if os.environ.get("ECCL_ROLE", "rank") == "rank" and int(os.environ.get("ECCL_NRANKS", "-1")) != size:
        return ""
    _env_job_taken = True
    return job


def _job_through_store(store, group_rank: int, global_ranks, timeout: timedelta) -> str:
    """The group's job through its store: group rank 0 makes it, the others
    read it. The key names the group's global ranks: c10d gives disjoint
    subgroups (new_subgroups) the same store prefix, and each must get a
    job of its own."""
    key = "eccl/unique_id/" + ",".join(str(r) for r in (global_ranks or []))
    if group_rank == 0 and not store.check([key]):
        job = _C.make_job()
        store.set(key, job)
        return job
    store.wait([key], timeout)
    return store.get(key).decode()


def _create(dist_opts, backend_opts):
    reconfigure_regime = bool(getattr(dist_opts, "enable_reconfigure", False)) or bool(
        getattr(backend_opts, "enable_reconfigure", False)
    )
    timeout = dist_opts.timeout
    if not isinstance(timeout, timedelta):
        timeout = timedelta(seconds=float(timeout))
    global _promotion_pending
    job = _job_for(dist_opts.group_size)
    if _promotion_pending:
        _promotion_pending = False  # the promoted communicator is adopted: it knows its job
    elif not job and dist_opts.store is not None:
        job = _job_through_store(dist_opts.store, dist_opts.group_rank,
                                 list(getattr(dist_opts, "global_ranks_in_group", []) or []), timeout)
    return _C.create_backend(
        dist_opts.store,
        dist_opts.group_rank,
        dist_opts.group_size,
        timeout,
        job,
        reconfigure_regime,
        True,
    )


# CUDA tensors are taken when torch_eccl was built with CUDA: ops are
# ordered on the caller's current stream, as NCCL's are.
dist.Backend.register_backend(BACKEND_NAME, _create, extended_api=True,
                              devices=["cpu", "cuda"] if _C.cuda_build() else ["cpu"])


def make_job() -> str:
    """A new eccl job: its unique id as text (for ECCL_UNIQUE_ID). Its
    coordinator runs on a thread of this process until the process exits:
    make it in a process that outlives the ranks (a launcher, a test
    driver), or run `ecclcoord serve` instead."""
    return _C.make_job()


def _ms(timeout: timedelta | None, default_ms: int) -> int:
    return default_ms if timeout is None else int(timeout.total_seconds() * 1000)


def wait_for_promotion(job: str | None = None, timeout: timedelta | None = None,
                       op_timeout: timedelta | None = None) -> tuple[int, int]:
    """Registers this process as a standby of ``job`` (default: ECCL_UNIQUE_ID)
    and blocks until a recovery, grow or migration gives it a rank; returns
    ``(rank, world_size)``. The next eccl process group this process makes
    (with that rank and size) uses the promoted communicator. Its ops'
    deadline is ECCL_TIMEOUT_MS where set, as a rank's is, else
    ``op_timeout`` (give the process group's timeout; None: eccl's
    default)."""
    job = job or os.environ.get("ECCL_UNIQUE_ID", "")
    if not job:
        raise ValueError("torch_eccl.wait_for_promotion: no job (pass one or set ECCL_UNIQUE_ID)")
    op_timeout = int(os.environ.get("ECCL_TIMEOUT_MS", "0") or 0) or _ms(op_timeout, 0)
    global _env_job_taken, _promotion_pending
    _env_job_taken = True
    promoted = _C.await_standby(job, _ms(timeout, 0), op_timeout)
    _promotion_pending = True
    return promoted


def init_process_group(timeout: timedelta | None = None, **kwargs) -> None:
    """torch.distributed.init_process_group("eccl") from eccl-run's
    environment: a rank takes ECCL_RANK of ECCL_NRANKS; a standby
    (ECCL_ROLE=standby) first waits for a rank (wait_for_promotion), its
    ops then bound by the process group's timeout as a rank's are."""
    if os.environ.get("ECCL_ROLE", "rank") == "standby":
        rank, size = wait_for_promotion(op_timeout=timeout if timeout is not None else default_pg_timeout)
    else:
        try:
            rank, size = int(os.environ["ECCL_RANK"]), int(os.environ["ECCL_NRANKS"])
        except KeyError as e:
            raise RuntimeError(
                "torch_eccl.init_process_group: ECCL_RANK and ECCL_NRANKS are not set (run under eccl-run, "
                "or call torch.distributed.init_process_group('eccl') with a store)"
            ) from e
    if timeout is not None:
        kwargs["timeout"] = timeout
    # The job id travels in the environment; torch still wants a store.
    dist.init_process_group(BACKEND_NAME, rank=rank, world_size=size, store=dist.HashStore(), **kwargs)


def backend(group: dist.ProcessGroup | None = None) -> ProcessGroupEccl:
    """The eccl backend of ``group`` (default: the default group)."""
    pg = group if group is not None else dist.group.WORLD
    if pg is None:
        raise RuntimeError("torch_eccl: no process group (call init_process_group first)")
    b = pg._get_backend(torch.device("cpu"))
    if not isinstance(b, ProcessGroupEccl):
        raise TypeError(f"torch_eccl: the group's CPU backend is {type(b).__name__}, not eccl")
    return b


def recover(policy: str = "replace", group: dist.ProcessGroup | None = None) -> dict:
    """After an op failed (a peer died or hung): agree on the next view with
    every survivor and move to it. ``policy``: "replace" (standbys take the
    failed ranks, nobody is renumbered), "shrink" (failed ranks are dropped,
    survivors renumbered densely) or "replace_or_shrink". Returns the stats."""
    if policy not in POLICIES:
        raise ValueError(f"torch_eccl.recover: policy {policy!r} is not one of {sorted(POLICIES)}")
    return backend(group).recover(POLICIES[policy])


def prepare(rank: int, group: dist.ProcessGroup | None = None) -> None:
    """Starts moving ``rank`` to a standby in the background (planned
    migration); collectives keep running meanwhile."""
    backend(group).prepare(rank)


def prepare_status(group: dist.ProcessGroup | None = None) -> tuple[str, int]:
    """("none" | "preparing" | "ready" | "failed: why", the rank leaving)."""
    return tuple(backend(group).prepare_status())


def switchover(group: dist.ProcessGroup | None = None) -> dict:
    """At a collective boundary: swap to the prepared view (only the delta
    connections change). The leaver's group is left afterwards."""
    return backend(group).switchover()


def migration_send(tensors, group: dist.ProcessGroup | None = None) -> None:
    """The leaver streams tensors (model, optimizer state) to its joiner."""
    b = backend(group)
    for t in [tensors] if isinstance(tensors, torch.Tensor) else tensors:
        b.migration_send(t)


def migration_recv(tensors, group: dist.ProcessGroup | None = None) -> None:
    """The joiner receives, in order, what its leaver sent."""
    b = backend(group)
    for t in [tensors] if isinstance(tensors, torch.Tensor) else tensors:
        b.migration_recv(t)


def grow(count: int, group: dist.ProcessGroup | None = None) -> dict:
    """Admits ``count`` registered standbys as new ranks at the end."""
    return backend(group).grow(count)


def await_promotion(group: dist.ProcessGroup, timeout: timedelta | None = None) -> dict:
    """A group made in the reconfigure regime (a standby): waits until a
    recovery, grow or migration takes it in."""
    return backend(group).await_promotion(timedelta(0) if timeout is None else timeout)


def sandbox(nranks: int, rank: int, group: dist.ProcessGroup | None = None) -> None:
    """A standby's group (made in the reconfigure regime) runs the training
    step before it has a rank: as ``rank`` of ``nranks``, every collective
    completes locally at once (its own input where a one-rank group returns
    it, zeros where data would come from others, or what a rank recorded
    for it with ``sandbox_record``), nothing touches the network. A
    promotion ends it; the same group is then the real one. ``nranks=0``
    leaves it."""
    backend(group).sandbox(int(nranks), int(rank))


def sandbox_record(calls: int, group: dist.ProcessGroup | None = None) -> None:
    """A rank records the outputs of its next ``calls`` collectives (one
    training step) and ships them in the background to the job's eager
    standbys (``ECCL_PREPARE=eager``); their sandboxes answer the same
    calls with these outputs (an all_reduce's sum, a broadcast from another
    rank), so data-dependent code warms up on real values."""
    backend(group).sandbox_record(int(calls))


def try_promotion(group: dist.ProcessGroup | None = None) -> bool:
    """A standby polls between sandboxed steps: True once a recovery, grow
    or migration took it in (rank and world size are then the real ones)."""
    return backend(group).try_promotion()


def stats(group: dist.ProcessGroup | None = None) -> dict:
    """epoch, joined_epoch, rank, world_size, reconfigurations, connections
    opened/closed/inherited/prepared by the last change and its phase times."""
    return backend(group).stats()


from . import log, moe, snapshot  # noqa: E402  (boundary-send logs; MoE dispatch; state dicts in peers' memory)
