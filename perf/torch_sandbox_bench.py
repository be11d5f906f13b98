"""A standby's first real step, warmed in the sandbox against cold, one run.

Three ranks train a torch.compile'd MLP (forward, backward, gradients
averaged with all_reduce on the eccl group). A warm standby makes its group
in the reconfigure regime, enters the sandbox as rank 1 of 3 and runs the
same compiled step over and over (every collective answered locally) while
the job trains. Phase A: rank 1 is killed, the survivors recover (REPLACE)
and the warm standby takes its place; every rank times its next steps.
Phase B, same job: a cold standby registers (never warmed), rank 2 is
killed, it takes that place, and the steps are timed again. Printed: each
standby's first real step against the median step of its phase (the
issue's target: warm <= 2x; a cold one pays the compile). Inductor's disk
caches are off, as if each process ran on a machine of its own.

    .venv/bin/python perf/torch_sandbox_bench.py [--steps 10] [--hidden 512]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import time
from datetime import timedelta

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python", "tests"))
import world  # noqa: E402

TIMEOUT = timedelta(seconds=120)
RANKS = 3


def _env(job_id, role, rank=-1, nranks=-1):
    os.environ.update({"ECCL_UNIQUE_ID": job_id, "ECCL_ROLE": role, "ECCL_RANK": str(rank), "ECCL_NRANKS": str(nranks)})


def make_step(hidden):
    import torch
    import torch.distributed as dist

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(hidden, hidden), torch.nn.GELU(), torch.nn.Linear(hidden, hidden), torch.nn.GELU(),
        torch.nn.Linear(hidden, 16))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    compiled = torch.compile(model)

    def step(i):
        g = torch.Generator().manual_seed(i)
        x, y = torch.randn(64, hidden, generator=g), torch.randn(64, 16, generator=g)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(compiled(x), y)
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= dist.get_world_size()
        opt.step()
        return loss.item()

    return step


def _wait_file(path):
    while not os.path.exists(path):
        time.sleep(0.05)


def _timed_steps(step, steps, base):
    import torch.distributed as dist

    times = []
    for i in range(steps):
        dist.barrier()
        t = time.perf_counter()
        step(base + i)
        times.append(time.perf_counter() - t)
    return times


def _train_until(step, i, path):
    """Steps until every rank sees `path` (a common step)."""
    import torch
    import torch.distributed as dist

    while True:
        step(i)
        i += 1
        ready = torch.tensor([1.0 if os.path.exists(path) else 0.0])
        dist.all_reduce(ready, op=dist.ReduceOp.MIN)
        if ready.item():
            return i


def _fail_and_recover():
    import torch
    import torch.distributed as dist

    import torch_eccl

    try:
        for _ in range(1000):
            dist.all_reduce(torch.ones(4))
        raise AssertionError("the death went unnoticed")
    except RuntimeError:
        pass
    torch_eccl.recover("replace")


def body(index, _n, _port, job_id, steps, hidden):
    """Phase A: rank 1 dies, the warm standby (sandboxed meanwhile) takes
    its place. Phase B: rank 2 dies, the cold standby (registered only
    then, never warmed) takes its place. Each phase times its steps."""
    import torch.distributed as dist

    import torch_eccl

    d = os.environ["BENCH_DIR"]
    result = {"index": index}
    if index == RANKS:  # the warm standby
        _env(job_id, "standby")
        dist.init_process_group("eccl", rank=0, world_size=1, store=dist.HashStore(), timeout=TIMEOUT,
                                enable_reconfigure=True)
        step = make_step(hidden)
        torch_eccl.sandbox(RANKS, 1)
        sandboxed = 0
        while not torch_eccl.try_promotion():
            step(1000 + sandboxed)
            sandboxed += 1
            if sandboxed == 2:
                open(d + "/warm", "w").close()
        result["sandbox_steps"] = sandboxed
        result["a"] = _timed_steps(step, steps, 2000)
        _train_until(step, 3000, d + "/cold-registered")
        _fail_and_recover()
        result["b"] = _timed_steps(step, steps, 4000)
    elif index == RANKS + 1:  # the cold standby: registers once phase A is done
        _wait_file(d + "/phase-a-done")
        _env(job_id, "standby")
        dist.init_process_group("eccl", rank=0, world_size=1, store=dist.HashStore(), timeout=TIMEOUT,
                                enable_reconfigure=True)
        step = make_step(hidden)
        open(d + "/cold-registered", "w").close()
        torch_eccl.await_promotion(dist.group.WORLD, TIMEOUT)
        result["b"] = _timed_steps(step, steps, 4000)
    else:
        _env(job_id, "rank", index, RANKS)
        torch_eccl.init_process_group(timeout=TIMEOUT)
        step = make_step(hidden)
        i = _train_until(step, 0, d + "/warm")
        if index == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        _fail_and_recover()
        result["a"] = _timed_steps(step, steps, 2000)
        if index == 0:
            open(d + "/phase-a-done", "w").close()
        _train_until(step, 3000, d + "/cold-registered")
        if index == 2:
            os.kill(os.getpid(), signal.SIGKILL)
        _fail_and_recover()
        result["b"] = _timed_steps(step, steps, 4000)
    dist.destroy_process_group()
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    import tempfile

    import torch_eccl

    os.environ.setdefault("ECCL_REPLACE_WAIT_MS", "60000")
    # Every process compiles for itself, as on separate machines: no
    # inductor cache on a shared disk warms the cold standby.
    os.environ["TORCHINDUCTOR_FX_GRAPH_CACHE"] = "0"
    os.environ["TORCHINDUCTOR_AUTOGRAD_CACHE"] = "0"
    with tempfile.TemporaryDirectory() as d:
        out = world.run(RANKS + 2, body, torch_eccl.make_job(), args.steps, args.hidden, timeout=600,
                        env={"ECCL_TIMEOUT_MS": "30000", "BENCH_DIR": d, "ECCL_SOCKET_IFNAME": "lo"})
    results = {r["index"]: r for r in world.values([o for o in out if o.rank not in (1, 2)])}
    a_median = statistics.median(results[0]["a"][1:])
    b_median = statistics.median(results[0]["b"][1:])
    warm, cold = results[RANKS]["a"][0], results[RANKS + 1]["b"][0]
    row = {"warm_first_ms": warm * 1e3, "median_a_ms": a_median * 1e3, "warm_over_median": warm / a_median,
           "cold_first_ms": cold * 1e3, "median_b_ms": b_median * 1e3, "cold_over_median": cold / b_median,
           "warm_sandbox_steps": results[RANKS]["sandbox_steps"]}
    if args.json:
        print(json.dumps(row))
    else:
        print("# torch_sandbox_bench: 3 ranks, torch.compile'd MLP; a standby's first real step after promotion")
        print("# (A: the warm standby, sandboxed while waiting; B, later in the same job: a cold one)")
        print(f"# {'warm first':>11} {'median A':>9} {'warm/med':>9} | {'cold first':>11} {'median B':>9} {'cold/med':>9} | sandboxed")
        print(f"  {row['warm_first_ms']:9.1f}ms {row['median_a_ms']:7.1f}ms {row['warm_over_median']:9.2f} | "
              f"{row['cold_first_ms']:9.1f}ms {row['median_b_ms']:7.1f}ms {row['cold_over_median']:9.2f} | "
              f"{row['warm_sandbox_steps']:9d}")


if __name__ == "__main__":
    main()
