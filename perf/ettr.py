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
  torchft  torchft's Manager with its ProcessGroupGloo under a real
           torchft_lighthouse, one replica group per rank: a failed step is
           not committed, the others go on in a smaller quorum (fewer
           samples per step), the dead replica group is restarted and heals
           from a peer's live state (perf/ettr_torchft.py);
  replace  eccl-run with warm standbys (--standbys, refilled, the pool full
           before the first step): the survivors recover
           with REPLACE_OR_SHRINK, the standby takes the rank, every rank
           takes the state of the most advanced data-parallel peer (more
           ranks lost at once than standbys: the rest are dropped and the
           job grows back to the refilled ones);
  shrink   eccl-run with no standby: the survivors drop the dead rank and go
           on at the same global batch; eccl-run --respawn starts a
           replacement --repair-steps later (a repaired host) and the ranks
           grow back to it (they ask every --grow-every steps while short);
           the injector leaves two ranks alive;
  pipeline a 4-stage pipeline model with no data-parallel replica
           (perf/ettr_pipeline.py) under eccl-run with refilled standbys:
           boundary sends logged, one block per stage snapshotted into two
           other stages' memory every two iterations; the standby takes
           the dead stage, rebuilds its blocks from the snapshots while its
           neighbours replay their logs, and only it recomputes (MoEtion's
           localized recovery); where a log it needs died too, every stage
           goes back to a full in-memory snapshot (counted as a rollback);
           where a stage and both its holders died, to the full snapshot
           persisted to disk one iteration after it was put (from disk);
  moe-replace, moe-shrink
           the MoE model of python/examples/moe_elastic.py, expert parallel
           with uneven replicas through torch_eccl.moe (perf/ettr_moe.py), at
           a fixed global batch: replace as above (the newcomer gets its
           experts from their surviving replicas); shrink re-places the
           experts for the survivors, moving weights and Adam state from
           surviving replicas (Lazarus), and grows back as shrink does.

Faults (--fault): kill (SIGKILL one rank), stop (SIGSTOP one rank: a hung
process, SIGKILLed --stop-kill-s later as a watchdog would; under eccl-run
it is killed sooner, once the coordinator fences it), host (SIGKILL
every rank of one simulated host of --host-ranks ranks; replace then keeps
that many standbys). eccl-run gives each simulated host its own
ECCL_HOSTID (--ranks-per-host; standbys come on spare hosts), so the
snapshots keep a rank's copies off its host, as on a cluster;
--hide-hosts leaves them one machine (the pipeline's test of its second
level).

ETTR = steps x (the contender's fault-free step time) / wall time from the
first step's start to the end (torchft: each step counts as the share of
the replica groups that committed it). The lost time is split into checkpoint
overhead (blocking part of the saves), detection (kill to the first
survivor's error, or to torchrun's restart of the workers), recovery (to the
first step completed after it, less that step) and recomputed steps; what
is left is "other". Every run's final parameters are checked against the
fault-free run's (bit-equal for restart, replace and pipeline; for shrink,
the final loss within two of the fault-free run's last-20-step spreads).
torchft's steps with fewer groups train on fewer samples, so its final
loss is checked against a one-process replay of the steps its events say
it committed, each on the shares of the groups that took part. A run
that fails the check, or dies, counts as ETTR 0 with the reason.

    perf/ettr.py --mtbf 100,300,1000 --seeds 3 --steps 1000 --out build/ettr
    perf/ettr.py --smoke            # CI: one kill per contender, the check only
    perf/ettr.py --smoke --contenders pipeline --fault host   # CI: the pipeline's rollback
    perf/ettr.py --smoke --contenders pipeline --fault host --host-ranks 3   # CI: back to disk
    perf/ettr.py --fault stop --mtbf 300 --seeds 1
    perf/ettr.py --runs pipeline:100:1 --out build/ettr-again   # one seed again after a fix
    perf/ettr.py --from-json build/ettr/ettr.json build/ettr-again/ettr.json --out build/ettr-all
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time

