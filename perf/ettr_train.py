"""The training job perf/ettr.py measures: a data-parallel MLP at a fixed
global batch, deterministic (data by step, one thread), with a step padded
to --step-ms (the accelerator's share of a real step at the full world
size; with fewer ranks each takes a larger share of the same global batch,
so the pad grows in proportion, as the step time would on real hardware). One program, three
ways to survive a failure:

- restart: torchrun --max-restarts restarts every worker, which loads the
  newest torch.distributed.checkpoint (async save every --ckpt-every steps,
  to local disk) and redoes the steps since it (Gloo);
- replace: under eccl-run with standbys, the survivors recover("replace"),
  a standby takes the dead rank and every rank takes the state of the most
  advanced one (a data-parallel peer); nothing is written to disk;
- shrink: under eccl-run with no standby, the survivors recover("shrink")
  and go on with fewer ranks at the same global batch; with --grow-every K
  (and eccl-run --respawn), every K steps while short of the job's size
  they ask to grow by one (a collective the coordinator answers alike for
  all: admitted, or refused while no replacement has registered) and a
  replacement that arrived takes the state of the most advanced rank.

Every process appends JSON lines to --events/<pid>.jsonl (start, ready,
step, ckpt, fail, recovered, done); perf/ettr.py reads them.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import time

import sys

import late_start

STARTED_AT_NICE = late_start.begin()  # before torch: importing it is most of a late starter's start

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

# The replace path's state sync is the DDP example's (the most advanced
# rank's parameters and Adam state to every rank).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python", "examples"))
from ddp_elastic import sync  # noqa: E402

GLOBAL_BATCH, WIDTH, HIDDEN = 64, 256, 1024


class Events:
    def __init__(self, directory: str):
        os.makedirs(directory, exist_ok=True)
        self.f = open(os.path.join(directory, f"{os.getpid()}.jsonl"), "a", buffering=1)

    def __call__(self, ev: str, **fields):
        self.f.write(json.dumps({"t": time.time(), "pid": os.getpid(), "ev": ev, **fields}) + "\n")


def build():
    torch.manual_seed(1234)
    model = torch.nn.Sequential(torch.nn.Linear(WIDTH, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, HIDDEN),
                                torch.nn.Tanh(), torch.nn.Linear(HIDDEN, WIDTH))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for p in model.parameters():  # Adam's state made now, so a peer's can be received into it
        opt.state[p] = {"step": torch.tensor(0.0), "exp_avg": torch.zeros_like(p), "exp_avg_sq": torch.zeros_like(p)}
    return model, opt


def wrap(model):
    """DDP after one pass whose gradients are all zero: DDP reduces its
    first step in buckets by parameter order and then rebuilds them in the
    order the gradients became ready, so a job that wraps again after a
    recovery would reduce one step in other buckets (and sum in another
    order) than a job that never stopped. With the pass, every real step of
    every job reduces in the rebuilt buckets."""
    ddp = DDP(model)
    (ddp(torch.zeros(1, WIDTH)).sum() * 0).backward()
    model.zero_grad(set_to_none=False)
    return ddp


def digest(model) -> str:
    return hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()[:16]


def global_batch(step: int):
    """The step's whole batch and its targets, the same for every job."""
    x = torch.randn(GLOBAL_BATCH, WIDTH, generator=torch.Generator().manual_seed(step * 7919 + 17))
    return x, x.roll(1, dims=1).sin()


