#!/usr/bin/env python3
"""One MoE layer step (dispatch, experts, combine; forward and backward)
through torch_eccl.moe against the layer as users build it today, on the
same routing, in the same processes, alternating:

  eccl        torch_eccl.moe: uneven replicas (the planner's), local first,
              no padding; the backward along the forward's plan
  a2a-eccl    Megatron's all-to-all dispatcher: one replica per expert,
              counts exchanged, all_to_all_single with splits (eccl backend)
  a2a-gloo    the same over Gloo
  eplb        EPLB-style redundant experts: eccl's replica table, each
              expert's tokens dealt to its replicas round robin (no local
              first), all_to_all_single (eccl backend)
  padded      expert parallelism padded to the busiest (rank, expert) chunk
              (eccl backend)

Every contender computes the same function; the script checks each one's
output and input gradient against eccl's before timing. Each round times
every contender for --steps steps (median); the figure is the median of
--rounds rounds, spread min-max beside it. "MB crossing" is what crosses
between ranks in the step's four exchanges (dispatch and combine, forward
and backward), summed over ranks: rows a rank keeps for its own replicas
do not cross.

usage: perf/moe_bench.py [--ranks 4] [--tokens 2048] [--hidden 256] [--experts 16] [--topk 2]
                         [--routing zipf1.2,uniform] [--rounds 5] [--steps 10] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dnn
import warnings

warnings.filterwarnings("ignore", category=FutureWarning)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python", "tests"))
import world  # noqa: E402


def routing(kind, rank, tokens, experts, k, seed=0):
    g = torch.Generator().manual_seed(seed * 1000 + rank)
    if kind == "uniform":
        p = torch.ones(experts)
    else:
        s = float(kind.removeprefix("zipf"))
        p = 1.0 / torch.arange(1, experts + 1, dtype=torch.float64) ** s
    ids = torch.stack([torch.multinomial(p, k, replacement=False, generator=g) for _ in range(tokens)])
    w = torch.rand(tokens, k, generator=g)
    return ids, w / w.sum(-1, keepdim=True)


class _Accelerated(torch.autograd.Function):
    # An expert on an accelerator of its own: the host only waits (forward
    # us_per_row per row, backward twice that), so ranks sharing this
    # machine's cores do not share their experts' time.
    @staticmethod
    def forward(ctx, rows, scale, us_per_row):
        ctx.save_for_backward(scale)
        ctx.wait = 2 * us_per_row * rows.shape[0] * 1e-6
        time.sleep(us_per_row * rows.shape[0] * 1e-6)
        return rows * scale

    @staticmethod
    def backward(ctx, grad):
        (scale,) = ctx.saved_tensors
        time.sleep(ctx.wait)
        return grad * scale, None, None


class Experts:
    """One expert per id, the same on every rank: a matrix on the host
    (--expert host), or an accelerator modelled by its time per row."""

    def __init__(self, experts, hidden, us_per_row):
        g = torch.Generator().manual_seed(3)
        self.us = us_per_row
        self.w = [(torch.randn(hidden, hidden, generator=g) / hidden**0.5).requires_grad_(True) for _ in range(experts)]
        self.scale = [torch.tensor(1.0 + 0.1 * e) for e in range(experts)]

    def __call__(self, e, rows):
        if self.us > 0:
            return _Accelerated.apply(rows, self.scale[e], self.us)
        return torch.relu(rows @ self.w[e])


def by_destination(ids, dest_of_choice, world_size):
    """Permutation of the (token, choice) pairs sorted by destination rank
    then expert, and the rows per destination."""
    flat_ids = ids.reshape(-1)
    valid = (flat_ids >= 0).nonzero().flatten()
    key = dest_of_choice[valid] * 1_000_000 + flat_ids[valid]
    order = valid[torch.argsort(key, stable=True)]
    splits = torch.bincount(dest_of_choice[valid], minlength=world_size).tolist()
    return order, splits


def a2a_layer(x, ids, w, experts, dest_of_choice, group):
    """Megatron's dispatcher (dest: the expert's owner) or EPLB's (dest: a
    replica round robin): permute, exchange counts, exchange rows,
    group by expert, run, reverse."""
    n = dist.get_world_size(group)
    k = ids.shape[1]
    order, splits = by_destination(ids, dest_of_choice, n)
    send = x[order // k]
    send_experts = ids.reshape(-1)[order]
    me = dist.get_rank(group)
    crossing = (sum(splits) - splits[me]) * x.shape[1] * 4
    counts = torch.tensor(splits, dtype=torch.long)
    recv_counts = torch.empty_like(counts)
    dist.all_to_all_single(recv_counts, counts, group=group)
    recv_splits = recv_counts.tolist()
    expert_of = torch.empty(sum(recv_splits), dtype=torch.long)
    dist.all_to_all_single(expert_of, send_experts, recv_splits, splits, group=group)
    recv = dnn.all_to_all_single(torch.empty(sum(recv_splits), x.shape[1]), send, recv_splits, splits, group=group)
    pieces = []
    for e in expert_of.unique().tolist():
        rows = (expert_of == e).nonzero().flatten()
        pieces.append((rows, experts(e, recv[rows])))
    out = torch.zeros(recv.shape[0], x.shape[1]).index_put((torch.cat([r for r, _ in pieces]),),
                                                           torch.cat([o for _, o in pieces])) if pieces else recv * 0
    back = dnn.all_to_all_single(torch.empty(send.shape[0], x.shape[1]), out, splits, recv_splits, group=group)
    per_choice = torch.zeros(ids.numel(), x.shape[1]).index_put((order,), back)
    return (w.unsqueeze(-1) * per_choice.view(ids.shape[0], k, -1)).sum(1), crossing


def padded_layer(x, ids, w, experts, owner, group):
    """Every (rank, expert) chunk padded to the busiest one across ranks."""
    n = dist.get_world_size(group)
    E = owner.numel()
    per_rank = E // n
    k = ids.shape[1]
    flat = ids.reshape(-1)
    counts = torch.bincount(flat[flat >= 0], minlength=E)
    cap = counts.clone()
    dist.all_reduce(cap, op=dist.ReduceOp.MAX, group=group)
    C = int(cap.max())
    slot = torch.full((E * C,), -1, dtype=torch.long)
    order = torch.argsort(flat * (flat >= 0) + (flat < 0) * E, stable=True)[:int((flat >= 0).sum())]
    pos = torch.arange(order.numel()) - torch.repeat_interleave(torch.cumsum(counts, 0) - counts, counts)
    slot[flat[order] * C + pos] = order
    used = slot >= 0
    send = torch.zeros(E * C, x.shape[1])
    send = send.index_put((used.nonzero().flatten(),), x[slot[used] // k])
    recv = dnn.all_to_all_single(torch.empty_like(send), send, group=group)
    # recv: from each source rank, its chunk for each of my experts, C rows each.
    r = recv.view(n, per_rank, C, -1)
    me = dist.get_rank(group)
    outs = torch.stack([experts(me * per_rank + q, r[:, q].reshape(n * C, -1)).view(n, C, -1)
                        for q in range(per_rank)], dim=1)
    back = dnn.all_to_all_single(torch.empty_like(send), outs.reshape(E * C, -1), group=group)
    per_choice = torch.zeros(ids.numel(), x.shape[1]).index_put((slot[used],), back[used])
    return (w.unsqueeze(-1) * per_choice.view(ids.shape[0], k, -1)).sum(1), send.numel() * 4 * (n - 1) // n


def _bench(rank, n, port, args):
    import torch_eccl  # noqa: F401
    import torch_eccl.moe as moe

    torch.set_num_threads(1)
    world.init(rank, n, port)
    gloo = dist.new_group(backend="gloo")
    E, H, T, k = args.experts, args.hidden, args.tokens, args.topk
    experts = Experts(E, H, args.expert_us_per_row)
    results = {}
    for kind in args.routing.split(","):
        ids, w = routing(kind, rank, T, E, k)
        x = torch.randn(T, H, generator=torch.Generator().manual_seed(rank))
        load = torch.bincount(ids.flatten(), minlength=E).double()
        dist.all_reduce(load)
        reps = moe.allocate_replicas(load.tolist(), n, 2 * E // n, 1)
        placement = moe.place(reps, n, 2 * E // n)
        table = moe.table_from_placement(placement, E)
        owner = torch.arange(E) // (E // n)
        flat = ids.reshape(-1)
        dest_megatron = owner[flat]
        # EPLB: the c-th choice of expert e on this rank goes to replica (rank + c) mod R_e.
        holders = [[j for j in range(n) for _ in range(int(table[e, j]))] for e in range(E)]
        seen = torch.zeros(E, dtype=torch.long)
        dest_eplb = torch.empty_like(flat)
        for i, e in enumerate(flat.tolist()):
            dest_eplb[i] = holders[e][(rank + int(seen[e])) % len(holders[e])]
            seen[e] += 1

        def eccl_step():
            xs = x.clone().requires_grad_(True)
            inputs, handle = moe.dispatch(xs, ids, table)
            outs = [experts(e, rows) for e, rows in zip(handle.local_experts, inputs)]
            y = moe.combine(outs, w, handle)
            y.backward(torch.ones_like(y))
            return y, xs.grad, handle.stats()["rows_sent"] * H * 4

        def a2a(dest, group):
            def step():
                xs = x.clone().requires_grad_(True)
                y, sent = a2a_layer(xs, ids, w, experts, dest, group)
                y.backward(torch.ones_like(y))
                return y, xs.grad, sent
            return step

        def padded_step():
            xs = x.clone().requires_grad_(True)
            y, sent = padded_layer(xs, ids, w, experts, owner, None)
            y.backward(torch.ones_like(y))
            return y, xs.grad, sent

        contenders = {"eccl": eccl_step, "a2a-eccl": a2a(dest_megatron, None), "a2a-gloo": a2a(dest_megatron, gloo),
                      "eplb": a2a(dest_eplb, None), "padded": padded_step}
        ref_y, ref_g, _ = eccl_step()
        for name, step in contenders.items():
            y, g, _ = step()
            if not (torch.allclose(y, ref_y, rtol=1e-4, atol=1e-4) and torch.allclose(g, ref_g, rtol=1e-4, atol=1e-4)):
                raise RuntimeError(f"{name} computes another function than eccl on rank {rank} ({kind})")
        rounds = {name: [] for name in contenders}
        moved = {}
        for _ in range(args.rounds):
            for name, step in contenders.items():
                times = []
                for _ in range(args.steps):
                    dist.barrier()
                    t0 = time.perf_counter()
                    _, _, sent = step()
                    times.append(time.perf_counter() - t0)
                t = torch.tensor([statistics.median(times)])
                dist.all_reduce(t, op=dist.ReduceOp.MAX)  # the step ends with the slowest rank
                rounds[name].append(float(t))
                b = torch.tensor([float(sent)])
                dist.all_reduce(b)
                moved[name] = float(b) * 4  # dispatch and combine, forward and backward
        results[kind] = {"rounds": rounds, "bytes": moved, "replicas": reps}
    dist.destroy_process_group()
    return results


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--topk", type=int, default=2)
    ap.add_argument("--routing", default="zipf1.2,uniform")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--expert-us-per-row", type=float, default=2.0,
                    help="model each rank's experts as an accelerator of its own taking this long per row "
                         "(0: a matrix product on the host, which ranks sharing cores then share)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    out = world.run(args.ranks, _bench, args, timeout=3600, env={"ECCL_SOCKET_IFNAME": "lo"})
    if any(o.status != "ok" for o in out):
        sys.exit(f"moe_bench: a rank failed: {out}")
    res = out[0].value
    if args.json:
        print(json.dumps(res))
        return
    experts = (f"experts modelled at {args.expert_us_per_row} us/row forward, twice that backward"
               if args.expert_us_per_row > 0 else "experts: relu(rows @ W) on the host")
    print(f"# MoE layer step, forward + backward: {args.ranks} ranks, {args.tokens} tokens/rank, hidden "
          f"{args.hidden}, {args.experts} experts, top-{args.topk}; {experts}; medians of {args.rounds} "
          f"alternating rounds of {args.steps} steps")
    for kind, r in res.items():
        med = {name: statistics.median(v) for name, v in r["rounds"].items()}
        best_other = min(v for name, v in med.items() if name != "eccl")
        print(f"\n## routing {kind} (replicas per expert: {r['replicas']})")
        print(f"{'contender':>10} {'ms/step':>9} {'min':>8} {'max':>8} {'MB crossing':>11} {'eccl speedup':>12}")
        for name, v in r["rounds"].items():
            print(f"{name:>10} {med[name] * 1e3:>9.2f} {min(v) * 1e3:>8.2f} {max(v) * 1e3:>8.2f} "
                  f"{r['bytes'][name] / 1e6:>11.2f} {med[name] / med['eccl']:>11.2f}x")
        print(f"eccl against the best other: {best_other / med['eccl']:.2f}x")


if __name__ == "__main__":
    main()
