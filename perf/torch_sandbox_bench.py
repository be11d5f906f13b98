"""A standby's first real step, warmed in the sandbox against cold, one run.

Three ranks train a torch.compile'd MLP (forward, backward, gradients
averaged with all_reduce on the eccl group). Two standbys wait: the warm one
makes its group in the reconfigure regime, enters the sandbox as rank 1 of
3 and runs the same compiled step over and over (every collective answered
locally) while the job trains; the cold one only waits. Ranks 1 and 2 are
killed; the survivors recover (REPLACE) and both standbys are promoted.
Every rank then times its next steps. Printed: the survivors' median step,
each standby's first step, and the ratios (the issue's target: warm first
step <= 2x the others' median; a cold one pays the compile).

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


def body(index, _n, _port, job_id, steps, hidden):
    import torch
    import torch.distributed as dist

    import torch_eccl

    times = []
    if index >= RANKS:  # standbys: index RANKS is warm (sandbox), RANKS+1 cold
        _env(job_id, "standby")
        dist.init_process_group("eccl", rank=0, world_size=1, store=dist.HashStore(), timeout=TIMEOUT,
                                enable_reconfigure=True)
        step = make_step(hidden)
        warm = index == RANKS
        sandbox_steps = 0
        if warm:
            torch_eccl.sandbox(RANKS, 1)
            assert dist.get_world_size() == RANKS
            while not torch_eccl.try_promotion():
                step(1000 + sandbox_steps)
                sandbox_steps += 1
                if sandbox_steps == 2:
                    open(os.environ["BENCH_DIR"] + "/warm", "w").close()
        else:
            torch_eccl.await_promotion(dist.group.WORLD, TIMEOUT)
        assert dist.get_world_size() == RANKS and dist.get_rank() in (1, 2), (dist.get_rank(), dist.get_world_size())
    else:
        _env(job_id, "rank", index, RANKS)
        torch_eccl.init_process_group(timeout=TIMEOUT)
        step = make_step(hidden)
        i = 0
        while True:  # train until the warm standby has run its step twice
            step(i)
            i += 1
            ready = torch.tensor([1.0 if os.path.exists(os.environ["BENCH_DIR"] + "/warm") else 0.0])
            dist.all_reduce(ready, op=dist.ReduceOp.MIN)
            if ready.item():
                break
        if index in (1, 2):
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            for _ in range(1000):
                dist.all_reduce(torch.ones(4))
            raise AssertionError("the deaths went unnoticed")
        except RuntimeError:
            pass
        torch_eccl.recover("replace")
    for i in range(steps):
        dist.barrier()
        t = time.perf_counter()
        step(2000 + i)
        times.append(time.perf_counter() - t)
    dist.destroy_process_group()
    return {"rank": dist.get_rank() if dist.is_initialized() else None, "index": index, "times": times,
            "sandbox_steps": sandbox_steps if index == RANKS else 0}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    import tempfile

    import torch_eccl

    os.environ.setdefault("ECCL_REPLACE_WAIT_MS", "60000")
    with tempfile.TemporaryDirectory() as d:
        out = world.run(RANKS + 2, body, torch_eccl.make_job(), args.steps, args.hidden, timeout=600,
                        env={"ECCL_TIMEOUT_MS": "30000", "BENCH_DIR": d, "ECCL_SOCKET_IFNAME": "lo"})
    alive = [o for o in out if o.rank not in (1, 2)]
    results = world.values(alive)
    survivor = [r for r in results if r["index"] == 0][0]
    warm = [r for r in results if r["index"] == RANKS][0]
    cold = [r for r in results if r["index"] == RANKS + 1][0]
    median = statistics.median(survivor["times"][1:])
    row = {"survivor_median_ms": median * 1e3, "warm_first_ms": warm["times"][0] * 1e3,
           "cold_first_ms": cold["times"][0] * 1e3, "warm_over_median": warm["times"][0] / median,
           "cold_over_median": cold["times"][0] / median, "warm_sandbox_steps": warm["sandbox_steps"]}
    if args.json:
        print(json.dumps(row))
    else:
        print("# torch_sandbox_bench: 3 ranks, torch.compile'd MLP; first real step after promotion")
        print(f"# {'survivor median':>16} {'warm first':>11} {'cold first':>11} {'warm/med':>9} {'cold/med':>9} {'sandboxed':>9}")
        print(f"  {row['survivor_median_ms']:14.1f}ms {row['warm_first_ms']:9.1f}ms {row['cold_first_ms']:9.1f}ms "
              f"{row['warm_over_median']:9.2f} {row['cold_over_median']:9.2f} {row['warm_sandbox_steps']:9d}")


if __name__ == "__main__":
    main()