import ettr_torchft

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TRAIN = os.path.join(HERE, "ettr_train.py")
TORCHFT = os.path.join(HERE, "ettr_torchft.py")
PIPELINE = os.path.join(HERE, "ettr_pipeline.py")
MOE = os.path.join(HERE, "ettr_moe.py")
MOE_RESTART = os.path.join(HERE, "ettr_moe_restart.py")
CONTENDERS = ("restart", "torchft", "replace", "shrink", "pipeline", "moe-restart", "moe-replace", "moe-shrink")
RESTARTS = ("restart", "moe-restart")  # torchrun restarts every worker; checkpoints
PIPELINE_STAGES = 4


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def command(contender, args, events, ckpt_every, ckpt_dir, faulted=True):
    py = args.python
    train = [TRAIN, "--recovery", contender, "--steps", str(steps_of(contender, args)), "--step-ms",
             str(args.step_ms), "--events", events]
    limit = str(args.run_timeout)
    if contender == "torchft":
        return [py, TORCHFT, "--replicas", str(args.ranks), "--steps", str(steps_of(contender, args)), "--step-ms",
                str(args.step_ms),
                "--events", events]
    if contender == "moe-restart":
        train = [MOE_RESTART, "--steps", str(steps_of(contender, args)), "--step-ms", str(args.step_ms), "--events",
                 events]
    if contender in RESTARTS:
        return [py, "-m", "torch.distributed.run", "--nproc-per-node", str(args.ranks), "--max-restarts", "1000",
                "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--monitor-interval", "0.1",
                *train, *(["--ckpt-dir", ckpt_dir, "--ckpt-every", str(ckpt_every)] if ckpt_every else [])]
    launcher = os.path.join(args.build, "bootstrap", "eccl-run")
    if args.fault == "host" and not args.hide_hosts:
        launcher = [launcher, "--ranks-per-host", str(args.host_ranks)]
    else:
        launcher = [launcher]
    spares = args.standbys * (args.host_ranks if args.fault == "host" else 1)
    extra = ["--standby", str(spares), "--refill", "--pool-first"] if contender in ("replace", "pipeline",
                                                                                   "moe-replace") else []
    if contender == "pipeline":
        return [*launcher, "-np", str(PIPELINE_STAGES), *extra, "--timeout", limit, py, PIPELINE, "--steps",
                str(steps_of(contender, args)), "--step-ms", str(args.step_ms), "--events", events,
                "--persist-dir", ckpt_dir, *(["--die-at", args.pipeline_die_at] if args.pipeline_die_at and faulted else [])]
    if contender in ("shrink", "moe-shrink") and args.repair_steps >= 0:
        extra = ["--respawn", f"{args.repair_steps * args.step_ms / 1000:.3f}"]
    if contender.startswith("moe-"):
        train = [MOE, "--recovery", contender[len("moe-"):], "--steps", str(steps_of(contender, args)), "--step-ms",
                 str(args.step_ms), "--events", events]
    if contender in ("shrink", "replace", "moe-shrink", "moe-replace"):
        train += ["--grow-every", str(args.grow_every)]
    if args.smoke and contender in ("shrink", "moe-shrink"):
        # The smoke checks that the job grows back, not how soon: on a busy
        # machine the repaired rank's torch import can outlast the run.
        train += ["--grow-before-end", "240"]
    return [*launcher, "-np", str(args.ranks), *extra, "--timeout", limit, py, *train]


