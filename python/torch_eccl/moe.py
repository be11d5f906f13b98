"""Mixture-of-Experts through eccl's dispatcher, with autograd.

Experts may have uneven numbers of replicas on arbitrary ranks (several on
one rank allowed): ``replicas`` is the ``[experts, world]`` table of
replica counts, equal on every rank. ``dispatch`` sends each token's row to
one replica of each expert it chose (balanced over the replicas, local
ones first, no padding); the experts run on ``handle.local_experts``;
``combine`` brings their outputs back and sums them with the router's
weights. Both are differentiable: the backward passes follow the forward's
plan (no new counts are exchanged)::

    inputs, handle = moe.dispatch(x, topk_ids, replicas)
    outputs = [experts[e](rows) for e, rows in zip(handle.local_experts, inputs)]
    y = moe.combine(outputs, topk_weights, handle)
    y.sum().backward()
    moe.reduce_replica_grads({e: [p.grad ...] ...}, replicas)

See docs/moe.md.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
import torch.distributed as dist

from . import _C, backend

__all__ = ["Handle", "dispatch", "combine", "reduce_replica_grads", "replica_table", "allocate_replicas", "place",
           "recovery_probability", "spread_over_hosts", "plan_migration", "table_from_placement", "move_experts", "PLACEMENTS"]


class Handle:
    """One dispatch's plan: which experts run here (``local_experts``, one
    entry per local replica: an expert with two replicas here is listed
    twice, each with its share of the rows), their row counts, and what combine
    and the backward passes follow. Valid in the view it was made in."""

    def __init__(self, plan, replicas: torch.Tensor, rank: int, group):
        self._plan = plan
        self.replicas = replicas
        self.group = group
        # eccl gives a rank one block per expert it hosts, sized to the sum
        # of its replicas' quotas; the quotas of consecutive replicas differ
        # by at most one, the larger first, so an even split (larger parts
        # first) is each replica's share.
        self.local_experts: list[int] = []
        self.expert_rows: list[int] = []
        for e, rows in zip(plan.local_experts, plan.expert_rows):
            count = int(replicas[e, rank])
            share, extra = divmod(int(rows), count)
            for i in range(count):
                self.local_experts.append(int(e))
                self.expert_rows.append(share + (i < extra))
        self.tokens: int = plan.tokens
        self.topk: int = plan.topk
        self.epoch: int = plan.epoch

    def stats(self) -> dict:
        """Rows this dispatch sent to and received from other ranks, and kept
        here (routed to a local replica, never sent)."""
        return dict(self._plan.stats())

    def __repr__(self) -> str:
        return (f"moe.Handle(local_experts={self.local_experts}, expert_rows={self.expert_rows}, "
                f"tokens={self.tokens}, topk={self.topk}, epoch={self.epoch})")


def replica_table(replicas, world: int) -> torch.Tensor:
    """``replicas`` as a ``[experts, world]`` int32 CPU tensor, checked."""
    t = torch.as_tensor(replicas).to("cpu", torch.int32)
    if t.dim() != 2 or t.shape[1] != world:
        raise ValueError(f"torch_eccl.moe: replicas must be [experts, world] = [E, {world}], got {tuple(t.shape)}")
    if t.numel() and int(t.min()) < 0:
        e, j = (t < 0).nonzero()[0].tolist()
        raise ValueError(f"torch_eccl.moe: replicas[{e}][{j}] is {int(t[e, j])}, a count cannot be negative")
    return t.contiguous()


class _Dispatch(torch.autograd.Function):
    # Forward: the rows the dispatch brought; backward: each choice's
    # gradient back to its token along the same plan, summed over choices.
    @staticmethod
    def forward(ctx, x, handle):
        ctx.handle = handle
        return handle._plan.rows

    @staticmethod
    def backward(ctx, grad):
        per_choice = ctx.handle._plan.combine(grad.contiguous(), None)
        return per_choice.sum(dim=1), None


class _ChoiceRows(torch.autograd.Function):
    # Forward: each choice's expert output at its token ([tokens, k, hidden]);
    # backward: each choice's gradient to the row it came from.
    @staticmethod
    def forward(ctx, expert_rows, handle):
        ctx.handle = handle
        return handle._plan.combine(expert_rows.contiguous(), None)

    @staticmethod
    def backward(ctx, grad):
        return ctx.handle._plan.dispatch_along(grad.contiguous(), True), None


def dispatch(x: torch.Tensor, topk_ids: torch.Tensor, replicas, group: dist.ProcessGroup | None = None):
    """Collective. ``x``: ``[tokens, hidden]``; ``topk_ids``: ``[tokens, k]``
    int32 or int64 expert ids, -1 for none. Returns ``(expert_inputs,
    handle)``: one tensor per local replica, in ``handle.local_experts``
    order, differentiable with respect to ``x``."""
    if not isinstance(x, torch.Tensor) or not isinstance(topk_ids, torch.Tensor):
        raise TypeError("torch_eccl.moe.dispatch: x and topk_ids must be tensors")
    pg = backend(group)
    table = replica_table(replicas, pg.size())
    plan = pg.moe_dispatch(x.detach(), topk_ids.detach(), table)
    handle = Handle(plan, table, pg.rank(), group)
    rows = _Dispatch.apply(x, handle)
    return list(rows.split(handle.expert_rows)), handle


def combine(expert_outputs, topk_weights: torch.Tensor, handle: Handle) -> torch.Tensor:
    """Collective. ``expert_outputs``: one tensor per local replica (the
    shapes of ``dispatch``'s inputs), or one tensor of all their rows.
    Returns ``y[t] = sum_k topk_weights[t, k] * expert_k(x[t])``,
    differentiable in the expert outputs and in ``topk_weights``."""
    if not isinstance(handle, Handle):
        raise TypeError(f"torch_eccl.moe.combine: handle must come from dispatch, got {type(handle).__name__}")
    if isinstance(expert_outputs, torch.Tensor):
        flat = expert_outputs
    else:
        outs = list(expert_outputs)
        if len(outs) != len(handle.local_experts):
            raise ValueError(f"torch_eccl.moe.combine: {len(outs)} expert outputs for "
                             f"{len(handle.local_experts)} local replicas (experts {handle.local_experts})")
        for q, (o, rows) in enumerate(zip(outs, handle.expert_rows)):
            if o.dim() != 2 or o.shape[0] != rows:
                raise ValueError(f"torch_eccl.moe.combine: the output of local replica {q} (expert "
                                 f"{handle.local_experts[q]}) has shape {tuple(o.shape)}, expected [{rows}, hidden]")
        flat = torch.cat(outs) if outs else None
        if flat is None:
            raise ValueError("torch_eccl.moe.combine: no local replicas; pass the empty tensor of dispatch's rows")
    if tuple(topk_weights.shape) != (handle.tokens, handle.topk):
        raise ValueError(f"torch_eccl.moe.combine: topk_weights has shape {tuple(topk_weights.shape)}, expected "
                         f"[{handle.tokens}, {handle.topk}]")
    needs_grad = torch.is_grad_enabled() and (flat.requires_grad or topk_weights.requires_grad)
    if not needs_grad and flat.dtype in (torch.float32, torch.float16, torch.bfloat16):
        # Inference: the weighted sum in eccl, no per-choice rows.
        return handle._plan.combine(flat.contiguous(), topk_weights.detach())
    per_choice = _ChoiceRows.apply(flat, handle)
    return (topk_weights.to(per_choice.dtype).unsqueeze(-1) * per_choice).sum(dim=1)


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def _exchange_bytes(send: dict[int, list[torch.Tensor]], recv_bytes: dict[int, list[int]], world: int, device,
                    group) -> dict[int, list[torch.Tensor]]:
    """One all-to-all of byte tensors: send[j] goes to rank j in order;
    recv_bytes[j] are the sizes expected from rank j, returned as views."""
    in_splits = [sum(t.numel() for t in send.get(j, [])) for j in range(world)]
    out_splits = [sum(recv_bytes.get(j, [])) for j in range(world)]
    parts = [t for j in range(world) for t in send.get(j, [])]
    inp = torch.cat(parts) if parts else torch.empty(0, dtype=torch.uint8, device=device)
    out = torch.empty(sum(out_splits), dtype=torch.uint8, device=device)
    dist.all_to_all_single(out, inp, out_splits, in_splits, group=group)
    got, at = {}, 0
    for j in range(world):
        got[j] = []
        for n in recv_bytes.get(j, []):
            got[j].append(out[at:at + n])
            at += n
    return got


def reduce_replica_grads(grads_by_expert: Mapping[int, Sequence[torch.Tensor]], replicas,
                         group: dist.ProcessGroup | None = None) -> None:
    """Collective over the group, one call for all experts: afterwards each
    tensor in ``grads_by_expert[e]`` (this rank's replicas of expert ``e``;
    a rank may hold several, or one tensor when its replicas share their
    parameters, autograd having summed them) holds expert ``e``'s sum over all its replicas
    on all ranks, the same bits on every holder. Ranks holding no replica
    of an expert still call it. Each expert's sum is made by one of its
    holders (its "home") in rank order and sent back: two exchanges, each
    holder sending and receiving one copy of what it holds."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    table = replica_table(replicas, world)
    experts = table.shape[0]
    grads: dict[int, list[torch.Tensor]] = {}
    for e, ts in grads_by_expert.items():
        e = int(e)
        if not 0 <= e < experts:
            raise ValueError(f"torch_eccl.moe.reduce_replica_grads: expert {e} is outside [0, {experts})")
        ts = [ts] if isinstance(ts, torch.Tensor) else list(ts)
        if len(ts) != int(table[e, rank]) and not (len(ts) == 1 and int(table[e, rank]) > 1):
            raise ValueError(f"torch_eccl.moe.reduce_replica_grads: expert {e} has {int(table[e, rank])} replicas on "
                             f"rank {rank} by the table, {len(ts)} gradients given (one per replica, or one when "
                             f"they share parameters)")
        for t in ts[1:]:
            if t.shape != ts[0].shape or t.dtype != ts[0].dtype:
                raise ValueError(f"torch_eccl.moe.reduce_replica_grads: expert {e}'s gradients differ in shape or "
                                 f"dtype ({tuple(ts[0].shape)} {ts[0].dtype} and {tuple(t.shape)} {t.dtype})")
        if ts:
            grads[e] = ts
    for e in range(experts):
        if int(table[e, rank]) > 0 and e not in grads:
            raise ValueError(f"torch_eccl.moe.reduce_replica_grads: rank {rank} holds {int(table[e, rank])} "
                             f"replicas of expert {e} but no gradients for it were given")
    holders = [table[e].nonzero().flatten().tolist() for e in range(experts)]
    home = [h[e % len(h)] if h else -1 for e, h in enumerate(holders)]
    mine = sorted(grads)
    # This rank's partial sum per expert, its replicas in order.
    partial = {}
    for e in mine:
        acc = grads[e][0].detach().clone()
        for t in grads[e][1:]:
            acc += t
        partial[e] = acc
    device = grads[mine[0]][0].device if mine else torch.device("cpu")

    def exchange(send, recv_bytes):
        return _exchange_bytes(send, recv_bytes, world, device, group)

    # Round 1: holders send their partial sums to the expert's home.
    send1: dict[int, list[torch.Tensor]] = {}
    recv1: dict[int, list[int]] = {}
    homed = [e for e in mine if home[e] == rank]
    for e in mine:
        if home[e] != rank:
            send1.setdefault(home[e], []).append(_as_bytes(partial[e]))
    for j in range(world):
        for e in homed:
            if j != rank and j in holders[e]:
                recv1.setdefault(j, []).append(_as_bytes(partial[e]).numel())
    got1 = exchange(send1, recv1)
    cursor = {j: 0 for j in range(world)}
    total = {}
    for e in homed:
        acc = None
        for j in holders[e]:
            if j == rank:
                part = partial[e]
            else:
                part = got1[j][cursor[j]].view(partial[e].dtype).view(partial[e].shape)
                cursor[j] += 1
            acc = part.clone() if acc is None else acc.add_(part)
        total[e] = acc
    # Round 2: each home sends the total back to the other holders.
    send2: dict[int, list[torch.Tensor]] = {}
    recv2: dict[int, list[int]] = {}
    for e in homed:
        for j in holders[e]:
            if j != rank:
                send2.setdefault(j, []).append(_as_bytes(total[e]))
    for e in mine:
        if home[e] != rank:
            recv2.setdefault(home[e], []).append(_as_bytes(partial[e]).numel())
    got2 = exchange(send2, recv2)
    cursor = {j: 0 for j in range(world)}
    for e in mine:
        if home[e] != rank:
            j = home[e]
            total[e] = got2[j][cursor[j]].view(partial[e].dtype).view(partial[e].shape)
            cursor[j] += 1
        for t in grads[e]:
            t.copy_(total[e])


# Lazarus's planner (docs/moe.md "Placement"). A placement is one list of
# expert ids per node (rank); an expert may appear on a node more than once.
PLACEMENTS = {"max_overlap": 0, "spread": 1, "compact": 2}


def allocate_replicas(load, nodes: int, slots_per_node: int, min_replicas: int = 1) -> list[int]:
    """Replicas per expert from its observed load (tokens routed to it):
    ``nodes * slots_per_node`` in all, at least ``min_replicas`` each."""
    return list(_C.moe_allocate_replicas([float(v) for v in load], nodes, slots_per_node, min_replicas))


def place(replicas, nodes: int, slots_per_node: int, policy: str = "max_overlap",
          hosts: Sequence | None = None) -> list[list[int]]:
    """Which node holds which replicas. "max_overlap" (Lazarus) keeps the
    number of node sets whose failure loses an expert small; "spread" and
    "compact" are the baselines. ``hosts`` (one label per node: the
    machine it runs on) makes a machine the unit of failure, as Lazarus
    places across machines: replicas are then swapped between nodes until
    every expert sits on as many machines as it can (its replicas, at most
    the machines there are), so no machine takes every replica of one."""
    if policy not in PLACEMENTS:
        raise ValueError(f"torch_eccl.moe.place: policy {policy!r} is not one of {sorted(PLACEMENTS)}")
    placement = [list(n) for n in _C.moe_place([int(r) for r in replicas], nodes, slots_per_node, PLACEMENTS[policy])]
    if hosts is not None:
        if len(hosts) != nodes:
            raise ValueError(f"torch_eccl.moe.place: {len(hosts)} hosts given for {nodes} nodes (one per node)")
        spread_over_hosts(placement, hosts)
    return placement


def spread_over_hosts(placement: list[list[int]], hosts: Sequence) -> list[list[int]]:
    """Repairs ``placement`` (in place; returned) so that every expert sits
    on as many machines as fit, ``hosts`` giving each node's machine: what
    ``place(..., hosts=)`` does, for a placement whose nodes were mapped
    onto ranks since (``plan_migration`` keeps experts in place, not
    machines). Each swap moves a replica of an expert from a machine holding it
    twice or more to a machine without it, taking back a replica whose
    machines stay as many: the sum of the experts' machine counts grows
    by one with each, so the loop ends. Deterministic (node and expert
    order), so every rank that plans gets the same placement."""
    host_of = list(hosts)
    if len(host_of) != len(placement):
        raise ValueError(f"torch_eccl.moe.spread_over_hosts: {len(host_of)} hosts given for {len(placement)} nodes")
    machines = len(set(host_of))
    if machines < 2:
        return placement

    def copies_by_host(e):
        counts = {}
        for n, held in enumerate(placement):
            counts[host_of[n]] = counts.get(host_of[n], 0) + held.count(e)
        return {h: c for h, c in counts.items() if c}

    experts = sorted({e for held in placement for e in held})
    swapped = True
    while swapped:
        swapped = False
        for e in experts:
            have = copies_by_host(e)
            if len(have) >= min(sum(have.values()), machines):
                continue
            swap = _find_swap(placement, host_of, e, have, copies_by_host)
            if swap:
                a, i, b, j = swap
                placement[a][i], placement[b][j] = placement[b][j], placement[a][i]
                swapped = True
    return placement


def _find_swap(placement, host_of, e, have, copies_by_host):
    # First without giving a node a second replica of an expert; then, where
    # the node giving one up holds it twice (an expert with more replicas
    # than there are nodes), with.
    for strict in (True, False):
        for a, held_a in enumerate(placement):
            if e not in held_a or have[host_of[a]] < 2:
                continue
            for b, held_b in enumerate(placement):
                if host_of[b] in have:
                    continue
                for j, f in enumerate(held_b):
                    if f in held_a and (strict or held_b.count(f) < 2):
                        continue
                    f_have = copies_by_host(f)
                    if f_have[host_of[b]] == 1 and host_of[a] in f_have:
                        continue  # f would lose a machine
                    return a, held_a.index(e), b, j
    return None


def recovery_probability(placement, experts: int, failures: int, seed: int = 1, hosts: Sequence | None = None) -> dict:
    """Probability that every expert keeps a replica after ``failures``
    random nodes fail (with ``hosts``, one label per node: ``failures``
    random machines, every node on them): exact, or a seeded estimate with
    its 95% interval."""
    if hosts is not None:
        if len(hosts) != len(placement):
            raise ValueError(f"torch_eccl.moe.recovery_probability: {len(hosts)} hosts given for "
                             f"{len(placement)} nodes (one per node)")
        merged = {}
        for n, held in enumerate(placement):
            merged.setdefault(hosts[n], []).extend(held)
        placement = list(merged.values())
    slots = max((len(n) for n in placement), default=1)
    return dict(_C.moe_recovery_probability([list(map(int, n)) for n in placement], slots, experts, failures, seed))


def plan_migration(current, failed, target, experts: int):
    """From ``current`` (node -> experts, failed nodes included) to
    ``target`` (one plan node per surviving node): ``(plan_to_node,
    transfers)``, plan node p going to node ``plan_to_node[p]`` and each
    transfer ``(expert, from_node, to_node)`` a copy of an expert's state
    from a surviving owner. An expert with no surviving owner raises
    ValueError naming it."""
    slots = max(max((len(n) for n in current), default=1), max((len(n) for n in target), default=1))
    plan_to_node, transfers = _C.moe_plan_migration([list(map(int, n)) for n in current], [int(f) for f in failed],
                                                    [list(map(int, n)) for n in target], slots, experts)
    return list(plan_to_node), [tuple(t) for t in transfers]


def table_from_placement(placement, experts: int) -> torch.Tensor:
    """The ``[experts, nodes]`` replica-count table dispatch takes."""
    t = torch.zeros(experts, len(placement), dtype=torch.int32)
    for node, held in enumerate(placement):
        for e in held:
            t[e, node] += 1
    return t


def move_experts(state: Mapping[int, Sequence[torch.Tensor]], transfers, template,
                 group: dist.ProcessGroup | None = None) -> dict[int, list[torch.Tensor]]:
    """Collective, one exchange: for each ``(expert, from_rank, to_rank)``
    (ranks of ``group``), ``from_rank`` sends ``state[expert]`` (its tensors:
    weights, optimizer state) and ``to_rank`` receives it into
    ``template(expert)`` (tensors of the same shapes and dtypes). Returns
    what this rank received, by expert."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    send: dict[int, list[torch.Tensor]] = {}
    recv: dict[int, list[tuple[int, list[torch.Tensor]]]] = {}
    for e, src, dst in transfers:
        if src == rank:
            if e not in state:
                raise ValueError(f"torch_eccl.moe.move_experts: rank {rank} is to send expert {e}, which it lacks")
            send.setdefault(dst, []).extend(_as_bytes(t) for t in state[e])
        if dst == rank:
            recv.setdefault(src, []).append((e, list(template(e))))
    device = next((t.device for ts in state.values() for t in ts), torch.device("cpu"))
    sizes = {j: [t.numel() * t.element_size() for _, ts in items for t in ts] for j, items in recv.items()}
    got_bytes = _exchange_bytes(send, sizes, world, device, group)
    got = {}
    for j, items in recv.items():
        pieces = iter(got_bytes[j])
        for e, ts in items:
            for t in ts:
                t.copy_(next(pieces).view(t.dtype).view(t.shape))
            got[e] = ts
    return got
