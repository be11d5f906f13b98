"""A one-process MoE layer computing the sums torch_eccl.moe computes over
ranks, and the routings the tests and the benchmark draw. Experts are
affine maps (``x @ W[e] + b[e]``), identical on every replica."""

from __future__ import annotations

import torch


def experts_params(experts: int, hidden: int, dtype, seed: int = 7):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(experts, hidden, hidden, generator=g, dtype=torch.float64).to(dtype) / hidden**0.5
    b = torch.randn(experts, hidden, generator=g, dtype=torch.float64).to(dtype)
    return w, b


def routing(case: str, rank: int, tokens: int, k: int, experts: int, hidden: int, dtype, seed: int = 0):
    """(x, topk_ids, topk_weights) of one rank for a named case."""
    g = torch.Generator().manual_seed(1000 * seed + 17 * rank + len(case))
    x = torch.randn(tokens, hidden, generator=g, dtype=torch.float64).to(dtype)
    if case == "one_expert":
        ids = torch.full((tokens, k), -1, dtype=torch.int64)
        ids[:, 0] = 1
    elif case == "skewed":
        # Zipf-like: low ids far more often; experts >= experts-2 never.
        p = 1.0 / torch.arange(1, experts - 1, dtype=torch.float64) ** 1.2
        ids = torch.stack([torch.multinomial(p, k, replacement=False, generator=g) for _ in range(tokens)])
    else:  # "random": distinct choices, some -1, the last expert never chosen
        ids = torch.stack([torch.randperm(experts - 1, generator=g)[:k] for _ in range(tokens)])
        ids[torch.rand(tokens, k, generator=g) < 0.15] = -1
    ids = ids.to(torch.int32 if rank % 2 else torch.int64)
    w = torch.rand(tokens, k, generator=g, dtype=torch.float64).to(torch.float32)
    return x, ids, w


def replica_table(case: str, experts: int, world: int, seed: int = 0) -> torch.Tensor:
    """[experts, world] counts: uneven, several on one rank, and the last
    expert (never routed to) with none."""
    g = torch.Generator().manual_seed(99 + seed + world)
    t = torch.zeros(experts, world, dtype=torch.int32)
    for e in range(experts - 1):
        for _ in range(1 + int(torch.randint(0, 3, (1,), generator=g))):
            t[e, int(torch.randint(0, world, (1,), generator=g))] += 1
    return t


def layer(x, ids, w, W, b):
    """y[t] = sum_k w[t,k] * (x[t] @ W[e] + b[e]) over choices e = ids[t,k] >= 0."""
    ids = ids.long()
    valid = ids >= 0
    e = ids.clamp(min=0)
    out = torch.einsum("th,tkhg->tkg", x, W[e]) + b[e]
    return ((w.to(x.dtype) * valid).unsqueeze(-1) * out).sum(dim=1)