def steps_of(contender, args) -> int:
    return args.steps_by.get(contender, args.steps)


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
    """Injects a fault at exponential intervals (mean `mtbf_s`) once
    training started, or once at `at_step`: SIGKILL of a random live rank,
    SIGSTOP of one (SIGKILLed `stop_kill_s` later, as a watchdog would), or
    SIGKILL of every rank on one simulated host of `host_ranks` ranks."""

    def __init__(self, events_dir, contender, mtbf_s, seed, at_step, ranks, fault="kill", host_ranks=2,
                 stop_kill_s=20.0):
        super().__init__(daemon=True)
        self.dir, self.contender, self.mtbf_s, self.at_step, self.ranks = events_dir, contender, mtbf_s, at_step, ranks
        self.fault, self.host_ranks, self.stop_kill_s = fault, host_ranks, stop_kill_s
        self.rng = random.Random(seed)
        self.stop = threading.Event()
        self.kills = []
        self.stopped = {}  # pid -> when to SIGKILL it
        self.offsets, self.started, self.rank_of, self.finished = {}, {}, {}, set()
        self.first_step_t, self.max_step = None, 0

    def follow(self):
        """Reads only what the ranks appended since the last look and keeps
        what candidates() needs: the injector shares the training's cores,
        and re-reading every event 50 times a second (thousands of lines by
        the end) cost the faulted runs a fifth of a core that their
        fault-free baselines never paid."""
        for path in glob.glob(os.path.join(self.dir, "*.jsonl")):
            with open(path) as f:
                f.seek(self.offsets.get(path, 0))
                data = f.read()
            whole = data[:data.rfind("\n") + 1]  # a line still being written waits for the next look
            self.offsets[path] = self.offsets.get(path, 0) + len(whole.encode())
            for line in whole.splitlines():
                try:
                    e = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a line cut short by a kill
                if e["ev"] == "start":
                    self.started[e["pid"]] = e
                elif e["ev"] in ("ready", "step") and "rank" in e:
                    self.rank_of[e["pid"]] = e["rank"]
                    if e["ev"] == "step":
                        self.first_step_t = min(self.first_step_t or e["t"], e["t"])
                        self.max_step = max(self.max_step, e["step"])
                elif e["ev"] == "done":
                    self.finished.add(e["pid"])

    def candidates(self):
        """Live ranks, pid -> rank, of the newest restart (torchrun)."""
        started, rank_of, finished = self.started, self.rank_of, self.finished
        pids = {p: r for p, r in rank_of.items() if p not in finished and p not in self.stopped and alive(p)}
        if self.contender in RESTARTS:
            newest = max((started[p]["restart"] for p in pids if p in started), default=0)
            pids = {p: r for p, r in pids.items() if started.get(p, {}).get("restart") == newest}
        lost = self.host_ranks if self.fault == "host" else 1
        if self.contender in ("shrink", "moe-shrink") and len(pids) - lost < 2:
            return {}  # shrink alone cannot come back from fewer than two
        if self.contender in ("torchft", "replace", "pipeline", "moe-replace") and len(pids) - lost < 1:
            return {}  # the state comes from a live rank (replica group)
        return pids

    def host_of(self, pid, rank):
        """The simulated host eccl-run named (a replacement's is a spare
        one), else the rank's."""
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                for var in f.read().split(b"\0"):
                    if var.startswith(b"ECCL_HOSTID="):
                        return var[len(b"ECCL_HOSTID="):].decode()
        except OSError:
            pass
        return f"host{rank // self.host_ranks}"

    def inject(self, pids):
        if self.fault == "host":
            host_of = {p: self.host_of(p, r) for p, r in pids.items()}
            first_rank = {}
            for p, r in pids.items():
                first_rank[host_of[p]] = min(r, first_rank.get(host_of[p], r))
            hosts = sorted(first_rank, key=lambda h: (first_rank[h], h))
            # A one-off fault (the smoke's) takes the first host: the same case every run.
            host = hosts[0] if self.at_step is not None else self.rng.choice(hosts)
            victims = sorted(p for p in pids if host_of[p] == host)
        else:
            victims = [self.rng.choice(sorted(pids))]
        sig = signal.SIGSTOP if self.fault == "stop" else signal.SIGKILL
        now = time.time()
        for victim in victims:
            try:
                os.kill(victim, sig)
            except OSError:
                continue
            if sig == signal.SIGSTOP:
                self.stopped[victim] = now + self.stop_kill_s
        # One failure, however many processes it took.
        self.kills.append({"t": now, "pids": victims, "fault": self.fault})

    def reap_stopped(self):
        for pid, due in list(self.stopped.items()):
            if time.time() >= due:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
                del self.stopped[pid]

    def run(self):
        next_at = None
        while not self.stop.wait(0.05):
            self.reap_stopped()
            self.follow()
            if self.first_step_t is None:
                continue
            if self.at_step is not None:
                if self.kills or self.max_step < self.at_step:
                    continue
            else:
                now = time.time()
                if next_at is None:
                    next_at = self.first_step_t + self.rng.expovariate(1 / self.mtbf_s)
                if now < next_at:
                    continue
                next_at = now + self.rng.expovariate(1 / self.mtbf_s)
            pids = self.candidates()
            if pids:
                self.inject(pids)
        for pid in self.stopped:  # the job ended: no stopped process outlives it
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def job_env(args):
    return {"ECCL_HEARTBEAT_TIMEOUT_MS": "10000", **os.environ, "PYTHONPATH": os.path.join(args.build, "python"),
            "ECCL_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1", "ETTR_LATE_NICE": str(args.late_nice)}


