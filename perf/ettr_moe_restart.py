"""The MoE job as users run it today, for perf/ettr.py's moe-restart: the
model of python/examples/moe_elastic.py (same sizes, data and global
batch as perf/ettr_moe.py) with expert parallelism as Megatron builds it:
one replica per expert, EXPERTS / world on each rank (in blocks), tokens exchanged by
all_to_all_single with splits over Gloo (perf/moe_bench.py's a2a_layer,
differentiable through torch.distributed.nn), the dense gradients summed
by one allreduce, torch's Adam. On a failure torchrun --max-restarts
restarts every worker; they load the newest torch.distributed.checkpoint
(async save every --ckpt-every steps to local disk: the dense part from
every rank, each expert from its owner) and redo the steps since.

Events as perf/ettr_train.py's.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python", "examples"))
import moe_elastic as model  # noqa: E402
from ettr_train import Checkpoints, Events, init_restarted_gloo  # noqa: E402
from moe_bench import a2a_layer  # noqa: E402


class Layer(torch.nn.Module):
    """The dense part (every rank) and this rank's experts (one replica each)."""

    def __init__(self, rank: int, world: int):
        super().__init__()
        self.dense = model.Dense()  # seeded: the same on every rank
        self.world = world
        self.mine = [e for e in range(model.EXPERTS) if self.owner(e) == rank]
        self.experts = torch.nn.ModuleDict({
            f"e{e}": torch.nn.ParameterList(torch.nn.Parameter(t) for t in model.expert_init(e)) for e in self.mine})

    def owner(self, e):
        """Experts in contiguous blocks, as even as the world allows."""
        return e * self.world // model.EXPERTS

    def expert(self, layer: int):
        return lambda e, rows: model.expert_forward(list(self.experts[f"e{e}"]), layer, rows)


def build(rank: int, world: int):
    torch.manual_seed(1234)
    layer = Layer(rank, world)
    opt = torch.optim.Adam(layer.parameters(), lr=model.LR, betas=model.BETAS, eps=model.EPS)
    for p in layer.parameters():  # Adam's state made now, so a checkpoint can be loaded into it
        opt.state[p] = {"step": torch.tensor(0.0), "exp_avg": torch.zeros_like(p), "exp_avg_sq": torch.zeros_like(p)}
    return layer, opt


def train_step(net: Layer, opt, step: int) -> float:
    """One step of the global batch; returns the global batch's mean loss."""
    rank, world = dist.get_rank(), dist.get_world_size()
    x, y, scale = model.global_batch_share(step, rank, world)
    d = net.dense
    h = d.embed(x) + d.pos
    mask = torch.triu(torch.ones(model.SEQ, model.SEQ, dtype=torch.bool), 1)
    for layer in range(model.LAYERS):
        a = d.norm_a[layer](h)
        h = h + d.attn[layer](a, a, a, attn_mask=mask, need_weights=False)[0]
        f = d.norm_f[layer](h).reshape(-1, model.D)
        w, ids = F.softmax(d.router[layer](f), dim=-1).topk(model.TOPK, dim=-1)
        w = w / w.sum(-1, keepdim=True)
        owner = net.owner(ids.reshape(-1))
        out, _ = a2a_layer(f, ids, w, net.expert(layer), owner, None)
        h = h + out.reshape(h.shape)
    loss = F.cross_entropy(d.head(h).reshape(-1, model.VOCAB), y.reshape(-1)) * scale
    opt.zero_grad(set_to_none=False)
    loss.backward()
    for p in net.parameters():  # an expert no token reached: a zero gradient, as after any other step
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    dense = list(d.parameters())
    flat = torch.cat([p.grad.reshape(-1) for p in dense] + [loss.detach().reshape(1)])
    dist.all_reduce(flat)
    at = 0
    for p in dense:
        p.grad.copy_(flat[at:at + p.numel()].view_as(p) / world)
        at += p.numel()
    for p in net.experts.parameters():  # each expert's one replica: the sum over ranks came through the exchange
        p.grad.div_(world)
    opt.step()
    return float(flat[at]) / world


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--step-ms", type=float, default=100)
    ap.add_argument("--events", required=True)
    ap.add_argument("--ckpt-dir")
    ap.add_argument("--ckpt-every", type=int, default=0)
    ap.add_argument("--pg-timeout-s", type=float, default=30)
    args = ap.parse_args()
    torch.set_num_threads(1)
    events = Events(args.events)
    events("start", restart=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)), role="rank")
    init_restarted_gloo(args.pg_timeout_s)
    rank, world = dist.get_rank(), dist.get_world_size()
    net, opt = build(rank, world)
    ckpt = Checkpoints(args.ckpt_dir, args.ckpt_every, events, args.pg_timeout_s) if args.ckpt_dir else None
    step = ckpt.load(net, opt) if ckpt else 0
    events("ready", rank=rank, world=world, step=step)
    rows = torch.tensor_split(torch.arange(model.GLOBAL_SEQUENCES), world)[rank].numel()
    loss = float("nan")
    while step < args.steps:
        started = time.monotonic()
        loss = train_step(net, opt, step)
        step += 1
        events("step", rank=rank, world=world, step=step, loss=loss, loss_sum=loss * rows, rows=rows)
        if ckpt:
            ckpt.maybe_save(net, opt, step)
        time.sleep(max(0.0, args.step_ms / 1000 - (time.monotonic() - started)))
    if ckpt:
        ckpt.finish()
    events("done", rank=rank, world=world, step=step, loss=loss, digest=digest(net), loss_sum=loss * rows, rows=rows)
    dist.destroy_process_group()


def digest(net: Layer) -> str:
    """The whole model's digest, the same on every rank: the dense part and
    every rank's experts, gathered."""
    mine = {e: model.digest(list(net.experts[f"e{e}"])) for e in net.mine}
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine)
    experts = sorted((e, d) for held in gathered for e, d in held.items())
    text = json.dumps([model.digest(list(net.dense.parameters())), experts])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


if __name__ == "__main__":
    main()
