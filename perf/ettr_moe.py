"""The MoE job perf/ettr.py measures (contenders moe-replace, moe-shrink):
the model of python/examples/moe_elastic.py (a small transformer language
model, 16 experts a layer, top-2, uneven replicas from the planner,
dispatch and combine through torch_eccl.moe, the replicas' gradients
summed in one call) at a fixed global batch of model.GLOBAL_SEQUENCES split over
the ranks, each step padded to --step-ms as perf/ettr_train.py pads its
steps (a larger share of the batch per rank after a shrink: a longer pad).

- replace: eccl-run --standby --refill; the survivors recover
  ("replace_or_shrink"), the standby takes the dead rank, receives the
  dense state from a survivor and its experts from their surviving
  replicas, and the job ends bit-equal to the fault-free run;
- shrink: no standby; the survivors recover("shrink"), plan a placement
  for the ranks that remain, move the weights and Adam state each now
  needs from a surviving replica (or the peer-memory snapshot where every
  replica died) and train on with every survivor busy (Lazarus); with
  --grow-every K (eccl-run --respawn) they grow back to a repaired
  replacement and re-place for the full size.

The experts are re-placed from the observed load every --rebalance steps
(the same move). Events as perf/ettr_train.py's.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time

import late_start

STARTED_AT_NICE = late_start.begin()  # before torch: importing it is most of a late starter's start

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python", "examples"))
import moe_elastic as model  # noqa: E402
from ettr_train import Events, grow_before_end, try_grow  # noqa: E402

import torch_eccl  # noqa: E402

class Job(model.Trainer):
    def data(self):
        """This rank's rows of the step's global batch, its loss scaled so
        that the mean over ranks is the global batch's mean at any size."""
        return model.global_batch_share(self.step, dist.get_rank(), dist.get_world_size())

    def rows(self) -> int:
        return torch.tensor_split(torch.arange(model.GLOBAL_SEQUENCES), dist.get_world_size())[dist.get_rank()].numel()


def model_digest(job: Job) -> str:
    """One digest of the whole model, the same on every rank: the dense
    part and every expert (its replicas must agree)."""
    experts = {e: model.digest(ts[:len(ts) // 3]) for e, ts in job.experts.items()}
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, experts)
    merged = {}
    for rank, held in enumerate(gathered):
        for e, d in held.items():
            if merged.setdefault(e, d) != d:
                return f"expert {e}'s replicas disagree (rank {rank})"
    if len(merged) != model.EXPERTS:
        return f"experts {sorted(set(range(model.EXPERTS)) - set(merged))} are held by no rank"
    text = json.dumps([model.digest(list(job.dense.parameters())), sorted(merged.items())])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--recovery", choices=["replace", "shrink"], required=True)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--step-ms", type=float, default=100)
    ap.add_argument("--events", required=True)
    ap.add_argument("--rebalance", type=int, default=50, help="re-place the experts from the load every N steps")
    ap.add_argument("--grow-every", type=int, default=0, help="while short of the job's size, try to grow every K steps")
    ap.add_argument("--grow-before-end", type=int, default=0, metavar="TRIES",
                    help="short of the job's size at the last step, ask to grow up to TRIES times first")
    args = ap.parse_args()
    torch.set_num_threads(1)  # one reduction order in every run
    events = Events(args.events)
    events("start", restart=0, role=os.environ.get("ECCL_ROLE", "rank"), nice=STARTED_AT_NICE)
    model.configure(model.EXPERTS, model.MIN_REPLICAS)
    torch_eccl.init_process_group()  # a rank, or a standby that waits for one
    events("joined", above=late_start.joined())
    joined = torch_eccl.stats()["joined_epoch"] > 1
    rank = dist.get_rank()
    job = Job(ident=rank if not joined else 1000 + rank)
    if joined:
        job.step = -1
    else:
        world = dist.get_world_size()
        model.learn_hosts()  # --fault host: experts placed across the simulated machines
        job.fresh_experts(model.placement_for([1.0] * model.EXPERTS, world))
        job.start_snapshots("first")
        events("ready", rank=rank, world=world, step=0)
    full_world = int(os.environ.get("ECCL_NRANKS") or dist.get_world_size())
    need_sync = joined
    while True:
        try:
            if need_sync:
                job.sync(args.rebalance, args.steps)
                need_sync = False
                events("ready", rank=dist.get_rank(), world=dist.get_world_size(), step=job.step)
            if job.step >= args.steps:
                if (args.grow_before_end and dist.get_world_size() < full_world
                        and grow_before_end(events, job.step, args.grow_before_end)):
                    need_sync = True
                    continue
                # In the loop: a rank that dies in the final gather is
                # recovered from like one dying in a step (seen once in 72
                # runs at MTBF 100: every rank's gather failed, the job lost).
                final = model_digest(job)
                break
            if (args.grow_every and job.step % args.grow_every == 0 and dist.get_world_size() < full_world
                    and try_grow(events, job.step)):
                need_sync = True
                continue
            started = time.monotonic()
            job.prev_candidate = job.copy_state()
            job.train_step()
            job.prev = job.prev_candidate
            job.put_snapshot()
            loss = job.losses[-1]
            events("step", rank=dist.get_rank(), world=dist.get_world_size(), step=job.step, loss=loss,
                   loss_sum=loss * job.rows(), rows=job.rows())
            if args.rebalance and job.step % args.rebalance == 0 and job.step < args.steps:
                need_sync = True
            pad = args.step_ms / 1000 * full_world / dist.get_world_size()
            time.sleep(max(0.0, pad - (time.monotonic() - started)))
        except RuntimeError as e:
            events("fail", rank=dist.get_rank(), step=job.step, why=str(e).splitlines()[0][:300])
            s = torch_eccl.recover("replace_or_shrink" if args.recovery == "replace" else "shrink")
            events("recovered", rank=dist.get_rank(), world=int(s["world_size"]), epoch=int(s["epoch"]))
            need_sync = True
    loss = job.losses[-1] if job.losses else float("nan")
    events("done", rank=dist.get_rank(), world=dist.get_world_size(), step=job.step, loss=loss,
           digest=final, loss_sum=loss * job.rows(), rows=job.rows())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
