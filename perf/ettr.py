#!/usr/bin/env python3
"""Effective training time ratio (ETTR) under injected failures: one
training job (perf/ettr_train.py, data-parallel, 4 ranks) run to a fixed
number of steps while an injector SIGKILLs a random rank at exponentially
distributed intervals (mean: the MTBF, in fault-free steps), once per
contender:

  restart  what users run today: torchrun --max-restarts, c10d rendezvous,
           Gloo, torch.distributed.checkpoint async saves to local disk
           every K steps, K from Young's formula sqrt(2 C MTBF) with C the
           measured blocking cost of a save;
  replace  eccl-run with a warm standby (refilled): the survivors recover
           with REPLACE, the standby takes the rank, every rank takes the
           state of the most advanced data-parallel peer;
  shrink   eccl-run with no standby: the survivors drop the dead rank and go
           on at the same global batch (no grow-back yet; the injector
           leaves two ranks alive).

ETTR = steps x (the contender's fault-free step time) / wall time from the
first step's start to the end. The lost time is split into checkpoint
overhead (blocking part of the saves), detection (kill to the first
survivor's error, or to torchrun's restart of the workers), recovery (to the
first step completed after it, less that step) and recomputed steps; what
is left is "other". Every run's final parameters are checked against the
fault-free run's (bit-equal for restart and replace; for shrink the final
loss within the fault-free run's last-20-step spread); a run that fails the
check, or dies, counts as ETTR 0 with the reason.

    perf/ettr.py --mtbf 100,300,1000 --seeds 3 --steps 1000 --out build/ettr
    perf/ettr.py --smoke            # CI: one kill per contender, the check only
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TRAIN = os.path.join(HERE, "ettr_train.py")
CONTENDERS = ("restart", "replace", "shrink")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def command(contender, args, events, ckpt_every, ckpt_dir):
    py = args.python
    train = [TRAIN, "--recovery", contender, "--steps", str(args.steps), "--step-ms", str(args.step_ms),
             "--events", events]
    limit = str(args.run_timeout)
    if contender == "restart":
        return [py, "-m", "torch.distributed.run", "--nproc-per-node", str(args.ranks), "--max-restarts", "1000",
                "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--monitor-interval", "0.1",
                *train, *(["--ckpt-dir", ckpt_dir, "--ckpt-every", str(ckpt_every)] if ckpt_every else [])]
    launcher = os.path.join(args.build, "bootstrap", "eccl-run")
    standby = ["--standby", "1", "--refill"] if contender == "replace" else []
    return [launcher, "-np", str(args.ranks), *standby, "--timeout", limit, py, *train]


def read_events(directory):
    out = []
    for path in glob.glob(os.path.join(directory, "*.jsonl")):
        with open(path) as f:
            for line in f:
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    pass  # a line cut short by a kill
    return sorted(out, key=lambda e: e["t"])


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except OSError:
        return False


class Injector(threading.Thread):
    """Kills a random live rank at exponential intervals (mean `mtbf_s`)
    once training started, or once at `at_step`."""

    def __init__(self, events_dir, contender, mtbf_s, seed, at_step, ranks):
        super().__init__(daemon=True)
        self.dir, self.contender, self.mtbf_s, self.at_step, self.ranks = events_dir, contender, mtbf_s, at_step, ranks
        self.rng = random.Random(seed)
        self.stop = threading.Event()
        self.kills = []

    def candidates(self, evs):
        started, ranked, finished = {}, set(), set()
        for e in evs:
            if e["ev"] == "start":
                started[e["pid"]] = e
            elif e["ev"] in ("ready", "step"):
                ranked.add(e["pid"])
            elif e["ev"] == "done":
                finished.add(e["pid"])
        pids = sorted(p for p in ranked if p not in finished and alive(p))
        if self.contender == "restart":  # the workers of the newest restart
            newest = max((started[p]["restart"] for p in pids if p in started), default=0)
            pids = [p for p in pids if started.get(p, {}).get("restart") == newest]
        if self.contender == "shrink" and len(pids) <= 2:
            return []  # shrink alone cannot come back from fewer than two
        return pids

    def run(self):
        next_at = None
        while not self.stop.wait(0.02):
            evs = read_events(self.dir)
            steps = [e for e in evs if e["ev"] == "step"]
            if not steps:
                continue
            if self.at_step is not None:
                if self.kills or max(e["step"] for e in steps) < self.at_step:
                    continue
            else:
                now = time.time()
                if next_at is None:
                    next_at = steps[0]["t"] + self.rng.expovariate(1 / self.mtbf_s)
                if now < next_at:
                    continue
                next_at = now + self.rng.expovariate(1 / self.mtbf_s)
            pids = self.candidates(evs)
            if not pids:
                continue
            victim = self.rng.choice(pids)
            try:
                os.kill(victim, signal.SIGKILL)
                self.kills.append({"t": time.time(), "pid": victim})
            except OSError:
                pass


def run_job(contender, args, tag, mtbf_s=None, seed=0, at_step=None, ckpt_every=0):
    base = os.path.join(args.out, tag)
    events, ckpt_dir = os.path.join(base, "events"), os.path.join(base, "ckpt")
    subprocess.run(["rm", "-rf", base], check=True)
    os.makedirs(events)
    # A killed rank is seen by its dropped connections: the heartbeat only
    # finds hung ones, and its 3 s default can pass for a failure when the
    # host is busy (the launcher's coordinator starved under CI's load).
    env = {"ECCL_HEARTBEAT_TIMEOUT_MS": "10000", **os.environ, "PYTHONPATH": os.path.join(args.build, "python"),
           "ECCL_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    cmd = command(contender, args, events, ckpt_every, ckpt_dir)
    log = open(os.path.join(base, "job.log"), "w")
    start = time.time()
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True, cwd=ROOT)
    injector = None
    if mtbf_s or at_step is not None:
        injector = Injector(events, contender, mtbf_s, seed, at_step, args.ranks)
        injector.start()
    try:
        rc = proc.wait(timeout=args.run_timeout + 30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        rc = "timeout"
    if injector:
        injector.stop.set()
        injector.join()
    return {"contender": contender, "tag": tag, "rc": rc, "launched": start, "events": read_events(events),
            "kills": injector.kills if injector else [], "log": os.path.join(base, "job.log"), "ckpt_every": ckpt_every}


def analyse(job, t_ff=None):
    evs = job["events"]
    steps = [e for e in evs if e["ev"] == "step"]
    done = [e for e in evs if e["ev"] == "done"]
    out = {k: job[k] for k in ("contender", "tag", "rc", "ckpt_every")}
    out["failures"] = len(job["kills"])
    if not steps or not done:
        return {**out, "ok": False, "why": f"no end (exit {job['rc']}; {job['log']})"}
    t0 = steps[0]["t"] - (steps[1]["t"] - steps[0]["t"] if len(steps) > 1 else 0)
    end = max(e["t"] for e in done)
    final = max(e["step"] for e in done)
    digests = {e["digest"] for e in done}
    losses = {}  # rank 0's (each rank's loss is over its share of the batch)
    for e in steps:
        if "loss" in e and e.get("rank") == 0:
            losses[e["step"]] = e["loss"]
    out.update(wall=end - t0, steps=final, digest=sorted(digests)[0], ok=len(digests) == 1,
               loss=next((e["loss"] for e in done if e["rank"] == 0), done[0]["loss"]), losses=[losses[s] for s in sorted(losses)][-20:],
               world_end=max(e["world"] for e in done))
    if len(digests) != 1:
        out["why"] = f"ranks end with different parameters: {sorted(digests)}"
    out["step_s"] = out["wall"] / max(1, final)
    if t_ff is None:
        return out
    saves = {}
    for e in evs:
        if e["ev"] == "ckpt":
            saves[e["step"]] = max(saves.get(e["step"], 0.0), e["blocking"])
    ckpt = sum(saves.values())
    detect = recover = recompute = 0.0
    for k in job["kills"]:
        after = [e for e in evs if e["t"] > k["t"]]
        noticed = next((e for e in after if e["ev"] == "fail" or (e["ev"] == "start" and e.get("restart", 0) > 0)),
                       None)
        if not noticed:
            continue
        detect += noticed["t"] - k["t"]
        first = next((e for e in after if e["ev"] == "step" and e["t"] > noticed["t"]), None)
        if not first:
            continue
        recover += max(0.0, first["t"] - noticed["t"] - t_ff)
        reached = max((e["step"] for e in steps if e["t"] <= k["t"]), default=0)
        recompute += max(0, reached - (first["step"] - 1)) * t_ff
    out["ettr"] = final * t_ff / out["wall"] if out["ok"] else 0.0
    lost = out["wall"] - final * t_ff
    out["lost_s"] = {"checkpoint": ckpt, "detection": detect, "recovery": recover, "recompute": recompute,
                     "other": lost - ckpt - detect - recover - recompute}
    return out


def check(run, baseline):
    """Bit-equal to the fault-free run where the recovery is exact; for
    shrink, the final loss within the fault-free run's last-20 spread."""
    if not run.get("ok"):
        return run
    if run["steps"] != baseline["steps"]:
        run.update(ok=False, why=f"ended at step {run['steps']}, not {baseline['steps']}")
    elif run["contender"] == "shrink" and run["world_end"] != baseline["world_end"]:
        spread = max(baseline["losses"]) - min(baseline["losses"])
        if not abs(run["loss"] - baseline["loss"]) <= max(spread, 1e-6):
            run.update(ok=False, why=f"final loss {run['loss']:.5f} against {baseline['loss']:.5f} "
                                    f"(spread {spread:.5f})")
    elif run["digest"] != baseline["digest"]:
        run.update(ok=False, why=f"parameters {run['digest']} differ from the fault-free {baseline['digest']}")
    if not run["ok"]:
        run["ettr"] = 0.0
    return run


