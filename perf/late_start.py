"""Late starters in perf/ettr.py's jobs: a process that starts while the
job trains (an eccl standby, a shrinking job's repaired replacement,
torchft's restarted replica group) stands for a process on another
machine, which takes nothing from the training's cores. On one small
machine it runs at a low priority (ETTR_LATE_NICE, set by perf/ettr.py
--late-nice; unset or 0: as any process) until it has joined the
training, and then every one of its threads goes back to the priority it
started with. The same rule holds for every contender: on a cluster the
late starter neither slows the others nor is slowed by them, and here it
gets only the first half (its own start takes longer where the cores are
busy, which the shrinking contenders and torchft pay for in steps at a
smaller size).

A process is late when eccl-run started it as a standby (ECCL_ROLE) or
its launcher says so (ETTR_LATE_STARTER=1). Call begin() before the
heavy imports (torch), joined() once it trains.
"""

from __future__ import annotations

import os
import resource

_started_at: int | None = None  # the niceness to go back to; None: not lowered


def is_late() -> bool:
    return os.environ.get("ECCL_ROLE") == "standby" or os.environ.get("ETTR_LATE_STARTER") == "1"


def _may_raise_back_to(nice: int) -> bool:
    """Lowering a niceness needs CAP_SYS_NICE or RLIMIT_NICE's leave
    (20 - limit is the lowest niceness it allows): without either the
    process would stay low after it joined, so it never goes low."""
    if os.geteuid() == 0:
        return True
    soft, _ = resource.getrlimit(resource.RLIMIT_NICE)
    return soft == resource.RLIM_INFINITY or 20 - soft <= nice


def begin() -> int:
    """Lowers this process when it is a late starter; returns its niceness."""
    global _started_at
    want = int(os.environ.get("ETTR_LATE_NICE", "0") or 0)
    now = os.getpriority(os.PRIO_PROCESS, 0)
    if _started_at is None and want > now and is_late() and _may_raise_back_to(now):
        _started_at = now
        # Linux keeps a niceness per thread: this one, and every thread it
        # starts from now on (torch's, eccl's) inherits it.
        os.setpriority(os.PRIO_PROCESS, 0, want)
    return os.getpriority(os.PRIO_PROCESS, 0)


def _each_thread(call) -> list:
    """call(tid) for every thread of this process (one that ends meanwhile
    is left out)."""
    out = []
    for tid in os.listdir("/proc/self/task"):
        try:
            out.append(call(int(tid)))
        except ProcessLookupError:
            pass
    return out


def thread_nices() -> list[int]:
    return _each_thread(lambda tid: os.getpriority(os.PRIO_PROCESS, tid))


def joined() -> int:
    """Every thread back to the niceness the process started with; returns
    how far above it the lowest thread still is (0: every one is back, or
    the process was never lowered)."""
    global _started_at
    if _started_at is None:
        return 0
    back_to = _started_at
    _each_thread(lambda tid: os.setpriority(os.PRIO_PROCESS, tid, back_to))
    above, _started_at = max(thread_nices()) - _started_at, None
    return above
