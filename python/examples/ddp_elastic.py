"""DDP training on eccl that survives a rank's death.

Deterministic model and data, Adam, DistributedDataParallel over the "eccl"
backend. When a collective fails (a rank died), the survivors recover with
REPLACE: a standby takes the dead rank's place, every rank (the newcomer
too) takes the model and optimizer state of the most advanced rank, and
training goes on. The final parameters equal a failure-free run bit for bit.

Failure-free (baseline), any launcher that sets torch's environment:
    torchrun --nproc-per-node 4 ddp_elastic.py --out base.pt
With a standby and a kill, under eccl-run:
    eccl-run -np 4 --standby 1 --kill-when "2:step 40" python ddp_elastic.py --out elastic.pt
"""

from __future__ import annotations

import argparse
import hashlib
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import torch_eccl


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 8))

    def forward(self, x):
        return self.body(x)


def batch(step: int, rank: int):
    g = torch.Generator().manual_seed(step * 1009 + rank)
    x = torch.randn(16, 32, generator=g)
    return x, x[:, :8].sin()


def build():
    torch.manual_seed(1234)
    model = Net()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    # The state Adam would make at its first step, made now so a newcomer
    # has tensors to receive it into.
    for p in model.parameters():
        opt.state[p] = {"step": torch.tensor(0.0), "exp_avg": torch.zeros_like(p), "exp_avg_sq": torch.zeros_like(p)}
    return model, opt


def state_tensors(model, opt):
    out = [p.data for p in model.parameters()]
    for p in model.parameters():
        s = opt.state[p]
        out += [s["step"], s["exp_avg"], s["exp_avg_sq"]]
    return out


def sync(model, opt, step: int) -> int:
    """Everyone takes the state of the most advanced rank (the lowest such
    rank): after a failure some survivors may have finished the step the
    others failed in. A newcomer brings step -1."""
    best = torch.tensor([step])
    dist.all_reduce(best, op=dist.ReduceOp.MAX)
    src = torch.tensor([dist.get_rank() if step == best.item() else dist.get_world_size()])
    dist.all_reduce(src, op=dist.ReduceOp.MIN)
    for t in state_tensors(model, opt):
        dist.broadcast(t, src=int(src.item()))
    return int(best.item())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--step-ms", type=float, default=100, help="pause per step, so a kill lands mid-run")
    ap.add_argument("--out", help="rank 0 writes the final parameters here")
    args = ap.parse_args()
    torch.set_num_threads(1)  # the same reduction order in every run
    if "ECCL_UNIQUE_ID" in os.environ:
        torch_eccl.init_process_group()  # eccl-run: a rank, or a standby that waits for one
    else:
        dist.init_process_group("eccl")
    model, opt = build()
    step = 0 if torch_eccl.stats()["joined_epoch"] == 1 else -1
    rank = dist.get_rank()
    if step < 0:
        print(f"rank {rank}: joined at epoch {torch_eccl.stats()['epoch']}; receiving the state", flush=True)
    ddp, need_sync, recoveries = None, True, 0
    while True:
        try:
            if need_sync:
                step = sync(model, opt, step)
                ddp = DDP(model)
                need_sync = False
            if step >= args.steps:
                break
            x, y = batch(step, dist.get_rank())
            opt.zero_grad(set_to_none=False)
            torch.nn.functional.mse_loss(ddp(x), y).backward()
            opt.step()
            step += 1
            if step % 10 == 0:
                print(f"rank {rank}: step {step}", flush=True)
            time.sleep(args.step_ms / 1000)
        except RuntimeError as e:
            t0 = time.monotonic()
            print(f"rank {rank}: step {step} failed: {e}", flush=True)
            s = torch_eccl.recover("replace")
            recoveries += 1
            print(f"rank {rank}: recovered into epoch {int(s['epoch'])} in {(time.monotonic() - t0) * 1000:.1f} ms "
                  f"(opened {int(s['connections_opened'])}, closed {int(s['connections_closed'])}, "
                  f"inherited {int(s['connections_inherited'])})", flush=True)
            need_sync = True
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
    print(f"rank {rank}: done after {step} steps, {recoveries} recoveries, parameters sha256 {digest}", flush=True)
    if rank == 0 and args.out:
        torch.save([p.detach().clone() for p in model.parameters()], args.out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