def train_step(ddp, opt, step: int) -> float:
    """One step of the global batch; this rank takes its share. The loss is
    scaled so that DDP's mean over ranks is the global batch's mean at any
    world size; returned as this rank's part of that mean (the ranks' parts
    sum to it)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    x, y = global_batch(step)
    xs, ys = torch.tensor_split(x, world)[rank], torch.tensor_split(y, world)[rank]
    opt.zero_grad(set_to_none=False)
    loss = ((ddp(xs) - ys) ** 2).mean(dim=1).sum() * world / GLOBAL_BATCH
    loss.backward()
    opt.step()
    return loss.item() / world


# --- checkpoint-restart (torchrun, Gloo, torch.distributed.checkpoint) -----
class Checkpoints:
    def __init__(self, directory: str, every: int, events: Events, timeout_s: float):
        from datetime import timedelta

        import torch.distributed.checkpoint as dcp

        self.dcp, self.dir, self.every, self.events = dcp, directory, every, events
        self.pending = None  # (future, step, started)
        # The background save finishes with collectives of its own: on the
        # training's group they would interleave with DDP's and hang.
        self.group = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))
        os.makedirs(directory, exist_ok=True)

    def _state(self, model, opt, step: int):
        from torch.distributed.checkpoint.state_dict import get_state_dict

        m, o = get_state_dict(model, opt)
        return {"model": m, "optim": o, "step": torch.tensor(step)}

    def load(self, model, opt) -> int:
        from torch.distributed.checkpoint.state_dict import set_state_dict

        latest = os.path.join(self.dir, "latest")
        if not os.path.exists(latest):
            return 0
        step = int(open(latest).read())
        state = self._state(model, opt, 0)
        self.dcp.load(state, checkpoint_id=os.path.join(self.dir, f"step-{step}"), process_group=self.group)
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
        return int(state["step"])

    def _settle(self):
        future, step, started = self.pending
        future.result()
        self.pending = None
        if dist.get_rank() == 0:  # only a finished checkpoint becomes the one to load
            with open(os.path.join(self.dir, "latest.tmp"), "w") as f:
                f.write(str(step))
            os.replace(os.path.join(self.dir, "latest.tmp"), os.path.join(self.dir, "latest"))
        self.events("ckpt_done", step=step, seconds=time.time() - started)

    def maybe_save(self, model, opt, step: int):
        if self.every <= 0 or step % self.every:
            return
        t0 = time.time()
        if self.pending:
            self._settle()
        future = self.dcp.async_save(self._state(model, opt, step), checkpoint_id=os.path.join(self.dir, f"step-{step}"),
                                     process_group=self.group)
        self.pending = (future, step, t0)
        self.events("ckpt", step=step, blocking=time.time() - t0)

    def finish(self):
        if self.pending:
            self._settle()


def init_restarted_gloo(timeout_s: float):
    """Gloo under torchrun, keyed by the restart: torch 2.15's agent keeps
    one store for the job, and workers of a restart that use it as is read
    the previous attempt's addresses (connectFullMesh: connection refused,
    every restart again)."""
    from datetime import timedelta

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    agent_hosts = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                          is_master=not agent_hosts and rank == 0, timeout=timedelta(seconds=60))
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    dist.init_process_group("gloo", store=dist.PrefixStore(f"/ettr/attempt_{attempt}", store), rank=rank,
                            world_size=world, timeout=timedelta(seconds=timeout_s))


def loss_fields(part: float) -> dict:
    """What perf/ettr.py sums over ranks for the global loss: this rank's
    rows of the global batch and the sum of their losses."""
    rank, world = dist.get_rank(), dist.get_world_size()
    rows = torch.tensor_split(torch.arange(GLOBAL_BATCH), world)[rank].numel()
    return {"loss_sum": part * GLOBAL_BATCH, "rows": rows}


def try_grow(events, step: int) -> bool:
    """Every rank asks at the same step; the coordinator admits a
    registered replacement or refuses all alike."""
    import torch_eccl

    started = time.time()
    try:
        s = torch_eccl.grow(1)
    except RuntimeError as e:
        if "refused" not in str(e) or "standby" not in str(e):
            raise  # a failure, not a refusal: the recovery path takes it
        return False
    events("grew", rank=dist.get_rank(), world=int(s["world_size"]), step=step, seconds=time.time() - started)
    return True


def grow_before_end(events, step: int, tries: int) -> bool:
    """At the last step of a job that shrank: every rank asks to grow up to
    `tries` times, half a second apart (the same count on every rank, so
    the asks stay collective), for a repaired rank that a loaded machine
    is still starting. The smoke's check that a shrunk job grows back."""
    for _ in range(tries):
        if try_grow(events, step):
            return True
        time.sleep(0.5)
    return False


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--recovery", choices=["restart", "replace", "shrink"], required=True)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--step-ms", type=float, default=100)
    ap.add_argument("--events", required=True)
    ap.add_argument("--ckpt-dir")
    ap.add_argument("--ckpt-every", type=int, default=0)
    ap.add_argument("--grow-every", type=int, default=0,
                    help="shrink, replace: while short of the job's size, try to grow back every K steps")
    ap.add_argument("--grow-before-end", type=int, default=0, metavar="TRIES",
                    help="shrink: short of the job's size at the last step, ask to grow up to TRIES times first")
    ap.add_argument("--pg-timeout-s", type=float, default=30,
                    help="restart: Gloo's collective timeout (how long a hung rank holds the others)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    events = Events(args.events)
    events("start", restart=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)),
           role=os.environ.get("ECCL_ROLE", "rank"), nice=STARTED_AT_NICE)
    model, opt = build()
    if args.recovery == "restart":
        init_restarted_gloo(args.pg_timeout_s)
        ckpt = Checkpoints(args.ckpt_dir, args.ckpt_every, events, args.pg_timeout_s) if args.ckpt_dir else None
        step = ckpt.load(model, opt) if ckpt else 0
    else:
        import torch_eccl

        torch_eccl.init_process_group()  # a rank, or a standby that waits for one
        events("joined", above=late_start.joined())
        step = 0 if torch_eccl.stats()["joined_epoch"] == 1 else -1
        ckpt = None
    ddp, need_sync = None, args.recovery != "restart"
    if not need_sync:
        ddp = wrap(model)
        events("ready", rank=dist.get_rank(), world=dist.get_world_size(), step=step)
    loss = float("nan")
    full_world = int(os.environ.get("WORLD_SIZE") or os.environ.get("ECCL_NRANKS") or 0)  # the job's size
    while True:
        try:
            if need_sync:
                step = sync(model, opt, step)
                ddp = wrap(model)
                need_sync = False
                events("ready", rank=dist.get_rank(), world=dist.get_world_size(), step=step)
            if step >= args.steps:
                if (args.grow_before_end and full_world and dist.get_world_size() < full_world
                        and grow_before_end(events, step, args.grow_before_end)):
                    need_sync = True
                    continue
                break
            if (args.grow_every and step % args.grow_every == 0 and full_world
                    and dist.get_world_size() < full_world and try_grow(events, step)):
                need_sync = True
                continue
            started = time.monotonic()
            loss = train_step(ddp, opt, step)
            step += 1
            events("step", rank=dist.get_rank(), world=dist.get_world_size(), step=step, loss=loss,
                   **loss_fields(loss))
            if ckpt:
                ckpt.maybe_save(model, opt, step)
            pad = args.step_ms / 1000 * (full_world or dist.get_world_size()) / dist.get_world_size()
            time.sleep(max(0.0, pad - (time.monotonic() - started)))
        except RuntimeError as e:
            if args.recovery == "restart":
                raise  # torchrun restarts every worker
            import torch_eccl

            events("fail", rank=dist.get_rank(), step=step, why=str(e).splitlines()[0][:300])
            # More ranks lost at once than there are standbys (hung ones
            # are found late, together): replace what can be, drop the rest,
            # and grow back to refills (--grow-every) rather than die.
            s = torch_eccl.recover("replace_or_shrink" if args.recovery == "replace" else args.recovery)
            events("recovered", rank=dist.get_rank(), world=int(s["world_size"]), epoch=int(s["epoch"]))
            need_sync = True
    if ckpt:
        ckpt.finish()
    events("done", rank=dist.get_rank(), world=dist.get_world_size(), step=step, loss=loss, digest=digest(model),
           **loss_fields(loss))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