def young_interval(ckpt_cost_s, mtbf_s, t_ff) -> int:
    return max(1, round(math.sqrt(2 * ckpt_cost_s * mtbf_s) / t_ff))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--contenders", default=",".join(CONTENDERS))
    ap.add_argument("--mtbf", default="100,300,1000", help="mean steps between failures (fault-free steps)")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--step-ms", type=float, default=100)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--python", default=os.path.join(ROOT, ".venv", "bin", "python"))
    ap.add_argument("--out", default=os.path.join(ROOT, "build", "ettr"))
    ap.add_argument("--run-timeout", type=int, default=900)
    ap.add_argument("--smoke", action="store_true", help="one kill per contender at step 15 of 40; the check only")
    args = ap.parse_args()
    contenders = [c for c in args.contenders.split(",") if c]
    if args.smoke:
        args.steps, args.step_ms, args.run_timeout = 40, 50, 240
    os.makedirs(args.out, exist_ok=True)
    results, baselines = [], {}
    for c in contenders:
        b = analyse(run_job(c, args, f"{c}-fault-free"))
        if not b.get("ok"):
            sys.exit(f"ettr: the fault-free {c} run failed: {b.get('why')}")
        baselines[c] = b
        print(f"ettr: {c}: fault-free {b['steps']} steps in {b['wall']:.2f} s ({b['step_s'] * 1000:.1f} ms/step)",
              flush=True)
    ckpt_cost = None
    if "restart" in contenders and not args.smoke:
        cal_job = run_job("restart", args, "restart-calibration", ckpt_every=5)
        cal = analyse(cal_job)
        costs = [e["blocking"] for e in cal_job["events"] if e["ev"] == "ckpt"]
        ckpt_cost = statistics.median(costs) if costs else 0.05
        print(f"ettr: restart: a checkpoint blocks for {ckpt_cost * 1000:.1f} ms (median of {len(costs)} saves; "
              f"{cal['step_s'] * 1000:.1f} ms/step saving every 5)", flush=True)
    mtbfs = [None] if args.smoke else [int(m) for m in args.mtbf.split(",")]
    seeds = [0] if args.smoke else range(args.seeds)
    for mtbf in mtbfs:
        for seed in seeds:
            for c in contenders:  # alternating contenders within each seed
                t_ff = baselines[c]["step_s"]
                mtbf_s = mtbf * t_ff if mtbf else None
                every = 0 if c != "restart" else 10 if args.smoke else young_interval(ckpt_cost, mtbf_s, t_ff)
                job = run_job(c, args, f"{c}-mtbf{mtbf or 'smoke'}-seed{seed}", mtbf_s=mtbf_s, seed=seed,
                              at_step=15 if args.smoke else None, ckpt_every=every)
                r = check(analyse(job, t_ff), baselines[c])
                r.update(mtbf=mtbf, seed=seed)
                results.append(r)
                print(line(r), flush=True)
    with open(os.path.join(args.out, "ettr.json"), "w") as f:
        json.dump({"baselines": baselines, "runs": results, "checkpoint_cost_s": ckpt_cost,
                   "steps": args.steps, "step_ms": args.step_ms, "ranks": args.ranks}, f, indent=1)
    if not args.smoke:
        summary(results, contenders, mtbfs, args.out)
    bad = [r for r in results if not r.get("ok")]
    for r in bad:
        print(f"ettr: {r['tag']}: {r.get('why')}")
    sys.exit(1 if bad else 0)


