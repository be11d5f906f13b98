"""perf/late_start.py: perf/ettr.py's late starters run low until they
train, then every thread is back at the priority the process began with."""

import json
import os
import subprocess
import sys

import pytest

PERF = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "perf")

# A process that starts a thread while low, joins, and reports each
# thread's niceness before and after (Linux keeps one per thread).
PROBE = r"""
import json, os, sys, threading
sys.path.insert(0, sys.argv[1])
import late_start
out = {"begin": late_start.begin()}
seen, go = {}, threading.Event()
def worker():
    seen["thread_before"] = os.getpriority(os.PRIO_PROCESS, 0)
    go.wait(10)
    seen["thread_after"] = os.getpriority(os.PRIO_PROCESS, 0)
t = threading.Thread(target=worker)
t.start()
while "thread_before" not in seen:
    pass
out["above"] = late_start.joined()
out["main_after"] = os.getpriority(os.PRIO_PROCESS, 0)
go.set()
t.join()
out.update(seen)
print(json.dumps(out))
"""


def probe(env: dict, **popen) -> dict:
    full = {k: v for k, v in os.environ.items() if k not in ("ECCL_ROLE", "ETTR_LATE_STARTER", "ETTR_LATE_NICE")}
    r = subprocess.run([sys.executable, "-c", PROBE, PERF], env={**full, **env}, capture_output=True, text=True,
                       timeout=60, **popen)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def base() -> int:
    return os.getpriority(os.PRIO_PROCESS, 0)


@pytest.mark.skipif(os.geteuid() != 0, reason="raising a thread's priority back needs root (CAP_SYS_NICE)")
@pytest.mark.parametrize("role", [{"ECCL_ROLE": "standby"}, {"ETTR_LATE_STARTER": "1"}])
def test_a_late_starter_and_its_threads_run_low_until_it_joins(role):
    if base() >= 19:
        pytest.skip("this test runs at nice 19 already: nothing lower to go to")
    out = probe({"ETTR_LATE_NICE": "19", **role})
    assert out["begin"] == 19 and out["thread_before"] == 19
    assert out["above"] == 0
    assert out["main_after"] == base() and out["thread_after"] == base()


def test_a_rank_or_an_unset_niceness_stays_where_it_began():
    for env in ({"ETTR_LATE_NICE": "19", "ECCL_ROLE": "rank"}, {"ECCL_ROLE": "standby"},
                {"ETTR_LATE_NICE": "0", "ETTR_LATE_STARTER": "1"}):
        out = probe(env)
        assert out == {"begin": base(), "thread_before": base(), "above": 0, "main_after": base(),
                       "thread_after": base()}, env


@pytest.mark.parametrize("limit,lowers", [(0, False), (19, False), (20, True), (-1, True)])
def test_without_root_it_goes_low_only_where_its_limit_lets_it_come_back(monkeypatch, limit, lowers):
    """RLIMIT_NICE's soft limit L lets an unprivileged process go down to
    niceness 20 - L; where that is above where it began, it never goes low
    (it would train at nice 19). Run in this process: only the decision."""
    import resource

    sys.path.insert(0, PERF)
    import late_start

    limit = resource.RLIM_INFINITY if limit < 0 else limit
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr(resource, "getrlimit", lambda which: (limit, limit))
    assert late_start._may_raise_back_to(0) is lowers
