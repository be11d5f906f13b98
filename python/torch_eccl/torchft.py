"""torchft over eccl: a process group whose quorum changes are eccl deltas.

torchft's ProcessGroupGloo answers every quorum change by building a whole
new Gloo group. ``ProcessGroupEccl`` keeps one eccl member for the life of
the process and moves it between memberships with eccl's named
reconfiguration: members that stay keep their connections, a member that
left or joined changes only its neighbours' links::

    from torch_eccl.torchft import ProcessGroupEccl
    pg = ProcessGroupEccl(timeout=timedelta(seconds=10))   # was ProcessGroupGloo(...)
    manager = Manager(pg=pg, ...)

Two modes, chosen by whether a job is configured:

- **with a job** (``ecclcoord serve`` next to ``torchft_lighthouse``, its
  id given to every process as ECCL_UNIQUE_ID, or ``job=``): every replica
  group's process joins that one eccl job, and each quorum change is a
  delta; standbys can wait in the job. A job holds one communicator, so a
  replica group of several ranks needs one job per group rank (group rank
  g of every replica joins job g).
- **without one** (the drop-in for ``ProcessGroupGloo``): each quorum's
  group is bootstrapped through the store torchft hands over, as Gloo's
  is: group rank 0 makes a job for it, the others find it in the store.
  Every quorum change then builds a new group (no delta, no standbys); the
  first such group says so once in the log.

See docs/pytorch.md.

Handles are torchft's ordered JSON (``id``, ``store``, ``global_rank``) with
eccl's fields added (``eccl_member``, ``job``, ``rank``, ``epoch``); the new
rank of each process is the index of its handle, as torchft requires.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from datetime import timedelta
from typing import Optional

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import ErrorType
from torchft.process_group import ProcessGroup, ProcessGroupWrapper, _rendezvous, create_store_client
from torchft.work import _DummyWork

from . import _C, _job_through_store

__all__ = ["ProcessGroupEccl"]

_log = logging.getLogger("torch_eccl.torchft")
_store_mode_noted = False


def _note_store_mode() -> None:
    global _store_mode_noted
    if not _store_mode_noted:
        _store_mode_noted = True
        _log.warning(
            "torch_eccl.torchft.ProcessGroupEccl: no eccl job is configured (ECCL_UNIQUE_ID or job=), so each "
            "quorum's group is bootstrapped through torchft's store and rebuilt on every quorum change, as "
            "ProcessGroupGloo is. Run `ecclcoord serve` next to the lighthouse and set ECCL_UNIQUE_ID to its id "
            "for delta reconfiguration across quorums (only the changed connections move) and warm standbys."
        )


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
    def _configured_job(self) -> str:
        return self._job or os.environ.get("ECCL_UNIQUE_ID", "")

    def _member(self) -> _C.ProcessGroupEccl:
        with self._lock:
            if self._backend is None:
                job = self._configured_job()
                if not job:
                    raise RuntimeError(
                        "torch_eccl.torchft.ProcessGroupEccl: no process group yet (without an eccl job, "
                        "reconfigure it first: torchft's Manager or reconfigure_with_store does)"
                    )
                self._backend = _C.create_backend(None, 0, 1, self._timeout, job, True, False)
            return self._backend

    def get_reconfigure_handle(self) -> str:
        handle = json.loads(ProcessGroup.get_reconfigure_handle(self))  # torchft's id, store, global_rank
        if self._configured_job():
            handle.update(json.loads(self._member().get_reconfigure_handle()))
        return json.dumps(handle)

    def _install(self, backend: _C.ProcessGroupEccl, store) -> None:
        pg = dist.ProcessGroup(store, backend.rank(), backend.size())
        pg._set_default_backend(dist.ProcessGroup.BackendType.CUSTOM)
        pg._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.CUSTOM, backend)
        self._pg = pg

    def _reconfigure_through_store(self, opts) -> _DummyWork:
        """The drop-in path: a new group for this quorum, bootstrapped
        through the quorum's store as ProcessGroupGloo's is."""
        _note_store_mode()
        rendezvous = _rendezvous(opts, self._handle_id())
        self.abort(errored=False)
        timeout = opts.timeout if opts.timeout is not None else self._timeout
        store = create_store_client(rendezvous.store_addr, timeout=timeout)
        job = _job_through_store(store, rendezvous.rank, rendezvous.global_ranks, timeout)
        backend = _C.create_backend(store, rendezvous.rank, rendezvous.world_size, self._timeout, job, False, False)
        with self._lock:
            self._backend = backend
        self._rank = rendezvous.rank
        self._uuid = rendezvous.uuid
        self._global_ranks = rendezvous.global_ranks
        self._install(backend, store)
        return _DummyWork(None)

    def reconfigure(self, opts) -> _DummyWork:
        """Moves this member to the membership of ``opts.handles`` (ordered:
        a process's rank is its handle's index) as one eccl delta, and
        blocks until it is in place; raises on failure naming the member or
        the disagreement. Without an eccl job, builds this quorum's group
        through torchft's store instead (as ProcessGroupGloo does)."""
        if not self._configured_job():
            return self._reconfigure_through_store(opts)
        rendezvous = _rendezvous(opts, self._handle_id())
        backend = self._member()
        if opts.timeout is None:
            opts.timeout = self._timeout
        backend.reconfigure_now(opts)
        self._rank = rendezvous.rank
        self._uuid = rendezvous.uuid
        self._global_ranks = rendezvous.global_ranks
        if self._pg is None:
            self._install(backend, dist.HashStore())
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