def line(r):
    lost = r.get("lost_s", {})
    parts = " ".join(f"{k} {v:6.2f}" for k, v in lost.items())
    return (f"ettr: {r['tag']:<28} failures {r['failures']:>2}  ETTR {r.get('ettr', 0):.3f}  "
            f"{'ok  ' if r.get('ok') else 'FAIL'} lost s: {parts}")


def summary(results, contenders, mtbfs, out):
    print(f"\n{'contender':>10} {'MTBF':>6} {'runs':>4} {'failures':>8} {'ETTR':>6} {'min':>6} {'max':>6}")
    medians = {}
    for c in contenders:
        for m in mtbfs:
            rs = [r for r in results if r["contender"] == c and r["mtbf"] == m]
            e = [r.get("ettr", 0.0) for r in rs]
            medians[(c, m)] = statistics.median(e)
            print(f"{c:>10} {m:>6} {len(rs):>4} {statistics.median([r['failures'] for r in rs]):>8} "
                  f"{medians[(c, m)]:>6.3f} {min(e):>6.3f} {max(e):>6.3f}")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("ettr: matplotlib is not installed; no plot")
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    for c in contenders:
        ax.plot(mtbfs, [medians[(c, m)] for m in mtbfs], marker="o", label=c)
        for m in mtbfs:
            ax.scatter([m] * len([r for r in results if r["contender"] == c and r["mtbf"] == m]),
                       [r.get("ettr", 0) for r in results if r["contender"] == c and r["mtbf"] == m], s=8, alpha=0.4)
    ax.set_xscale("log")
    ax.set_xlabel("MTBF (fault-free steps)")
    ax.set_ylabel("ETTR (median of seeds)")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(out, "ettr.png"), dpi=120)
    print(f"ettr: plot in {os.path.join(out, 'ettr.png')}")


if __name__ == "__main__":
    main()
