"""A small MoE transformer language model trained on eccl's dispatcher,
surviving a rank's death with a standby or, with none left, by shrinking
and re-placing the experts (Lazarus).

Every rank holds the dense part (embedding, attention, router, head;
gradients all-reduced) and SLOTS expert slots; experts have uneven
numbers of replicas from the planner (at least MIN_REPLICAS each, placed
so one failure never loses an expert). Tokens go to the experts through
torch_eccl.moe (dispatch, combine, and the replicas' gradient sums).
Every REBALANCE steps the placement follows the observed load: the same
move a failure takes.

When a collective fails the survivors call recover("replace_or_shrink"):
- a standby was left: it takes the dead rank's number; everyone goes back
  to the last step all completed, the newcomer receives the dense state
  from a survivor and its experts from their surviving replicas; training
  ends bit-equal to a failure-free run;
- none was left: the survivors are renumbered, plan a placement for the
  ranks that remain, copy the experts (weights and Adam state) each now
  needs from a surviving replica, and train on with every rank busy.

Every step each rank also puts its experts into a peer-memory snapshot
(torch_eccl.snapshot, replicated to the next rank in the background). An
expert whose every replica died (--min-replicas 1 lets the planner leave
cold experts with one) comes back from the copy a survivor holds, as of
the last committed snapshot (one step behind the survivors: every rank
goes back that step, so the sums stay exact), and the snapshots start
over on the survivors.

    eccl-run -np 4 python moe_elastic.py --out base.json
    eccl-run -np 4 --standby 1 --kill-when "2:step 30" python moe_elastic.py --out standby.json
    eccl-run -np 4 --kill-when "2:step 30" python moe_elastic.py --out shrink.json
    eccl-run -np 4 --kill-when "1:step 30" python moe_elastic.py --min-replicas 1 --out lost.json
    python moe_elastic.py --compare base.json standby.json shrink.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

import torch_eccl
import torch_eccl.moe as moe
import torch_eccl.snapshot as snapshot

VOCAB, D, HEADS, SEQ, BATCH, LAYERS = 64, 32, 4, 16, 8, 2
EXPERTS, TOPK, SLOTS, MIN_REPLICAS = 16, 2, 12, 2
LR, BETAS, EPS = 3e-3, (0.9, 0.99), 1e-8


def configure(experts: int, min_replicas: int) -> None:
    """Experts per layer and the fewest replicas each; the slots per rank
    grow with them so that three ranks still hold MIN_REPLICAS of each
    after a shrink from four."""
    global EXPERTS, SLOTS, MIN_REPLICAS
    EXPERTS, MIN_REPLICAS = experts, min_replicas
    SLOTS = max(12 if min_replicas > 1 else 0, -(-experts * MIN_REPLICAS // 3) + 1)


def replicas_for(load, world: int) -> list[int]:
    """Replicas per expert for `world` ranks: MIN_REPLICAS each where the
    slots allow it (at two ranks of four they hold one copy each)."""
    return moe.allocate_replicas(load, world, SLOTS, max(1, min(MIN_REPLICAS, world * SLOTS // EXPERTS)))


# The machines' layout: ranks k*h .. k*h+k-1 share machine h (0: one
# machine, or none known). Placements follow it by rank number, not by
# where a rank's process runs now: a replacement on a spare machine plans
# as the rank it replaced, so the placement (and the sums) stay those of a
# run without the failure.
RANKS_PER_HOST = 0


def learn_hosts() -> None:
    """Collective, at the job's start: the ranks' ECCL_HOSTID (eccl-run
    --ranks-per-host); where they come in equal runs, a run is a machine."""
    global RANKS_PER_HOST
    ids = [None] * dist.get_world_size()
    dist.all_gather_object(ids, os.environ.get("ECCL_HOSTID", ""))
    RANKS_PER_HOST = ranks_per_host(ids)


def ranks_per_host(ids) -> int:
    if not ids or not ids[0] or len(set(ids)) < 2:
        return 0
    k = ids.count(ids[0])
    runs = [ids[i:i + k] for i in range(0, len(ids), k)]
    if len(ids) % k or any(len(set(run)) != 1 for run in runs) or len({run[0] for run in runs}) != len(runs):
        return 0  # not contiguous runs of one size: no layout to keep by rank
    return k


def hosts_for(world: int) -> list[int] | None:
    """Each rank's machine by the layout (None where none is known)."""
    return [r // RANKS_PER_HOST for r in range(world)] if RANKS_PER_HOST else None


def placement_for(load, world: int) -> list[list[int]]:
    """Lazarus's placement for `world` ranks, across machines where known:
    no machine holds every replica of an expert that has two or more."""
    return moe.place(replicas_for(load, world), world, SLOTS, hosts=hosts_for(world))


def machine_survival(placement) -> str:
    """Where the machines are known: the chance that every expert keeps a
    replica when one random machine fails."""
    hosts = hosts_for(len(placement))
    if not hosts:
        return ""
    p = moe.recovery_probability(placement, EXPERTS, 1, hosts=hosts)["probability"]
    return f"; every expert survives any one machine's loss with probability {p:.3f}"


class Dense(torch.nn.Module):
    """The replicated part: embedding, causal attention, norms, routers, head."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, D)
        self.pos = torch.nn.Parameter(torch.randn(SEQ, D) * 0.02)
        self.attn = torch.nn.ModuleList(torch.nn.MultiheadAttention(D, HEADS, batch_first=True) for _ in range(LAYERS))
        self.norm_a = torch.nn.ModuleList(torch.nn.LayerNorm(D) for _ in range(LAYERS))
        self.norm_f = torch.nn.ModuleList(torch.nn.LayerNorm(D) for _ in range(LAYERS))
        self.router = torch.nn.ModuleList(torch.nn.Linear(D, EXPERTS, bias=False) for _ in range(LAYERS))
        self.head = torch.nn.Linear(D, VOCAB)


def expert_init(e: int) -> list[torch.Tensor]:
    """Expert e's parameters in every layer (w1, b1, w2, b2 per layer): the same on every rank."""
    g = torch.Generator().manual_seed(4242 + e)
    out = []
    for _ in range(LAYERS):
        out += [torch.randn(D, 2 * D, generator=g) / D**0.5, torch.zeros(2 * D),
                torch.randn(2 * D, D, generator=g) / (2 * D)**0.5, torch.zeros(D)]
    return out


def expert_forward(params, layer, rows):
    w1, b1, w2, b2 = params[4 * layer:4 * layer + 4]
    return F.gelu(rows @ w1 + b1) @ w2 + b2


def batch(step: int, rank: int):
    """Sequences of an affine recurrence mod VOCAB with a little noise: learnable, deterministic."""
    g = torch.Generator().manual_seed(step * 7919 + rank)
    a = torch.randint(1, 8, (BATCH, 1), generator=g)
    c = torch.randint(0, VOCAB, (BATCH, 1), generator=g)
    x = torch.empty(BATCH, SEQ + 1, dtype=torch.long)
    x[:, :1] = torch.randint(0, VOCAB, (BATCH, 1), generator=g)
    for t in range(SEQ):
        x[:, t + 1:t + 2] = (a * x[:, t:t + 1] + c) % VOCAB
    noise = torch.rand(BATCH, SEQ + 1, generator=g) < 0.05
    x[noise] = torch.randint(0, VOCAB, (int(noise.sum()),), generator=g)
    return x[:, :-1], x[:, 1:]


GLOBAL_SEQUENCES = 4 * BATCH  # the ETTR jobs' fixed global batch: four ranks' worth


def global_batch_share(step: int, rank: int, world: int):
    """This rank's rows of the step's global batch (GLOBAL_SEQUENCES, the
    same at any world size) and the scale for its loss, so that the mean
    over ranks is the global batch's mean."""
    xs, ys = zip(*(batch(step, part) for part in range(GLOBAL_SEQUENCES // BATCH)))
    rows = torch.tensor_split(torch.arange(GLOBAL_SEQUENCES), world)[rank]
    return torch.cat(xs)[rows], torch.cat(ys)[rows], rows.numel() * world / GLOBAL_SEQUENCES


class Trainer:
    def __init__(self, ident: int):
        torch.manual_seed(1234)
        self.ident = ident  # who this process is, across renumberings
        self.dense = Dense()
        self.dense_adam = [(torch.zeros_like(p), torch.zeros_like(p)) for p in self.dense.parameters()]
        self.step = 0
        self.load = torch.zeros(EXPERTS, dtype=torch.float64)  # tokens routed, all ranks, since the last rebalance
        self.experts: dict[int, list[torch.Tensor]] = {}  # expert -> params + Adam (m, v) per param
        self.placement: list[list[int]] = []
        self.losses: list[float] = []
        self.prev = None
        self.rebalanced_at = 0
        self.shrunk = False
        self.prev_candidate = None
        # The snapshots' state on this rank: NONE (never configured here),
        # CONFIGURED (a replacement's configure is done, its restore is not)
        # or SETTLED (snapshotting with the others). Gathered in sync so
        # that every rank takes the same next call.
        self.snap = SNAP_NONE
        self.snapshot_base = 0  # versions: the view's epoch in the high digits, the step below

    # --- peer-memory snapshots of the experts ----------------------------
    def start_snapshots(self, how: str):
        """`first`: a fresh view; `over`: the view shrank (every copy is
        dropped: read what is needed first); `restore`: a standby took a
        rank, or a restore was cut short (a newcomer configures, then
        everyone restores; where some shards are in no memory, e.g. a
        host took a rank and its copies along, or the same recovery also
        dropped a rank, the experts came back from their replicas and the
        snapshots start over)."""
        replicas = min(1, dist.get_world_size() - 1)
        if how in ("first", "over") or self.snap == SNAP_NONE:
            snapshot.configure(replicas=replicas)
            self.snap = SNAP_CONFIGURED if how == "restore" else SNAP_SETTLED
        if how == "restore":
            try:
                snapshot.restore()
            except (snapshot.ShardsLost, snapshot.ViewShrank) as e:  # every rank raises either
                print(f"rank {dist.get_rank()}: {str(e).splitlines()[0]}; the snapshots start over", flush=True)
                snapshot.configure(replicas=replicas)
            self.snap = SNAP_SETTLED
        self.snapshot_base = int(torch_eccl.stats()["epoch"]) * 1_000_000

    def put_snapshot(self):
        version = self.snapshot_base + self.step
        for e, ts in self.experts.items():
            snapshot.put(version, f"expert{e}", torch.cat([t.reshape(-1) for t in ts]))
        snapshot.commit(version)

    def held_snapshots(self) -> dict[int, tuple[int, int]]:
        """Expert -> (owner, version) of the copies this rank holds of other
        ranks' experts (owners numbered as in the snapshots' view)."""
        if self.snap == SNAP_NONE:
            return {}
        out = {}
        for (owner, name), version in snapshot.held().items():
            e = int(name[len("expert"):])
            if e not in out or version > out[e][1]:
                out[e] = (owner, version)
        return out

    def expert_from_snapshot(self, e, owner):
        ts = self.expert_template(e)
        flat = torch.empty(sum(t.numel() for t in ts))
        version = snapshot.get_held(owner, f"expert{e}", flat)
        at = 0
        for t in ts:
            t.copy_(flat[at:at + t.numel()].view_as(t))
            at += t.numel()
        return ts, version

    # --- state -------------------------------------------------------
    def expert_template(self, e):
        p = expert_init(e)
        return [torch.empty_like(t) for _ in range(3) for t in p]

    def fresh_experts(self, placement):
        self.placement = placement
        mine = sorted(set(placement[dist.get_rank()]))
        self.experts = {e: expert_init(e) + [torch.zeros_like(t) for _ in range(2) for t in expert_init(e)]
                        for e in mine}

    def copy_state(self):
        return {
            "dense": [p.detach().clone() for p in self.dense.parameters()],
            "adam": [(m.clone(), v.clone()) for m, v in self.dense_adam],
            "experts": {e: [t.clone() for t in ts] for e, ts in self.experts.items()},
            "placement": [list(n) for n in self.placement],
            "step": self.step, "load": self.load.clone(), "losses": list(self.losses),
            "rebalanced_at": self.rebalanced_at,
        }

    def restore(self, s):
        with torch.no_grad():
            for p, q in zip(self.dense.parameters(), s["dense"]):
                p.copy_(q)
        self.dense_adam = [(m.clone(), v.clone()) for m, v in s["adam"]]
        self.experts = {e: [t.clone() for t in ts] for e, ts in s["experts"].items()}
        self.placement = [list(n) for n in s["placement"]]
        self.step, self.load, self.losses = s["step"], s["load"].clone(), list(s["losses"])
        self.rebalanced_at = s["rebalanced_at"]

    def table(self):
        return moe.table_from_placement(self.placement, EXPERTS)

    # --- one step ------------------------------------------------------
    def data(self):
        """This rank's sequences and the loss's scale (the ranks' losses are
        averaged): after a shrink each survivor keeps its own stream."""
        x, y = batch(self.step, self.ident if self.shrunk else dist.get_rank())
        return x, y, 1.0

    def train_step(self):
        world = dist.get_world_size()
        table = self.table()
        x, y, scale = self.data()
        params = {e: [t.detach().requires_grad_(True) for t in ts[:len(ts) // 3]] for e, ts in self.experts.items()}
        h = self.dense.embed(x) + self.dense.pos
        mask = torch.triu(torch.ones(SEQ, SEQ, dtype=torch.bool), 1)
        load = torch.zeros(EXPERTS, dtype=torch.float64)
        for layer in range(LAYERS):
            a = self.dense.norm_a[layer](h)
            h = h + self.dense.attn[layer](a, a, a, attn_mask=mask, need_weights=False)[0]
            f = self.dense.norm_f[layer](h).reshape(-1, D)
            probs = F.softmax(self.dense.router[layer](f), dim=-1)
            w, ids = probs.topk(TOPK, dim=-1)
            w = w / w.sum(-1, keepdim=True)
            load += torch.bincount(ids.flatten(), minlength=EXPERTS).double()
            inputs, handle = moe.dispatch(f, ids, table)
            outs = [expert_forward(params[e], layer, rows) for e, rows in zip(handle.local_experts, inputs)]
            h = h + moe.combine(outs, w, handle).reshape(h.shape)
        loss = F.cross_entropy(self.dense.head(h).reshape(-1, VOCAB), y.reshape(-1)) * scale
        for p in self.dense.parameters():
            p.grad = None
        loss.backward()
        # One all-reduce: the dense gradients, the loss and the load.
        dense = list(self.dense.parameters())
        flat = torch.cat([p.grad.reshape(-1) for p in dense] + [loss.detach().reshape(1), load.float()])
        dist.all_reduce(flat)
        grads = {e: [t.grad if t.grad is not None else torch.zeros_like(t) for t in ps] for e, ps in params.items()}
        # All experts' gradients in one call: each expert's parameters flattened.
        merged = {e: [torch.cat([t.reshape(-1) for t in g])] for e, g in grads.items()}
        moe.reduce_replica_grads(merged, table)
        # Updates (no collective below: a failure above leaves the state untouched).
        at = 0
        self.step += 1
        for p, (m, v) in zip(dense, self.dense_adam):
            n = p.numel()
            adam(p.data, flat[at:at + n].view_as(p) / world, m, v, self.step)
            at += n
        self.losses.append(float(flat[at]) / world)
        self.load += flat[at + 1:].double()
        for e, ts in self.experts.items():
            n_par = len(ts) // 3
            g_all, off = merged[e][0] / world, 0
            for i in range(n_par):
                n = ts[i].numel()
                adam(ts[i], g_all[off:off + n].view_as(ts[i]), ts[n_par + i], ts[2 * n_par + i], self.step)
                off += n

    # --- membership changes -------------------------------------------
    def sync(self, every_k: int, last_step: int):
        global RANKS_PER_HOST
        """Collective: agree on the step, bring newcomers the dense state,
        move to the placement the lowest survivor decides (the same, one for
        fewer ranks, or one that follows the load) with the experts each
        rank now needs copied from surviving replicas."""
        rank, world = dist.get_rank(), dist.get_world_size()
        # Who, at which step, holding which experts, and which experts'
        # snapshot copies (other ranks') this rank holds.
        mine = torch.full((3 + SLOTS + EXPERTS,), -1, dtype=torch.long)
        mine[0], mine[1], mine[-1] = self.ident, self.step, self.snap
        held = sorted(self.experts)
        mine[2:2 + len(held)] = torch.tensor(held, dtype=torch.long)
        copies = self.held_snapshots()
        for e, (_, version) in copies.items():  # the step each copy is of
            mine[2 + SLOTS + e] = version % 1_000_000
        every = torch.empty(world, 3 + SLOTS + EXPERTS, dtype=torch.long)
        dist.all_gather_into_tensor(every, mine)
        steps = every[:, 1].tolist()
        survivors = [r for r in range(world) if steps[r] >= 0]
        src = survivors[0]
        target_step = min(steps[r] for r in survivors)
        current = [[e for e in row[2:2 + SLOTS].tolist() if e >= 0] for row in every]
        # An expert no survivor holds comes back from a snapshot copy (the
        # newest, on the lowest rank): its holder counts as an owner, and
        # the move goes on from there.
        alive = {e for row in current for e in row}
        from_snapshot = {}  # expert -> (holder, step of its copy)
        for e in range(EXPERTS):
            copy_steps = [(int(every[r, 2 + SLOTS + e]), -r) for r in range(world) if every[r, 2 + SLOTS + e] >= 0]
            if e not in alive and copy_steps:
                step, holder = max(copy_steps)
                from_snapshot[e] = (-holder, step)
        # A copy one step behind (its owner died before that step's
        # snapshot committed): everyone goes back a step when every
        # survivor can (each keeps the state before its last step), and
        # the sums stay exact.
        behind = min((step for _, step in from_snapshot.values()), default=target_step)
        if behind == target_step - 1 and all(steps[r] == target_step for r in survivors):
            if rank == src:
                print(f"rank {rank}: the snapshot copies of experts {sorted(from_snapshot)} are of step {behind}: "
                      f"every rank goes back to it from step {target_step}", flush=True)
            target_step = behind
        if self.step > target_step:  # finished the step the others failed in, or going back
            self.restore(self.prev)
        newcomers = any(s < 0 for s in steps)
        if newcomers:
            state = [p.data for p in self.dense.parameters()] + [t for mv in self.dense_adam for t in mv] + [self.load]
            for t in state:
                dist.broadcast(t, src=src)
        decision = [None]
        if rank == src:
            for e, (holder, _) in from_snapshot.items():
                current[holder].append(e)
            lost = [e for e in range(EXPERTS) if e not in alive and e not in from_snapshot]
            rebalance = (every_k > 0 and target_step % every_k == 0 and 0 < target_step < last_step
                         and self.rebalanced_at != target_step)
            if rebalance or world != len(self.placement):
                target = placement_for(self.load.tolist(), world)
            else:
                target = self.placement
            # A newcomer in a rank's place counts as holding that rank's
            # experts when the move is planned (it is sent them with the
            # rest): the plan is then the one a run without the failure
            # makes, and so are the sums (another expert-to-rank map would
            # add in another order).
            planned = [list(row) for row in current]
            if world == len(self.placement):
                for r in range(world):
                    if steps[r] < 0:
                        planned[r] = list(self.placement[r])
            plan_to_rank, transfers = moe.plan_migration(planned, [], target, EXPERTS) if not lost else ([], [])
            placement = [None] * world
            for p, r in enumerate(plan_to_rank):
                placement[r] = list(target[p])
            if planned != current and not lost:
                transfers = copies_to(current, placement)
            # The move maps plan nodes onto the ranks keeping experts in
            # place, not machines: spread across them again where it broke.
            if RANKS_PER_HOST and not lost:
                mapped = [list(row) for row in placement]
                moe.spread_over_hosts(placement, hosts_for(world))
                if placement != mapped:
                    transfers = copies_to(current, placement)
            if lost:  # every rank stops with the same message
                placement = f"experts {lost} lost every replica and every snapshot copy"
            # A newcomer (a standby in a rank's place, or one the view grew
            # by) restores the copies, and so does a view whose restore a
            # failure cut short; a view that shrank starts them over.
            unsettled = any(int(every[r, -1]) != SNAP_SETTLED for r in range(world))
            view = ("restore" if newcomers else "over" if world != len(self.placement) else
                    "restore" if unsettled else None)
            decision = [(placement, transfers, target_step, self.losses, rebalance, view, RANKS_PER_HOST)]
        dist.broadcast_object_list(decision, src=src)
        placement, transfers, target_step, losses, rebalance, view, per_host = decision[0]
        RANKS_PER_HOST = per_host  # a newcomer may plan the next placement
        if isinstance(placement, str):
            raise SystemExit(f"rank {rank}: {placement}")
        for e, (holder, _) in sorted(from_snapshot.items()):
            if holder == rank:
                self.experts[e], version = self.expert_from_snapshot(e, copies[e][0])
                held.append(e)
                print(f"rank {rank}: expert {e} lost every replica; restored from the snapshot of step "
                      f"{version % 1_000_000} held for old rank {copies[e][0]} (training is at step {target_step})",
                      flush=True)
        got = moe.move_experts({e: self.experts[e] for e in held}, transfers, self.expert_template)
        keep = {e: self.experts[e] if e in self.experts else got[e] for e in set(placement[rank])}
        self.experts, self.placement = keep, placement
        self.step, self.losses = target_step, list(losses)
        if rebalance:
            self.load.zero_()
            self.rebalanced_at = target_step
        if view:
            self.start_snapshots(view)
        return len(transfers) if rebalance else -1


SNAP_NONE, SNAP_CONFIGURED, SNAP_SETTLED = 0, 1, 2


def copies_to(current, placement):
    """(expert, from, to) for every expert a rank needs and does not hold,
    each from the lowest rank that holds it."""
    owner = {}
    for r, row in enumerate(current):
        for e in row:
            owner.setdefault(e, r)
    return [(e, owner[e], r) for r, row in enumerate(placement) for e in sorted(set(row) - set(current[r]))]


def adam(p, g, m, v, step):
    m.mul_(BETAS[0]).add_(g, alpha=1 - BETAS[0])
    v.mul_(BETAS[1]).addcmul_(g, g, value=1 - BETAS[1])
    mhat = m / (1 - BETAS[0]**step)
    vhat = v / (1 - BETAS[1]**step)
    p.sub_(LR * mhat / (vhat.sqrt() + EPS))


def digest(ts) -> str:
    return hashlib.sha256(b"".join(t.detach().contiguous().numpy().tobytes() for t in ts)).hexdigest()[:16]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--rebalance", type=int, default=20, help="re-place experts from the load every N steps")
    ap.add_argument("--step-ms", type=float, default=50, help="pause per step, so a kill lands mid-run")
    ap.add_argument("--print-every", type=int, default=10, help="print the loss every N steps")
    ap.add_argument("--experts", type=int, default=EXPERTS, help="experts per MoE layer")
    ap.add_argument("--min-replicas", type=int, default=MIN_REPLICAS,
                    help="fewest replicas of an expert (1: a failure can lose one; it comes back from a snapshot)")
    ap.add_argument("--out", help="rank 0 writes the losses and parameter digests here (JSON)")
    ap.add_argument("--compare", nargs="+", help="compare result files: the first is the failure-free run")
    args = ap.parse_args()
    if args.compare:
        return compare(args.compare)
    configure(args.experts, args.min_replicas)
    torch.set_num_threads(1)  # one reduction order in every run
    torch_eccl.init_process_group()
    rank = dist.get_rank()
    joined = torch_eccl.stats()["joined_epoch"] > 1
    trainer = Trainer(ident=int(os.environ.get("ECCL_RANK", rank)) if not joined else 1000 + rank)
    if joined:
        trainer.step = -1
        print(f"rank {rank}: joined at epoch {torch_eccl.stats()['epoch']}; receiving the state", flush=True)
    else:
        world = dist.get_world_size()
        learn_hosts()
        trainer.fresh_experts(placement_for([1.0] * EXPERTS, world))
        trainer.start_snapshots("first")
    need_sync, failed_at, recoveries = joined, None, []
    while True:
        try:
            if need_sync:
                moved = trainer.sync(args.rebalance, args.steps)
                if moved >= 0 and rank == 0:
                    print(f"rank 0: step {trainer.step}: re-placed from the load, {moved} expert copies"
                          f"{machine_survival(trainer.placement)}", flush=True)
                need_sync = False
            if trainer.step >= args.steps:
                break
            trainer.prev_candidate = trainer.copy_state()
            trainer.train_step()
            trainer.prev = trainer.prev_candidate
            trainer.put_snapshot()
            if failed_at is not None:
                recoveries.append((time.monotonic() - failed_at) * 1000)
                print(f"rank {rank}: first step after the failure done {recoveries[-1]:.0f} ms after it was "
                      f"detected", flush=True)
                failed_at = None
            if trainer.step % args.print_every == 0:
                print(f"rank {rank}: step {trainer.step} loss {trainer.losses[-1]:.4f}", flush=True)
            if args.rebalance and trainer.step % args.rebalance == 0 and trainer.step < args.steps:
                need_sync = True
            time.sleep(args.step_ms / 1000)
        except RuntimeError as e:
            failed_at = failed_at or time.monotonic()
            print(f"rank {rank}: step {trainer.step} failed: {str(e).splitlines()[0]}", flush=True)
            world_before = dist.get_world_size()
            s = torch_eccl.recover("replace_or_shrink")
            if int(s["world_size"]) < world_before:
                trainer.shrunk = True
            rank = dist.get_rank()
            print(f"rank {rank}: recovered into epoch {int(s['epoch'])}, {int(s['world_size'])} ranks", flush=True)
            need_sync = True
    finish(trainer, args, recoveries)


def finish(trainer, args, recoveries):
    rank, world = dist.get_rank(), dist.get_world_size()
    experts = {e: digest(ts[:len(ts) // 3]) for e, ts in trainer.experts.items()}
    gathered = [None] * world
    dist.all_gather_object(gathered, experts)
    merged = {}
    for held in gathered:
        for e, d in held.items():
            if merged.setdefault(e, d) != d:
                raise SystemExit(f"expert {e}'s replicas disagree: {merged[e]} and {d}")
    dense = digest(list(trainer.dense.parameters()))
    print(f"rank {rank}: done after {trainer.step} steps on {world} ranks, dense sha256 {dense}, "
          f"{len(merged)} experts, experts here {sorted(trainer.experts)}", flush=True)
    if rank == 0 and args.out:
        with open(args.out, "w") as f:
            json.dump({"world": world, "steps": trainer.step, "losses": trainer.losses, "dense": dense,
                       "experts": {str(e): merged[e] for e in sorted(merged)}, "recovery_ms": recoveries}, f)
    dist.destroy_process_group()


def compare(paths):
    runs = [json.load(open(p)) for p in paths]
    base = runs[0]
    print(f"{'step':>6} " + " ".join(f"{os.path.basename(p):>14}" for p in paths))
    for i in range(0, len(base["losses"]), 10):
        print(f"{i + 1:>6} " + " ".join(f"{r['losses'][i]:>14.4f}" if i < len(r["losses"]) else " " * 14
                                        for r in runs))
    ok = True
    for p, r in zip(paths[1:], runs[1:]):
        same = r["dense"] == base["dense"] and r["experts"] == base["experts"]
        where = f"{os.path.basename(p)}: {r['world']} ranks at the end, recovery {r['recovery_ms']} ms"
        if r["world"] == base["world"]:
            print(f"{where}: parameters {'bit-equal to' if same else 'DIFFER from'} the failure-free run")
            ok &= same
        else:
            spread = max(base["losses"][-10:]) - min(base["losses"][-10:])
            gap = abs(r["losses"][-1] - base["losses"][-1])
            print(f"{where}: final loss {r['losses'][-1]:.4f} against {base['losses'][-1]:.4f} "
                  f"(last-10 spread {spread:.4f})")
            ok &= math.isfinite(r["losses"][-1]) and len(r["experts"]) == len(base["experts"])
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
