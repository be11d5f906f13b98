"""torchft over eccl: a process group whose quorum changes are eccl deltas.

torchft's ProcessGroupGloo answers every quorum change by building a whole
new Gloo group. ``ProcessGroupEccl`` keeps one eccl member for the life of
the process and moves it between memberships with eccl's named
reconfiguration: members that stay keep their connections, a member that
left or joined changes only its neighbours' links::

    from torch_eccl.torchft import ProcessGroupEccl
    pg = ProcessGroupEccl(timeout=timedelta(seconds=10))   # was ProcessGroupGloo(...)
    manager = Manager(pg=pg, ...)

Every replica group's process joins one eccl job: run ``ecclcoord serve``
next to ``torchft_lighthouse`` and give its id to every process as
ECCL_UNIQUE_ID (or pass ``job=``). A job holds one communicator, so a
replica group of several ranks needs one job per group rank (group rank g
of every replica joins job g). See docs/pytorch.md.

Handles are torchft's ordered JSON (``id``, ``store``, ``global_rank``) with
eccl's fields added (``eccl_member``, ``job``, ``rank``, ``epoch``); the new
rank of each process is the index of its handle, as torchft requires.
"""

from __future__ import annotations

import json
import os
import threading
from datetime import timedelta
from typing import Optional

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import ErrorType
from torchft.process_group import ProcessGroup, ProcessGroupWrapper, _rendezvous
from torchft.work import _DummyWork

from . import _C

__all__ = ["ProcessGroupEccl"]


class ProcessGroupEccl(ProcessGroupWrapper):
    """A reconfigurable torchft process group on eccl (CPU tensors).

    Args:
        timeout: deadline of every collective and of each reconfiguration
            (ECCL_TIMEOUT_MS, when set, overrides it for collectives).
        job: the eccl job's unique id as text; default ECCL_UNIQUE_ID.
    """

    def __init__(self, timeout: timedelta = timedelta(seconds=60), job: Optional[str] = None) -> None:
        super().__init__(timeout=timeout)
        self._job = job
        self._backend: Optional[_C.ProcessGroupEccl] = None
        self._lock = threading.Lock()

    def getBackendName(self) -> str:
        return "torchft-eccl"

    # The eccl member this process group is, made on first use: it registers
    # with the job's coordinator as a standby until a reconfiguration names it.
    def _member(self) -> _C.ProcessGroupEccl:
        with self._lock:
            if self._backend is None:
                job = self._job or os.environ.get("ECCL_UNIQUE_ID", "")
                if not job:
                    raise RuntimeError(
                        "torch_eccl.torchft.ProcessGroupEccl: no eccl job; run `ecclcoord serve` next to the "
                        "lighthouse and set ECCL_UNIQUE_ID to the id it prints (or pass job=)"
                    )
                self._backend = _C.create_backend(None, 0, 1, self._timeout, job, True, False)
            return self._backend

    def get_reconfigure_handle(self) -> str:
        handle = json.loads(ProcessGroup.get_reconfigure_handle(self))  # torchft's id, store, global_rank
        handle.update(json.loads(self._member().get_reconfigure_handle()))
        return json.dumps(handle)

    def reconfigure(self, opts) -> _DummyWork:
        """Moves this member to the membership of ``opts.handles`` (ordered:
        a process's rank is its handle's index) as one eccl delta, and
        blocks until it is in place; raises on failure naming the member or
        the disagreement."""
        rendezvous = _rendezvous(opts, self._handle_id())
        backend = self._member()
        if opts.timeout is None:
            opts.timeout = self._timeout
        backend.reconfigure_now(opts)
        self._rank = rendezvous.rank
        self._uuid = rendezvous.uuid
        self._global_ranks = rendezvous.global_ranks
        if self._pg is None:
            pg = dist.ProcessGroup(dist.HashStore(), backend.rank(), backend.size())
            pg._set_default_backend(dist.ProcessGroup.BackendType.CUSTOM)
            pg._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.CUSTOM, backend)
            self._pg = pg
        return _DummyWork(None)

    def errored(self) -> Optional[Exception]:
        """None, as for torchft's ProcessGroupGloo: a failure reaches torchft
        through the op it broke (its Work raises, naming the failed member,
        and the Manager skips the step). The communicator's own state may
        also show a peer that exited after the step's last op; that must not
        veto a step whose ops all succeeded. ``last_error()`` reports it."""
        return None

    def last_error(self) -> Optional[str]:
        """What the communicator saw go wrong last (a peer that failed or
        left), or None."""
        backend = self._backend
        if backend is None or backend.get_error() == ErrorType.SUCCESS:
            return None
        return backend.last_error()

    def abort(self, errored: bool = True) -> None:
        """Ends this member now; the next reconfiguration registers a new one."""
        with self._lock:
            backend, self._backend, self._pg = self._backend, None, None
        if backend is not None:
            backend.abort()

    def shutdown(self) -> None:
        """Finishes queued work and leaves the job in order (the others see
        a member that left, not one that failed)."""
        with self._lock:
            backend, self._backend, self._pg = self._backend, None, None
        if backend is not None:
            backend.shutdown()

    def stats(self) -> dict:
        """eccl's statistics of the last change (torch_eccl.stats)."""
        return self._member().stats()

    def __repr__(self) -> str:
        b = self._backend
        return f"ProcessGroupEccl(member={b.member_id:016x})" if b is not None else "ProcessGroupEccl(unregistered)"
