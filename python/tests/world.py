"""Runs a function as N real processes joined into one torch.distributed
world, and collects what each returned (or raised, or that it died)."""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import socket
import time
import traceback
from datetime import timedelta


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init(rank: int, n: int, port: int, backend: str = "eccl", **kwargs) -> None:
    import torch.distributed as dist

    import torch_eccl  # noqa: F401  (registers the backend)

    kwargs.setdefault("timeout", timedelta(seconds=60))
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=n, **kwargs)


def _main(fn, rank, n, port, q, args, env):
    os.environ.update(env)
    os.environ.setdefault("ECCL_SOCKET_IFNAME", "lo")
    try:
        q.put((rank, "ok", fn(rank, n, port, *args)))
    except BaseException:  # noqa: BLE001  (the parent reports it)
        q.put((rank, "error", traceback.format_exc()))


class Outcome:
    def __init__(self, rank):
        self.rank = rank
        self.status = "missing"  # ok | error | died | hung
        self.value = None
        self.exitcode = None

    def __repr__(self):
        return f"rank {self.rank}: {self.status} (exit {self.exitcode}) {self.value!r}"


def run(n: int, fn, *args, timeout: float = 120, env: dict | None = None, stopped=()) -> list[Outcome]:
    """Starts fn(rank, n, port, *args) in n spawned processes; returns one
    Outcome per rank. A process that neither reports nor exits by the
    deadline is killed and reported as hung; so are the ranks in `stopped`
    (stopped on purpose) once every other rank has reported."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_main, args=(fn, r, n, port, q, args, env or {}), daemon=True) for r in range(n)]
    for p in procs:
        p.start()
    out = [Outcome(r) for r in range(n)]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            rank, status, value = q.get(timeout=0.2)
            out[rank].status, out[rank].value = status, value
        except queue.Empty:
            pass
        if all(o.status != "missing" or not p.is_alive() or o.rank in stopped for o, p in zip(out, procs)):
            break
    # What a process put just before it exited may still be in the pipe.
    for _ in range(50):
        try:
            rank, status, value = q.get(timeout=0.05)
            out[rank].status, out[rank].value = status, value
        except queue.Empty:
            break
    for o, p in zip(out, procs):
        if o.rank in stopped:
            p.kill()
        p.join(timeout=max(0.0, min(10.0, deadline - time.monotonic())))
        if p.is_alive():
            p.kill()
            p.join()
            if o.status == "missing":
                o.status = "hung"
        elif o.status == "missing":
            o.status = "died"
        o.exitcode = p.exitcode
    return out


def values(outcomes: list[Outcome]) -> list:
    """The ranks' return values; fails listing every rank that did not return."""
    bad = [o for o in outcomes if o.status != "ok"]
    assert not bad, "\n".join(f"rank {o.rank} {o.status} (exit {o.exitcode}):\n{o.value}" for o in bad)
    return [o.value for o in outcomes]
