"""The torchft contender of perf/ettr.py: the job of perf/ettr_train.py as
torchft runs it, one replica group per process, each under torchft's
Manager with its ProcessGroupGloo and a real torchft_lighthouse.

A replica group takes its quarter of the global batch; a failed step (a
participant died mid-allreduce) is not committed; the survivors go on in
a smaller quorum (fewer samples per step); the driver restarts a dead
replica group (as torchrun --max-restarts does for one), which heals from
a peer's live state and rejoins. There is no checkpoint: the loss of every
replica group at once is torchft's to avoid, and the injector never does
that.

    python ettr_torchft.py --replicas 4 --steps 300 --step-ms 150 --events DIR

runs the lighthouse and the replica groups and exits once every replica
group finished or gave up (0), or one failed in a way that was not an
injected kill. Quorums need a majority of the groups (torchft's guard
against split brain).
Events go to DIR like ettr_train's ("step" carries the number of
participants in `world`: perf/ettr.py counts samples, not steps; a group
writes "took_part" once its gradient is in a step's allreduce).

    python ettr_torchft.py --replay DIR --steps 300

trains in one process the steps DIR's events say were committed, each on
the shares of the groups that took part, and prints its final loss: what
perf/ettr.py checks a torchft run's final state against.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from datetime import timedelta

HERE = os.path.abspath(__file__)


def replica_main(a) -> int:
    sys.path.insert(0, os.path.dirname(HERE))
    import late_start

    nice = late_start.begin()  # a restarted group: low until it has trained a step
    import torch
    from torchft import Manager
    from torchft.ddp import DistributedDataParallel
    from torchft.optim import OptimizerWrapper
    from torchft.process_group import ProcessGroupGloo

    from ettr_train import Events, build, digest, global_batch

    torch.set_num_threads(1)
    events = Events(a.events)
    events("start", restart=a.attempt, role="replica", nice=nice)
    model, optimizer = build()

    def state_dict():
        return {"model": model.state_dict(), "optim": optimizer.state_dict()}

    def load_state_dict(sd):
        model.load_state_dict(sd["model"])
        optimizer.load_state_dict(sd["optim"])

    timeout = timedelta(seconds=a.timeout)
    store = torch.distributed.TCPStore("localhost", 0, is_master=True, wait_for_workers=False)
    # Waiting for a majority is torchft's state when it has none (two
    # groups down at once until their restarts rejoin): longer than a step.
    manager = Manager(pg=ProcessGroupGloo(timeout=timeout), load_state_dict=load_state_dict, state_dict=state_dict,
                      min_replica_size=majority(a.replicas), replica_id=f"replica{a.replica}",
                      store_addr="localhost", store_port=store.port, rank=0, world_size=1,
                      lighthouse_addr=a.lighthouse, timeout=timeout, quorum_timeout=timeout * 12,
                      connect_timeout=timeout)
    ddp = DistributedDataParallel(manager, model)
    opt = OptimizerWrapper(manager, optimizer)
    events("ready", rank=a.replica, world=a.replicas, step=manager.current_step())
    loss, trained = float("nan"), False
    while manager.current_step() < a.steps:
        started = time.monotonic()
        step = manager.current_step()
        x, y = global_batch(step)
        xs, ys = torch.tensor_split(x, a.replicas)[a.replica], torch.tensor_split(y, a.replicas)[a.replica]
        opt.zero_grad()
        out = ((ddp(xs) - ys) ** 2).mean()
        out.backward()  # the allreduce: after it, this step's quorum says who takes part
        # Not while healing (its gradient is zeroed); written before the
        # commit: a group killed after its allreduce still took part.
        if manager.is_participating():
            events("took_part", rank=a.replica, step=step, quorum=quorum_id(manager))
        # OptimizerWrapper.step(), saying whether it committed: a group that
        # healed in this step has a later step than it started with even
        # when the step failed (it is at the quorum's step, not past it).
        committed = manager.should_commit()  # only if every participant's allreduce succeeded
        if committed:
            optimizer.step()
            if not trained:
                trained = True
                events("joined", above=late_start.joined())
            loss = out.item()
            events("step", rank=a.replica, world=manager.num_participants(), step=manager.current_step(), loss=loss,
                   loss_sum=loss * xs.shape[0], rows=xs.shape[0], quorum=quorum_id(manager))
        else:
            events("fail", rank=a.replica, step=manager.current_step(), why="step not committed",
                   quorum=quorum_id(manager))
        time.sleep(max(0.0, a.step_ms / 1000 - (time.monotonic() - started)))
    # The final parameters' loss on the last step's whole global batch: the
    # groups that finish may be fewer than four (the others killed late),
    # and one group's quarter of the batch is a noisier figure than the
    # fault-free run's (it made perf/ettr.py's loss check fail a sound run).
    final, rows = final_loss(model, a.steps)
    events("done", rank=a.replica, world=manager.num_participants(), step=manager.current_step(), loss=final,
           loss_sum=final * rows, rows=rows, digest=digest(model))
    manager.shutdown(wait=False)
    return 0


def majority(replicas: int) -> int:
    """The fewest replica groups a quorum may have: a majority, as torchft
    advises against split brain. With 1, a loaded run's lighthouse formed
    a quorum of one group and, beside it, one of the other two at the same
    step; both committed it and the groups ended with different
    parameters (CI of stop 62, and a fresh clone in session 58)."""
    return replicas // 2 + 1


def quorum_id(manager) -> int:
    """The lighthouse's number of the manager's current quorum (it only
    grows); torchft keeps it private, hence -1 where a version lacks it."""
    return getattr(manager, "_quorum_id", -1)


def final_loss(model, steps: int) -> tuple[float, int]:
    """The model's loss on the last step's whole global batch, and its rows."""
    import torch
    from ettr_train import global_batch

    x, y = global_batch(steps - 1)
    with torch.no_grad():
        return ((model(x) - y) ** 2).mean().item(), x.shape[0]


def takers_by_step(events_dir: str) -> dict[int, tuple[list[int], int]]:
    """What each committed step summed, from the events: the replica groups
    whose gradients it took and the world it divided by (the groups at the
    quorum's step). A group took part if it wrote took_part (after its
    allreduce) and then the step committed; or if it was killed after
    took_part and no group failed that step later; or if it was killed
    after committing the step before and before took_part, while the step
    committed with it in the world (its allreduce had sent its share); or
    if its own commit failed after took_part while the others committed the
    step in the same quorum with it in the world (a peer died as the
    allreduce ended: the others had every share, this group saw the error
    and heals later). At
    step 0 torchft's first quorum makes every group but one heal from it:
    they count in the world with zeroed gradients. A group that gave up
    (restarted after the others ended) left nothing in the final state.

    A step committed twice (the groups that first committed it all died
    before anyone healed from them, and a new quorum began again from an
    older step) counts as its last quorum committed it: the final state
    descends from that one. Events of the other quorums at that step are
    left out."""
    chosen = lineage_quorums(read_event_files(events_dir))
    confirmed: dict[int, set[int]] = {}
    dangling: dict[int, dict[int, float]] = {}
    silent: dict[int, set[int]] = {}
    refused: dict[int, set[int]] = {}  # took part, then its own commit failed
    world: dict[int, set[int]] = {}
    failed: dict[int, list[float]] = {}
    for evs in read_event_files(events_dir):
        if any(e["ev"] == "gave_up" for e in evs):
            continue  # its steps trained alone, from scratch, and were dropped
        evs = [e for e in evs if e["ev"] in ("took_part", "step", "fail")]
        for i, e in enumerate(evs):
            if not in_lineage(e, chosen):
                continue
            last = i + 1 == len(evs)
            if e["ev"] == "step":
                world.setdefault(e["step"] - 1, set()).add(e["world"])
                if last:
                    silent.setdefault(e["step"], set()).add(e["rank"])
            elif e["ev"] == "fail":
                failed.setdefault(e["step"], []).append(e["t"])
            elif last:
                dangling.setdefault(e["step"], {})[e["rank"]] = e["t"]
            elif evs[i + 1]["ev"] == "step" and evs[i + 1]["step"] == e["step"] + 1:
                confirmed.setdefault(e["step"], set()).add(e["rank"])
            elif evs[i + 1]["ev"] == "fail" and evs[i + 1]["step"] == e["step"] and in_lineage(evs[i + 1], chosen):
                refused.setdefault(e["step"], set()).add(e["rank"])
    steps = {}
    for step, worlds in sorted(world.items()):
        groups = confirmed.get(step, set()) | {rank for rank, t in dangling.get(step, {}).items()
                                               if not any(f > t for f in failed.get(step, ()))}
        n = min(worlds)
        unconfirmed = silent.get(step, set()) | refused.get(step, set())
        if len(groups) < n and len(groups | unconfirmed) == n:
            groups |= unconfirmed
        if len(worlds) != 1 or not (0 < len(groups) <= n if step == 0 else len(groups) == n):
            raise ValueError(f"step {step}: committed at world {sorted(worlds)} with the gradients of replica "
                             f"groups {sorted(groups)}")
        steps[step] = (sorted(groups), n)
    return steps


def read_event_files(events_dir: str) -> list[list[dict]]:
    """Each process's events, in its file's order."""
    files = []
    for name in sorted(os.listdir(events_dir)):
        if name.endswith(".jsonl"):
            with open(os.path.join(events_dir, name)) as f:
                files.append([json.loads(line) for line in f])
    return files


def committed_step(e: dict) -> int:
    """The step an event is about: a "step" event carries the next one."""
    return e["step"] - 1 if e["ev"] == "step" else e["step"]


def lineage_quorums(files: list[list[dict]]) -> dict[int, int]:
    """Per committed step, the last quorum that committed it (events
    written before quorums were recorded all count as one, -1)."""
    chosen: dict[int, int] = {}
    for evs in files:
        for e in evs:
            if e["ev"] == "step":
                step = committed_step(e)
                chosen[step] = max(chosen.get(step, -1), e.get("quorum", -1))
    return chosen


def in_lineage(e: dict, chosen: dict[int, int]) -> bool:
    return e.get("quorum", -1) == chosen.get(committed_step(e), e.get("quorum", -1))


def committed_worlds(evs: list[dict]) -> dict[int, int]:
    """Per committed step, the number of participants of the quorum whose
    commit the final state descends from (perf/ettr.py's work)."""
    steps = [e for e in evs if e["ev"] == "step"]
    chosen = lineage_quorums([steps])
    worlds: dict[int, int] = {}
    for e in steps:
        if in_lineage(e, chosen):
            step = committed_step(e)
            worlds[step] = max(worlds.get(step, 0), e["world"])
    return worlds


def replay_main(a) -> int:
    """Trains in one process what the run's commits describe: each step's
    gradient the sum of the participating groups' shares' over the world
    torchft divided by, and prints the final loss and digest as JSON."""
    import torch

    sys.path.insert(0, os.path.dirname(HERE))
    from ettr_train import build, digest, global_batch

    torch.set_num_threads(1)
    takers = takers_by_step(a.replay)
    missing = [s for s in range(a.steps) if s not in takers]
    if missing:
        print(json.dumps({"why": f"no committed step {missing[0]} in the events"}))
        return 1
    model, optimizer = build()
    for step in range(a.steps):
        x, y = global_batch(step)
        xs, ys = torch.tensor_split(x, a.replicas), torch.tensor_split(y, a.replicas)
        optimizer.zero_grad()
        groups, world = takers[step]
        loss = sum(((model(xs[r]) - ys[r]) ** 2).mean() for r in groups) / world
        loss.backward()
        optimizer.step()
    final, _ = final_loss(model, a.steps)
    short = sum(1 for groups, _ in takers.values() if len(groups) < a.replicas)
    print(json.dumps({"loss": final, "digest": digest(model), "short_steps": short}))
    return 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def driver_main(a) -> int:
    port = free_port()
    lighthouse = subprocess.Popen(
        [os.path.join(os.path.dirname(sys.executable), "torchft_lighthouse"), "--bind", f"[::]:{port}",
         "--min_replicas", str(majority(a.replicas)), "--join_timeout_ms", "500", "--quorum_tick_ms", "20", "--heartbeat_timeout_ms",
         str(a.heartbeat_timeout_ms)], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)

    def spawn(i: int, attempt: int) -> subprocess.Popen:
        argv = [sys.executable, HERE, "--replica", str(i), "--attempt", str(attempt), "--replicas", str(a.replicas),
                "--steps", str(a.steps), "--step-ms", str(a.step_ms), "--events", a.events, "--timeout",
                str(a.timeout), "--lighthouse", f"http://localhost:{port}"]
        # A restarted group starts while the others train: a late starter.
        env = {**os.environ, "ETTR_LATE_STARTER": "1"} if attempt else None
        return subprocess.Popen(argv, start_new_session=True, env=env)

    procs = {i: spawn(i, 0) for i in range(a.replicas)}
    attempts = {i: 0 for i in procs}
    done: set[int] = set()
    rc = 0
    finished_at = None
    # A group restarted after the others ended waits for a quorum that can
    # no longer form (a majority is gone): it gives up, with nothing of its
    # own in the final state. One still training ends within a step of them.
    grace_s = max(10.0, 20 * a.step_ms / 1000)
    try:
        while len(done) < a.replicas:
            for i, p in procs.items():
                if i in done:
                    continue
                if p.poll() is None:
                    if attempts[i] and finished_at is not None and time.monotonic() - finished_at > grace_s:
                        os.killpg(p.pid, signal.SIGKILL)
                        p.wait()
                        with open(os.path.join(a.events, f"{p.pid}.jsonl"), "a") as f:
                            f.write(json.dumps({"t": time.time(), "pid": p.pid, "ev": "gave_up", "rank": i,
                                                "step": -1}) + "\n")
                        print(f"ettr_torchft: replica {i} (restart {attempts[i]}) found no quorum after the others "
                              f"finished; it gave up", flush=True)
                        done.add(i)
                    continue
                if p.returncode == 0:
                    done.add(i)
                    finished_at = finished_at or time.monotonic()
                elif p.returncode == -signal.SIGKILL:  # the injector's (or a watchdog's): restart it
                    attempts[i] += 1
                    print(f"ettr_torchft: replica {i} was killed; restart {attempts[i]}", flush=True)
                    procs[i] = spawn(i, attempts[i])
                else:
                    print(f"ettr_torchft: replica {i} failed with exit {p.returncode}", flush=True)
                    rc = 1
                    done.add(i)
            time.sleep(0.05)
    finally:
        for p in procs.values():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        lighthouse.kill()
        lighthouse.wait()
    return rc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--step-ms", type=float, default=100)
    ap.add_argument("--events")
    ap.add_argument("--timeout", type=float, default=10.0, help="torchft's collective and quorum timeout, seconds")
    ap.add_argument("--heartbeat-timeout-ms", type=int, default=1000)
    ap.add_argument("--replay", metavar="EVENTS",
                    help="train in one process what a run's events say each step committed; print its final loss")
    ap.add_argument("--replica", type=int, default=-1, help=argparse.SUPPRESS)
    ap.add_argument("--attempt", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--lighthouse", default="", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if not a.replay and not a.events:
        ap.error("--events DIR is needed (or --replay EVENTS)")
    if a.replay:
        return replay_main(a)
    return replica_main(a) if a.replica >= 0 else driver_main(a)


if __name__ == "__main__":
    sys.exit(main())
