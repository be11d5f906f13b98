#!/usr/bin/env python3
"""ETTR at scale, projected from what perf/ettr.py measured.

The measured runs give, per contender, what one failure costs (detection,
recovery, recomputed work) and what a checkpoint costs. A job of N GPUs
fails N times as often as one GPU (its MTBF is the per-GPU MTBF over N);
first-order models then give ETTR at any N:

  restart  checkpoints every tau = sqrt(2 C M) (Young); per unit of time
           it loses C / tau to saving and (D + R + tau / 2) / M to failures
           (the work since the last checkpoint is lost, tau / 2 on average);
  replace  loses (D + R + W) / M, W the work redone per failure (at most the
           step in flight); its standbys are GPUs that do not train, so the
           GPU-time efficiency is ETTR x N / (N + standbys), with enough
           standbys (--failure-gpus per failure) that a pool refilled in
           --refill-s runs dry with probability below 1e-3 between refills;
  shrink   loses (D + R + W) / M, and while the failed data-parallel replica
           (--replica-gpus) is being repaired (--repair-s) the job runs that
           much smaller;
  torchft  the same, the replica group away for --replica-restart-s (it is
           restarted on a spare node and heals from a peer);
  pipeline as replace: a standby takes the failed stage, and R includes its
           recomputation from its snapshots and its neighbours' logs (the
           other stages wait for it);
  moe-replace, moe-shrink  as replace and shrink, R including the experts'
           move (the MoE model, expert parallel with uneven replicas).

D, R and W come from the measured runs at 4 ranks. Restart's R there is a
cold start of 4 local processes; at scale it also pays scheduling, NCCL
initialisation over thousands of ranks and a checkpoint read from shared
storage: --restart-s sets that cost (the measured one is used when it is
larger). Before projecting, the model is checked against every measured
run: the ETTR it predicts from that run's failure count and the
contender's median costs, beside the measured one.

    perf/ettr_project.py build/ettr/ettr.json --out build/ettr
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys

from ettr import RESTARTS, pyplot


def per_failure_costs(runs):
    """Median detection+recovery and recomputed seconds per failure, by contender."""
    out = {}
    for c in sorted({r["contender"] for r in runs}):
        rs = [r for r in runs if r["contender"] == c and r.get("ok") and r.get("failures") and "lost_s" in r]
        if not rs:
            continue
        stop = [(r["lost_s"]["detection"] + r["lost_s"]["recovery"]) / r["failures"] for r in rs]
        redo = [r["lost_s"]["recompute"] / r["failures"] for r in rs]
        # Steps slowed around a failure (a standby starting on the same
        # cores, a launcher's work): counted only where they cost time.
        # Here they may also be faster (fewer processes on two cores): the
        # check uses the signed figure, the projection only a slowdown.
        other = [(r["lost_s"]["other"] + r["lost_s"].get("grow", 0.0)) / r["failures"] for r in rs]
        out[c] = {"stop_s": statistics.median(stop), "redo_s": statistics.median(redo),
                  "other_s": statistics.median(other), "slow_s": max(0.0, statistics.median(other)), "runs": len(rs)}
    return out


def predicted_measured_ettr(run, costs, baseline_step_s, ckpt_costs):
    """What the model says this run's ETTR should be, from its failures."""
    c = costs[run["contender"]]
    work = run.get("work_steps", run["steps"]) * baseline_step_s
    lost = run["failures"] * (c["stop_s"] + c["redo_s"] + c["other_s"])
    if run["contender"] in RESTARTS and run.get("ckpt_every"):
        lost += (run["steps"] // run["ckpt_every"]) * ckpt_costs.get(run["contender"], 0.05)
    return work / (work + lost)


def poisson_quantile(mean, p):
    k, term = 0, math.exp(-mean)
    total = term
    while total < p:
        k += 1
        term *= mean / k
        total += term
    return k


def project(contender, gpus, args, costs, ckpt_costs):
    """(job ETTR, GPU-time efficiency, standbys) at `gpus` GPUs."""
    m = args.gpu_mtbf_h * 3600 / gpus  # the job's MTBF, seconds
    c = costs[contender]
    if contender in RESTARTS:
        ckpt_cost_s = ckpt_costs.get(contender, 0.05)
        restart = max(args.restart_s, c["stop_s"])
        tau = math.sqrt(2 * ckpt_cost_s * m)
        waste = ckpt_cost_s / tau + (restart + tau / 2) / m
        return max(0.0, 1 - waste), max(0.0, 1 - waste), 0
    waste = (c["stop_s"] + c["redo_s"] + (c["slow_s"] if args.with_slowdown else 0.0)) / m
    if contender in ("replace", "pipeline", "moe-replace"):
        standbys = args.failure_gpus * max(1, poisson_quantile(args.refill_s / m, 1 - 1e-3))
        ettr = max(0.0, 1 - waste)
        return ettr, ettr * gpus / (gpus + standbys), standbys
    # shrink: the failed data-parallel replica's GPUs are missing for
    # repair_s after each failure (all of them where one replica is the job);
    # torchft: until the replica group is restarted elsewhere and healed
    lost_gpus = max(args.replica_gpus, args.failure_gpus)
    away = args.replica_restart_s if contender == "torchft" else args.repair_s
    shrunk = min(1.0, away / m) * min(1.0, lost_gpus / gpus)
    ettr = max(0.0, 1 - waste - shrunk)
    return ettr, ettr, 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("measured", help="ettr.json written by perf/ettr.py")
    ap.add_argument("--gpus", default="8,64,512,1024,4096,16384")
    ap.add_argument("--gpu-mtbf-h", type=float, default=50_000,
                    help="mean hours between interruptions per GPU (50,000: one every ~3 h at 16,384 GPUs)")
    ap.add_argument("--restart-s", type=float, default=600, help="a restart's cost at scale, seconds")
    ap.add_argument("--refill-s", type=float, default=600, help="time to bring a new standby up, seconds")
    ap.add_argument("--repair-s", type=float, default=3600, help="time until a shrunk job grows back, seconds")
    ap.add_argument("--replica-restart-s", type=float, default=300,
                    help="torchft: time until a failed replica group runs again elsewhere and healed, seconds")
    ap.add_argument("--failure-gpus", type=int, default=8, help="GPUs one failure takes out (a host)")
    ap.add_argument("--replica-gpus", type=int, default=64,
                    help="GPUs of one data-parallel replica (tensor x pipeline parallel): what shrink drops")
    ap.add_argument("--with-slowdown", action="store_true",
                    help="count the measured slowdown around a failure at scale too (here it is a standby or "
                         "launcher starting on the training's own 2 cores)")
    ap.add_argument("--out", default=None, help="where to write ettr_projection.json and .png")
    ap.add_argument("--tolerance", type=float, default=None,
                    help="exit 1 if the model misses a measured run's ETTR by more than this")
    args = ap.parse_args()
    with open(args.measured) as f:
        measured = json.load(f)
    runs, baselines = measured["runs"], measured["baselines"]
    # Older files name the DDP job's cost only.
    ckpt_costs = measured.get("checkpoint_costs_s") or {"restart": measured.get("checkpoint_cost_s") or 0.05}
    costs = per_failure_costs(runs)
    if not costs:
        sys.exit(f"ettr_project: {args.measured} has no successful run with a failure")
    print("per failure, measured (median over runs):")
    for c, v in costs.items():
        print(f"  {c:>11}: detection+recovery {v['stop_s'] * 1000:8.1f} ms, recomputed {v['redo_s'] * 1000:8.1f} ms, "
              f"steps slower by {v['other_s'] * 1000:8.1f} ms ({v['runs']} runs)")
    for c, cost in sorted(ckpt_costs.items()):
        print(f"  {c} checkpoint: {cost * 1000:.1f} ms blocking per save")
    print("\nthe model against the measured runs:")
    print(f"{'run':>30} {'failures':>8} {'measured':>9} {'model':>7}")
    check = []
    for r in runs:
        if not r.get("ok") or r["contender"] not in costs:
            continue
        model = predicted_measured_ettr(r, costs, baselines[r["contender"]]["step_s"], ckpt_costs)
        check.append({"tag": r["tag"], "measured": r["ettr"], "model": model})
        print(f"{r['tag']:>30} {r['failures']:>8} {r['ettr']:>9.3f} {model:>7.3f}")
    missed = [c for c in check if args.tolerance is not None and abs(c["model"] - c["measured"]) > args.tolerance]
    for c in missed:
        print(f"ettr_project: the model misses {c['tag']}: {c['model']:.3f} against {c['measured']:.3f} measured")
    gpus = [int(g) for g in args.gpus.split(",")]
    table = {}
    print(f"\nprojected (per-GPU MTBF {args.gpu_mtbf_h:,.0f} h, restart {args.restart_s:.0f} s, "
          f"refill {args.refill_s:.0f} s, repair {args.repair_s:.0f} s, {args.failure_gpus} GPUs per failure, "
          f"{args.replica_gpus} per replica):")
    print(f"{'contender':>11} {'GPUs':>6} {'job MTBF':>9} {'ETTR':>6} {'GPU eff':>8} {'standbys':>8}")
    for c in costs:
        for g in gpus:
            ettr, eff, standbys = project(c, g, args, costs, ckpt_costs)
            table.setdefault(c, []).append({"gpus": g, "ettr": ettr, "gpu_efficiency": eff, "standbys": standbys})
            print(f"{c:>11} {g:>6} {args.gpu_mtbf_h / g:>8.1f}h {ettr:>6.3f} {eff:>8.3f} {standbys:>8}")
    if missed:
        sys.exit(1)
    if not args.out:
        return
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "ettr_projection.json"), "w") as f:
        json.dump({"assumptions": vars(args), "per_failure": costs, "checkpoint_costs_s": ckpt_costs,
                   "model_check": check, "projection": table}, f, indent=1)
    plt = pyplot("ettr_project")
    if not plt:
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    for c, rows in table.items():
        ax.plot([r["gpus"] for r in rows], [r["gpu_efficiency"] for r in rows], marker="o", label=c)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("GPUs")
    ax.set_ylabel("ETTR x training share of GPUs")
    lowest = min(r["gpu_efficiency"] for rows in table.values() for r in rows)
    ax.set_ylim(min(0.9, lowest - 0.02), 1.005)
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title(f"per-GPU MTBF {args.gpu_mtbf_h:,.0f} h; restart {args.restart_s:.0f} s at scale", fontsize=9)
    fig.tight_layout()
    fig.savefig(os.path.join(args.out, "ettr_projection.png"), dpi=120)
    print(f"ettr_project: plot in {os.path.join(args.out, 'ettr_projection.png')}")


if __name__ == "__main__":
    main()