def run_job(contender, args, tag, mtbf_s=None, seed=0, at_step=None, ckpt_every=0):
    base = os.path.join(args.out, tag)
    events, ckpt_dir = os.path.join(base, "events"), os.path.join(base, "ckpt")
    subprocess.run(["rm", "-rf", base], check=True)
    os.makedirs(events)
    # A killed rank is seen by its dropped connections: the heartbeat only
    # finds hung ones, and its 3 s default can pass for a failure when the
    # host is busy (the launcher's coordinator starved under CI's load).
    env = job_env(args)
    cmd = command(contender, args, events, ckpt_every, ckpt_dir, faulted=bool(mtbf_s or at_step is not None))
    log = open(os.path.join(base, "job.log"), "w")
    start = time.time()
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True, cwd=ROOT)
    injector = None
    if mtbf_s or at_step is not None:
        # eccl-run's repair (--respawn) follows a rank's death, or its
        # fencing (eccl-run kills a fenced rank): in the smoke a stopped rank
        # of the shrink contenders dies soon anyway, so that it comes back
        # within the run whatever the heartbeat timeout.
        stop_kill_s = 2.0 if args.smoke and contender in ("shrink", "moe-shrink") else args.stop_kill_s
        injector = Injector(events, contender, mtbf_s, seed, at_step, args.ranks, args.fault, args.host_ranks,
                            stop_kill_s)
        injector.start()
    try:
        rc = proc.wait(timeout=args.run_timeout + 30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        rc = "timeout"
    if injector:
        injector.stop.set()
        injector.join()
    shutil.rmtree(ckpt_dir, ignore_errors=True)  # a restart run's checkpoints take gigabytes; the events say all
    return {"contender": contender, "tag": tag, "rc": rc, "launched": start, "events": read_events(events),
            "kills": injector.kills if injector else [], "log": os.path.join(base, "job.log"), "ckpt_every": ckpt_every,
            "ranks": PIPELINE_STAGES if contender == "pipeline" else args.ranks}


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
    # The global batch's mean loss: per step, over the ranks of the last
    # world that made it (a step redone after a restart counts once).
    by_step = {}
    for e in steps:
        if "loss_sum" in e:
            by_step.setdefault(e["step"], []).append(e)
    losses = [global_loss(es[-es[-1]["world"]:]) for _, es in sorted(by_step.items())]
    # A rank that joined at the last step (the smoke's --grow-before-end)
    # ends with no loss of its own: then the last step's says it.
    loss = global_loss(done)
    if math.isnan(loss) and losses:
        loss = losses[-1]
    out.update(wall=end - t0, steps=final, digest=sorted(digests)[0], ok=len(digests) == 1, loss=loss,
               losses=losses[-20:], world_end=max(e["world"] for e in done),
               world_min=min(e["world"] for e in steps))
    if len(digests) != 1:
        out["why"] = f"ranks end with different parameters: {sorted(digests)}"
    # Late starters (perf/late_start.py): none may train on low.
    stuck = [e for e in evs if e["ev"] == "joined" and e["above"] > 0]
    if stuck:
        out.update(ok=False, why=f"a late starter (pid {stuck[0]['pid']}) trains at a niceness "
                                 f"{stuck[0]['above']} above its start")
    # Work in steps of the whole global batch: torchft's steps with fewer
    # replica groups trained on fewer samples.
    work = final
    if job["contender"] == "torchft":
        # A step committed twice (its first quorum all died before anyone
        # healed from it) counts once, at the quorum that lasted.
        work = sum(w / job["ranks"] for w in ettr_torchft.committed_worlds(evs).values())
    out["work_steps"] = work
    out["step_s"] = out["wall"] / max(1, work)
    if t_ff is None:
        return out
    saves = {}
    for e in evs:
        if e["ev"] == "ckpt":
            saves[e["step"]] = max(saves.get(e["step"], 0.0), e["blocking"])
    ckpt = sum(saves.values())
    grows = {}
    for e in evs:
        if e["ev"] == "grew":
            grows[e["step"]] = max(grows.get(e["step"], 0.0), e["seconds"])
    out["grew"] = len(grows)
    out["rollbacks"] = len({(e["to"], e["era"]) for e in evs if e["ev"] == "rollback"})  # pipeline: to full snapshots
    out["from_disk"] = len({(e["to"], e["era"]) for e in evs if e["ev"] == "rollback" and e.get("disk")})
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
    out["ettr"] = work * t_ff / out["wall"] if out["ok"] else 0.0
    lost = out["wall"] - work * t_ff
    grow = sum(grows.values())
    out["lost_s"] = {"checkpoint": ckpt, "detection": detect, "recovery": recover, "recompute": recompute,
                     "grow": grow, "other": lost - ckpt - detect - recover - recompute - grow}
    return out


def global_loss(evs) -> float:
    rows = sum(e.get("rows", 0) for e in evs)
    return sum(e.get("loss_sum", 0.0) for e in evs) / rows if rows else float("nan")


def replay_torchft(run, args):
    """torchft's steps with fewer replica groups train on fewer samples
    (the dead group's share is not redistributed) and its quorums differ
    between runs even without a failure (a group late for one on a loaded
    host), so its final state is checked against the training its own
    commits describe: perf/ettr_torchft.py --replay trains, in one
    process, each step on the shares of the groups that took part in it,
    divided by the world torchft divided by."""
    if not run.get("ok"):
        return run
    events = os.path.join(args.out, run["tag"], "events")
    argv = [sys.executable, TORCHFT, "--replay", events, "--steps", str(run["steps"]), "--replicas", str(args.ranks)]
    p = subprocess.run(argv, env=job_env(args), capture_output=True, text=True, timeout=args.run_timeout)
    if p.returncode != 0:
        tail = (p.stdout + p.stderr).strip().splitlines()[-1:] or [f"exit {p.returncode}"]
        return {**run, "ok": False, "ettr": 0.0, "why": f"the replay of its commits failed: {tail[0]}"}
    replay = json.loads(p.stdout.strip().splitlines()[-1])
    return {**run, "replay_loss": replay["loss"], "short_steps": replay["short_steps"]}


def check(run, baseline):
    """Bit-equal to the fault-free run where the recovery is exact; for
    shrink, the final loss within two of the fault-free run's last-20
    spreads; for torchft, the final loss its replay computes (the sums'
    order alone apart)."""
    if not run.get("ok"):
        return run
    if run["steps"] != baseline["steps"]:
        run.update(ok=False, why=f"ended at step {run['steps']}, not {baseline['steps']}")
    elif run["contender"] == "torchft":
        # The replay sums each step's shares in another order than Gloo:
        # 1000 steps here ended 7e-9 apart, or bit-equal in the loss.
        if not abs(run["loss"] - run["replay_loss"]) <= 1e-4 * abs(run["replay_loss"]):
            run.update(ok=False, why=f"final loss {run['loss']:.7f}, but the replay of its commits ends at "
                                    f"{run['replay_loss']:.7f}")
    # Steps at a smaller size sum in other orders: judged by loss. The
    # last-20 spread measures batch-to-batch noise, not the samples these
    # runs leave out: two spreads (a model that lost its training ends far
    # away).
    elif run["world_min"] < baseline["world_min"]:
        spread = max(baseline["losses"]) - min(baseline["losses"])
        if not abs(run["loss"] - baseline["loss"]) <= max(2 * spread, 1e-6):
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
    ap.add_argument("--fault", choices=["kill", "stop", "host"], default="kill")
    ap.add_argument("--host-ranks", type=int, default=2, help="--fault host: ranks per simulated host")
    ap.add_argument("--hide-hosts", action="store_true",
                    help="--fault host: no ECCL_HOSTID per simulated host (eccl sees one machine: snapshot copies "
                         "may share their owner's host)")
    ap.add_argument("--late-nice", type=int, default=None,
                    help="late starters (standbys, repaired replacements, torchft's restarted groups) run at this "
                         "niceness until they train, as if on another machine (default 19; --smoke: 0)")
    ap.add_argument("--standbys", type=int, default=None,
                    help="replace, pipeline, moe-replace: the standby pool, in failures' worth (a host fault's "
                         "takes --host-ranks), refilled, and full before the first step (eccl-run --pool-first); "
                         "default 2 (--smoke: 1): a refill at nice 19 took 4-6 s to start here, a third of an MTBF of "
                         "300 steps, so with one standby a quarter of the failures found the pool empty and shrank")
    ap.add_argument("--no-rebaseline", dest="rebaseline", action="store_false",
                    help="run the fault-free baselines once, before the runs; by default they run again after "
                         "each MTBF's runs and every run is figured against the mean of the two around it (the "
                         "MoE job's fault-free step drifted from 52 to 60 ms here within the hour)")
    ap.add_argument("--stop-kill-s", type=float, default=20, help="--fault stop: SIGKILL a stopped rank this late")
    ap.add_argument("--repair-steps", type=int, default=100,
                    help="shrink: a replacement starts this many fault-free steps after a failure (-1: never)")
    ap.add_argument("--grow-every", type=int, default=10, help="shrink: steps between the ranks' asks to grow")
    ap.add_argument("--pipeline-die-at", metavar="STAGE:ITERATION", default="",
                    help="tests: that pipeline stage kills itself before that iteration's step (one stage ahead)")
    ap.add_argument("--runs", metavar="C:MTBF:SEED,...", default="",
                    help="only these runs (e.g. a seed rerun after a fix; merge with --from-json)")
    ap.add_argument("--skip-runs", metavar="FILE",
                    help="an earlier run's ettr.json: contender, MTBF and seed pairs it holds are not run again "
                         "(merge the two with --from-json)")
    ap.add_argument("--smoke", action="store_true",
                    help="one fault per contender at step 15 of 40 (torchft and shrink: of 160, the killed rank "
                         "coming back), at 3 ranks (pipeline: its 4 stages); the check only")
    ap.add_argument("--baselines-from", metavar="FILE",
                    help="fault-free runs from an earlier ettr.json, for the contenders it holds at the same steps "
                         "(the ctest variants of the pipeline's smoke take the smoke's); the rest are run")
    ap.add_argument("--baselines-only", action="store_true",
                    help="only the contenders' fault-free runs (more baselines for --pool-baselines)")
    ap.add_argument("--pool-baselines", action="store_true",
                    help="with --from-json: each contender's fault-free step time is the median of every file's "
                         "baseline for it, and every run's ETTR and 'other' are figured again from it (the machine "
                         "drifts: fault-free runs here differed by 24%% within an hour)")
    ap.add_argument("--from-json", nargs="+", metavar="FILE",
                    help="no runs: the table and plot (in --out) from earlier runs' ettr.json files, merged (a "
                         "contender in a later file replaces its runs in earlier ones)")
    args = ap.parse_args()
    if args.from_json:
        return summarize_files(args.from_json, args.out, args.pool_baselines)
    contenders = [c for c in args.contenders.split(",") if c]
    only = {(c, int(m), int(sd)) for c, m, sd in (r.split(":") for r in args.runs.split(",") if r)}
    if only:  # baselines for these contenders only, at these MTBFs and seeds
        contenders = [c for c in contenders if any(o[0] == c for o in only)]
        args.mtbf = ",".join(str(m) for m in sorted({o[1] for o in only}))
        args.seeds = max(o[2] for o in only) + 1
    args.steps_by = {}  # steps per contender where they differ (the smoke's)
    if args.late_nice is None:
        # The smoke runs beside other tests: a process at nice 19 on cores
        # busy at 0 would take minutes to import torch.
        args.late_nice = 0 if args.smoke else 19
    if args.standbys is None:
        args.standbys = 1 if args.smoke else 2
    if args.smoke or only:
        args.rebaseline = False
    if args.smoke:
        # Three ranks: every contender's path (a shrink to two and back, two
        # replica groups healing one) with a quarter fewer processes to start
        # than four, which is most of the smoke's time (CI: 258 s at four).
        # A host fault takes two: four ranks, so that shrink keeps two.
        args.steps, args.step_ms, args.run_timeout = 40, 50, 240
        args.ranks = 4 if args.fault == "host" else 3
        args.steps_by, args.repair_steps, args.grow_every = {"shrink": 160, "torchft": 160, "moe-shrink": 160}, 0, 5
    os.makedirs(args.out, exist_ok=True)
    results, baselines = [], {}
    earlier = {}
    if args.baselines_from and os.path.exists(args.baselines_from):
        with open(args.baselines_from) as f:
            earlier = json.load(f).get("baselines", {})
    for c in contenders:
        b = earlier.get(c)
        world = PIPELINE_STAGES if c == "pipeline" else args.ranks
        if b and b.get("ok") and b["steps"] == steps_of(c, args) and b["world_end"] == world:
            baselines[c] = b
            print(f"ettr: {c}: fault-free {b['steps']} steps from {args.baselines_from}", flush=True)
            continue
        b = analyse(run_job(c, args, f"{c}-fault-free"))
        if not b.get("ok"):
            sys.exit(f"ettr: the fault-free {c} run failed: {b.get('why')}")
        baselines[c] = b
        print(f"ettr: {c}: fault-free {b['steps']} steps in {b['wall']:.2f} s ({b['step_s'] * 1000:.1f} ms/step)",
              flush=True)
    ckpt_costs = {}  # per checkpointing contender: the blocking cost of a save
    for c in [c for c in contenders if c in RESTARTS and not args.smoke and not args.baselines_only]:
        cal_job = run_job(c, args, f"{c}-calibration", ckpt_every=5)
        cal = analyse(cal_job)
        costs = [e["blocking"] for e in cal_job["events"] if e["ev"] == "ckpt"]
        ckpt_costs[c] = statistics.median(costs) if costs else 0.05
        print(f"ettr: {c}: a checkpoint blocks for {ckpt_costs[c] * 1000:.1f} ms (median of {len(costs)} saves; "
              f"{cal['step_s'] * 1000:.1f} ms/step saving every 5)", flush=True)

    def save():
        with open(os.path.join(args.out, "ettr.json"), "w") as f:
            json.dump({"baselines": baselines, "runs": results, "checkpoint_cost_s": ckpt_costs.get("restart"),
                       "baseline_rounds": {c: [b["step_s"] for b in bs] for c, bs in rounds.items()},
                       "checkpoint_costs_s": ckpt_costs,
                       "steps": args.steps, "step_ms": args.step_ms, "ranks": args.ranks}, f, indent=1)

    rounds = {c: [b] for c, b in baselines.items()}  # fault-free runs, before each MTBF's runs and after
    save()
    if args.baselines_only:
        return 0
    mtbfs = [None] if args.smoke else [int(m) for m in args.mtbf.split(",")]
    seeds = [0] if args.smoke else range(args.seeds)
    done = set()
    if args.skip_runs:
        with open(args.skip_runs) as f:
            done = {run_key(r) for r in json.load(f)["runs"]}
    for mtbf in mtbfs:
        block = []
        for seed in seeds:
            for c in contenders:  # alternating contenders within each seed
                if (c, mtbf, seed) in done or (only and (c, mtbf, seed) not in only):
                    continue
                t_ff = rounds[c][-1]["step_s"]
                mtbf_s = mtbf * t_ff if mtbf else None
                every = 0 if c not in RESTARTS else 10 if args.smoke else young_interval(ckpt_costs[c], mtbf_s, t_ff)
                job = run_job(c, args, f"{c}-mtbf{mtbf or 'smoke'}-seed{seed}", mtbf_s=mtbf_s, seed=seed,
                              at_step=15 if args.smoke else None, ckpt_every=every)
                r = analyse(job, t_ff)
                r = check(replay_torchft(r, args) if c == "torchft" else r, baselines[c])
                r.update(mtbf=mtbf, seed=seed)
                if args.smoke and c in ("shrink", "moe-shrink") and r.get("ok") and r["world_end"] != args.ranks:
                    r.update(ok=False, ettr=0.0, why=f"ended with {r['world_end']} ranks: it never grew back")
                if args.smoke and c == "pipeline" and args.fault == "host" and r.get("ok") and not r["rollbacks"]:
                    r.update(ok=False, ettr=0.0, why="two adjacent stages died and no stage rolled back")
                if args.smoke and c == "pipeline" and args.fault == "host" and args.host_ranks >= 3 and r.get("ok") \
                        and not r["from_disk"]:
                    r.update(ok=False, ettr=0.0, why="a stage and both its holders died and none went back to disk")
                if args.smoke and c == "moe-replace" and args.fault == "host" and args.hide_hosts and r.get("ok"):
                    with open(job["log"], errors="replace") as f:
                        if "the snapshots start over" not in f.read():
                            r.update(ok=False, ettr=0.0, why="a host's ranks died with their copies and no rank "
                                                             "started the snapshots over")
                results.append(r)
                block.append(r)
                print(line(r), flush=True)
                save()  # after every run: an interrupted table keeps what it measured
        if args.rebaseline and block:
            rebaseline(block, rounds, args, f"after{mtbf}")
            save()
    if not args.smoke:
        summary(results, contenders, mtbfs, args.out)
    bad = [r for r in results if not r.get("ok")]
    for r in bad:
        print(f"ettr: {r['tag']}: {r.get('why')}")
    sys.exit(1 if bad else 0)


def rebaseline(block, rounds, args, tag):
    """Runs each contender of `block` fault-free again and figures every
    run of the block against the mean of its contender's baselines before
    and after it."""
    for c in [c for c in rounds if any(r["contender"] == c for r in block)]:
        b = analyse(run_job(c, args, f"{c}-fault-free-{tag}"))
        if not b.get("ok"):
            sys.exit(f"ettr: the fault-free {c} run {tag} failed: {b.get('why')}")
        rounds[c].append(b)
        print(f"ettr: {c}: fault-free {tag} {b['step_s'] * 1000:.1f} ms/step", flush=True)
    for r in block:
        before, after = rounds[r["contender"]][-2]["step_s"], rounds[r["contender"]][-1]["step_s"]
        r.update(refit(r, (before + after) / 2), t_ff_around_s=[before, after])
        print(line(r) + f"  (against {before * 1000:.1f} / {after * 1000:.1f} ms/step)", flush=True)


def run_key(r):
    return r["contender"], r.get("mtbf"), r.get("seed")


def summarize_files(paths, out, pool=False):
    """The summary of several runs' JSON (e.g. a contender run on its own
    after the others), contenders in the harness's order; with ``pool``,
    against the median of every file's fault-free run of each contender."""
    merged = os.path.join(out, "ettr.json")
    if any(os.path.realpath(p) == os.path.realpath(merged) for p in paths):
        sys.exit(f"ettr: --out {out} would overwrite {merged}, an input")
    runs, baselines, costs, pooled = [], {}, {}, {}
    for path in paths:  # a run in a later file replaces the same contender, MTBF and seed in earlier ones
        with open(path) as f:
            data = json.load(f)
        mine = [r for r in data["runs"] if r.get("mtbf")]
        runs = [r for r in runs if run_key(r) not in {run_key(m) for m in mine}] + mine
        baselines.update(data["baselines"])
        for c, b in data["baselines"].items():
            pooled.setdefault(c, []).append(b["step_s"])
        costs.update(data.get("checkpoint_costs_s") or {})
        shape = {k: data[k] for k in ("steps", "step_ms", "ranks")}
    contenders = [c for c in CONTENDERS if any(r["contender"] == c for r in runs)]
    if pool:
        for c, each in pooled.items():
            baselines[c] = {**baselines[c], "step_s": statistics.median(each), "pooled_step_s": each}
        runs = [refit(r, baselines[r["contender"]]["step_s"]) for r in runs]
    os.makedirs(out, exist_ok=True)
    with open(merged, "w") as f:  # what perf/ettr_project.py reads
        json.dump({"baselines": baselines, "runs": runs, "checkpoint_cost_s": costs.get("restart"),
                   "checkpoint_costs_s": costs, **shape, "merged_from": list(paths)}, f, indent=1)
    mtbfs = sorted({r["mtbf"] for r in runs})
    for c in contenders:
        each = baselines[c].get("pooled_step_s")
        print(f"ettr: {c}: fault-free {baselines[c]['step_s'] * 1000:.1f} ms/step"
              + (f" (median of {', '.join(f'{t * 1000:.1f}' for t in each)})" if each else ""))
    summary(runs, contenders, mtbfs, out)


def refit(r, t_ff):
    """A run's ETTR and unexplained loss against another fault-free step
    time (the recovery's share, which subtracts one step, is kept)."""
    if "wall" not in r or "work_steps" not in r or "lost_s" not in r:
        return r
    lost = dict(r["lost_s"])
    lost["other"] = r["wall"] - r["work_steps"] * t_ff - sum(v for k, v in lost.items() if k != "other")
    return {**r, "ettr": r["work_steps"] * t_ff / r["wall"] if r.get("ok") else 0.0, "lost_s": lost, "t_ff_s": t_ff}


def line(r):
    lost = r.get("lost_s", {})
    parts = " ".join(f"{k} {v:6.2f}" for k, v in lost.items())
    rolled = f"  rollbacks {r['rollbacks']}" if r.get("rollbacks") else ""
    rolled += f" ({r['from_disk']} from disk)" if r.get("from_disk") else ""
    return (f"ettr: {r['tag']:<28} failures {r['failures']:>2}  ETTR {r.get('ettr', 0):.3f}  "
            f"{'ok  ' if r.get('ok') else 'FAIL'} lost s: {parts}{rolled}")


def pyplot(who: str):
    """matplotlib's pyplot for files (no display), or None, said, without it."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"{who}: matplotlib is not installed; no plot")
        return None
    return plt


def summary(results, contenders, mtbfs, out):
    parts = ("checkpoint", "detection", "recovery", "recompute", "grow", "other")
    print(f"\n{'contender':>11} {'MTBF':>6} {'runs':>4} {'failures':>8} {'ETTR':>6} {'min':>6} {'max':>6}  "
          + " ".join(f"{p:>10}" for p in parts) + "  (lost s, medians)")
    medians = {}
    # The same table in Markdown for docs/ettr.md: failures per run in seed order.
    md = ["| contender | MTBF | failures | checks | ETTR median (min-max) | "
          + " | ".join(f"{p} s" for p in parts) + " |", "| --- " * (5 + len(parts)) + "|"]
    for m in mtbfs:
        for c in contenders:
            rs = sorted((r for r in results if r["contender"] == c and r["mtbf"] == m), key=lambda r: r["seed"])
            if not rs:
                continue
            e = [r.get("ettr", 0.0) for r in rs]
            medians[(c, m)] = statistics.median(e)
            lost = [statistics.median([r.get('lost_s', {}).get(p, 0.0) for r in rs]) for p in parts]
            print(f"{c:>11} {m:>6} {len(rs):>4} {statistics.median([r['failures'] for r in rs]):>8} "
                  f"{medians[(c, m)]:>6.3f} {min(e):>6.3f} {max(e):>6.3f}  " + " ".join(f"{v:>10.2f}" for v in lost))
            md.append(f"| {c} | {m} | {'/'.join(str(r['failures']) for r in rs)} | "
                      f"{sum(1 for r in rs if r.get('ok'))}/{len(rs)} | {medians[(c, m)]:.3f} ({min(e):.3f}-{max(e):.3f}) | "
                      + " | ".join(f"{v:.2f}" for v in lost) + " |")
    with open(os.path.join(out, "ettr-table.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    plt = pyplot("ettr")
    if not plt:
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    for c in contenders:
        have = [m for m in mtbfs if (c, m) in medians]
        ax.plot(have, [medians[(c, m)] for m in have], marker="o", label=c)
        for m in mtbfs:
            ax.scatter([m] * len([r for r in results if r["contender"] == c and r["mtbf"] == m]),
                       [r.get("ettr", 0) for r in results if r["contender"] == c and r["mtbf"] == m], s=8, alpha=0.4)
    ax.set_xscale("log")
    ax.set_xlabel("MTBF (fault-free steps)")
    ax.set_ylabel("ETTR (median of seeds)")
    # Runs above 1 (a run faster than its baselines: the noise) stay in view.
    ax.set_ylim(0, max([1.0] + [r.get("ettr", 0) for r in results]) + 0.02)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(out, "ettr.png"), dpi=120)
    print(f"ettr: plot in {os.path.join(out, 'ettr.png')}")


if __name__ == "__main__":
    main()
