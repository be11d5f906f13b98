"""The pipeline-parallel job perf/ettr.py measures (contender "pipeline"):
four stages, one process each, no data-parallel replica, under eccl-run
with a refilled standby. MoEtion's localized recovery: only the failed
stage recomputes, from state kept in the other stages' memory.

The model: every stage is a block-diagonal MLP, BLOCKS blocks each mapping
its slice of the features through Linear-Tanh-Linear with an Adam of its
own, so a block's gradients depend only on its slice of the tensors that
cross the stage's boundaries, and a replacement can recompute block by
block. Schedule: each micro-batch forward to the last stage and back
before the next (one micro-batch in flight), so no stage gets more than
one iteration ahead of another.

What protects the state:
- every send to a neighbour is logged in host memory (torch_eccl.log),
  tagged (iteration, micro-batch);
- every EVERY iterations one block, in rotation, is snapshotted into two
  other stages' memory (torch_eccl.snapshot, a sparse version); every
  FULL_EVERY iterations every block, under one of two prefixes in turn.
  Snapshots are taken one iteration late (the state at the end of
  iteration i, put at the end of i + 1), so no version is newer than a
  stage that is one iteration behind;
- every stage keeps its state from before its latest optimizer step.

After any failed op the survivors recover("replace") (the standby takes
the rank), every member restores the snapshots, and one all_reduce tells
every member every stage's position. T, the lowest completed iteration
among the stages that kept their state, is the point they meet: a stage
one iteration past it rolls back to its kept state, a replacement loads
its blocks (each from its own version) and its neighbours replay their
logs from its oldest block's iteration to T while it recomputes only the
blocks older than each iteration; then every stage goes on from T + 1.
When that cannot be done (two neighbours lost before the replacement's own
log covers what the other needs, or a snapshot newer than T after an
earlier rollback), every stage goes back to the newest full snapshot they
all hold and recomputes from there (a global rollback, counted). A
failure during any of this starts it over.

The second level (Gemini's, MoEtion's): at the start and one iteration
after each full snapshot every stage persists it (torch_eccl.snapshot.persist, written in
the background). When a stage and both stages holding its copies die
before a restore (three kills within a recovery), the restore names the
shards no memory holds and every stage goes back to the persisted version
(snapshot.load) and rolls back to its full snapshot.

Events (perf/ettr.py reads them) as perf/ettr_train.py writes them; the
"done" digest covers every stage's parameters (gathered), so every rank
reports the same one and it equals a failure-free run's bit for bit.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import signal
import sys
import time

import late_start

STARTED_AT_NICE = late_start.begin()  # before torch: importing it is most of a late starter's start

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ettr_train import Events  # noqa: E402

STAGES, BLOCKS, WIDTH, MICRO, ROWS = 4, 4, 512, 4, 16
D = WIDTH // BLOCKS
EVERY, FULL_EVERY = 2, 32
ERA = 1_000_000  # snapshot version = era * ERA + iteration, a new era per recovery: versions must only grow
LR = 1e-3
DIE_AT = None  # tests (--die-at): (stage, iteration) where this process kills itself


class Stage:
    def __init__(self, stage: int):
        self.s, self.last = stage, stage == STAGES - 1
        torch.manual_seed(1000 + stage)
        self.blocks = [torch.nn.Sequential(torch.nn.Linear(D, D), torch.nn.Tanh(), torch.nn.Linear(D, D))
                       for _ in range(BLOCKS)]
        self.opts = [torch.optim.Adam(b.parameters(), lr=LR) for b in self.blocks]
        for opt in self.opts:  # Adam's state made now (as its first step would), so a block packs into one tensor
            for p in opt.param_groups[0]["params"]:
                opt.state[p] = {"step": torch.tensor(0.0), "exp_avg": torch.zeros_like(p),
                                "exp_avg_sq": torch.zeros_like(p)}
        self.done = 0  # completed iterations (optimizer steps)
        self.kept = None  # the state before the latest step: [block state]
        self.log_from = 1  # the oldest iteration this stage's log holds records of
        self.version = 0  # the newest snapshot version put

    def block_tensors(self, b: int) -> list[torch.Tensor]:
        """A block's parameters and Adam state: one snapshot name per block
        rather than 16 (a restore fetches name by name)."""
        ps = list(self.blocks[b].parameters())
        st = [self.opts[b].state[p] for p in ps]
        return [p.data for p in ps] + [s["exp_avg"] for s in st] + [s["exp_avg_sq"] for s in st] + \
            [s["step"] for s in st]

    def block_numel(self, b: int) -> int:
        return sum(t.numel() for t in self.block_tensors(b))

    def block_state(self, b: int) -> torch.Tensor:
        return torch.cat([t.reshape(-1) for t in self.block_tensors(b)])

    def load_block(self, b: int, flat: torch.Tensor):
        at = 0
        for t in self.block_tensors(b):
            t.copy_(flat[at:at + t.numel()].view_as(t))
            at += t.numel()

    def sl(self, b: int) -> slice:
        return slice(b * D, (b + 1) * D)

    def flat(self) -> torch.Tensor:
        return torch.cat([p.detach().reshape(-1) for blk in self.blocks for p in blk.parameters()])


def data(it: int, mb: int):
    g = torch.Generator().manual_seed(it * 7919 + mb * 104729 + 5)
    x = torch.randn(ROWS, WIDTH, generator=g)
    return x, x.roll(1, dims=1).sin()


def block_loss(out_b, y_b):
    return ((out_b - y_b) ** 2).sum() / (ROWS * WIDTH * MICRO)


def micro_batch(st: Stage, it: int, mb: int) -> float:
    """Forward through this stage, and back; returns the last stage's
    summed row losses. Blocks run on their slices, as a replay does."""
    from torch_eccl import log

    log.set_tag(it, mb)
    x, y = data(it, mb)
    up = x
    if st.s > 0:
        up = torch.empty(ROWS, WIDTH)
        dist.recv(up, st.s - 1)
    inp = up.clone().requires_grad_(st.s > 0)
    outs = [st.blocks[b](inp[:, st.sl(b)].contiguous()) for b in range(BLOCKS)]
    loss_sum = 0.0
    if st.last:
        losses = [block_loss(outs[b], y[:, st.sl(b)].contiguous()) for b in range(BLOCKS)]
        torch.autograd.backward(losses)
        out = torch.cat([o.detach() for o in outs], 1)
        loss_sum = float(((out - y) ** 2).mean(dim=1).sum())
    else:
        dist.send(torch.cat([o.detach() for o in outs], 1), st.s + 1)
        down = torch.empty(ROWS, WIDTH)
        dist.recv(down, st.s + 1)
        torch.autograd.backward(outs, [down[:, st.sl(b)].contiguous() for b in range(BLOCKS)])
    if DIE_AT == (st.s, it) and mb == MICRO - 1:
        os.kill(os.getpid(), signal.SIGKILL)  # the stages after it have stepped, those before wait for this
    if st.s > 0:
        dist.send(inp.grad, st.s - 1)
    return loss_sum


def step_blocks(st: Stage, which):
    for b in which:
        st.opts[b].step()
        st.opts[b].zero_grad(set_to_none=True)


def snapshot_after(st: Stage, it: int, era: int):
    """At the end of iteration `it`: the state of `it` - 1 (kept) into the
    other stages' memory, sparse or full; the log keeps what the oldest
    snapshotted block may need, with one rotation to spare for a
    neighbour one commit behind."""
    from torch_eccl import log, snapshot

    i = it - 1
    if i <= 0 or i % EVERY:
        return
    v = era * ERA + i
    b = (i // EVERY) % BLOCKS
    snapshot.put(v, f"b{b}", st.kept[b])
    if i % FULL_EVERY == 0:
        for k in range(BLOCKS):
            snapshot.put(v, f"f{(i // FULL_EVERY) % 2}.b{k}", st.kept[k])
    snapshot.commit(v)
    st.version = v
    oldest = min(min(block_iterations().values()), i)  # after a rollback a block may be ahead
    keep_from = max(1, oldest + 1 - BLOCKS * EVERY)
    if keep_from > st.log_from:
        log.truncate(keep_from)
        st.log_from = keep_from


def block_iterations() -> dict[int, int]:
    from torch_eccl import snapshot

    v = snapshot.versions()
    return {b: v[f"b{b}"] % ERA for b in range(BLOCKS)}


def full_iterations() -> dict[int, int]:
    from torch_eccl import snapshot

    v = snapshot.versions()
    return {k: v[f"f{k}.b0"] % ERA for k in range(2)}


def first_snapshot(st: Stage, persist_dir: str | None):
    from torch_eccl import snapshot

    for b in range(BLOCKS):
        state = st.block_state(b)
        for name in (f"b{b}", f"f0.b{b}", f"f1.b{b}"):
            snapshot.put(0, name, state)
    snapshot.commit(0)
    snapshot.wait(0)
    if persist_dir:  # the second level holds the start from the start
        snapshot.persist(persist_dir)


# --- recovery ----------------------------------------------------------
NEW, DONE, LOG_FROM, ERA_COL, FULL0, FULL1, BLK = 0, 1, 2, 3, 4, 5, 6


def positions(st: Stage, new: bool, era: int) -> torch.Tensor:
    """Every stage's row: [new, completed, log from, era, full iterations,
    block iterations]; one all_reduce (each row is written by its stage)."""
    rows = torch.zeros(STAGES, BLK + BLOCKS, dtype=torch.int64)
    full = full_iterations()
    rows[st.s, :BLK] = torch.tensor([int(new), st.done, st.log_from, era, full[0], full[1]])
    if new:
        its = block_iterations()
        rows[st.s, BLK:] = torch.tensor([its[b] for b in range(BLOCKS)])
    dist.all_reduce(rows)
    return rows


def neighbours(s: int):
    return [p for p in (s - 1, s + 1) if 0 <= p < STAGES]


def local_plan(rows: torch.Tensor):
    """T, or None when a replacement cannot be rebuilt from logs."""
    kept = [s for s in range(STAGES) if not rows[s, NEW]]
    if not kept:
        return None
    t = min(int(rows[s, DONE]) for s in kept)
    ahead = [s for s in kept if int(rows[s, DONE]) > t + 1]
    if ahead:  # the schedule keeps stages within one iteration: a bug, not a failure to plan around
        raise SystemExit(f"ettr_pipeline: stages {ahead} are more than one iteration past {t}: {rows.tolist()}")
    for n in range(STAGES):
        if not rows[n, NEW]:
            continue
        blocks = rows[n, BLK:]
        if int(blocks.max()) > t:
            return None
        need = int(blocks.min()) + 1
        for m in neighbours(n):
            if rows[m, NEW] or (need <= t and int(rows[m, LOG_FROM]) > need):
                return None
    return t


def load_snapshot(st: Stage, prefix: str):
    from torch_eccl import snapshot

    for b in range(BLOCKS):
        flat = torch.empty(st.block_numel(b))
        snapshot.get(f"{prefix}b{b}", flat)
        st.load_block(b, flat)


def rebuild(st: Stage, t: int):
    """A replacement: each block from its snapshot, then the iterations up
    to `t` from the neighbours' replayed sends, recomputing only the
    blocks older than each iteration."""
    from torch_eccl import log, snapshot

    its = block_iterations()
    load_snapshot(st, "")
    for it in range(min(its.values()) + 1, t + 1):
        stale = [b for b in range(BLOCKS) if its[b] < it]
        for mb in range(MICRO):
            x, y = data(it, mb)
            up = x
            if st.s > 0:
                up = torch.empty(ROWS, WIDTH)
                dist.recv(up, st.s - 1)
            down = None
            if not st.last:
                down = torch.empty(ROWS, WIDTH)
                dist.recv(down, st.s + 1)
            for b in stale:
                out = st.blocks[b](up[:, st.sl(b)].contiguous())
                if st.last:
                    block_loss(out, y[:, st.sl(b)].contiguous()).backward()
                else:
                    out.backward(down[:, st.sl(b)].contiguous())
        step_blocks(st, stale)
    st.done, st.kept = t, None
    log.truncate(t + 1)  # it sent nothing before: a replay reaching there must fail, not wait
    st.log_from = t + 1


def rollback_to_full(st: Stage, rows: torch.Tensor, new: bool) -> int:
    from torch_eccl import log, snapshot

    f = min(max(int(rows[s, FULL0]), int(rows[s, FULL1])) for s in range(STAGES))
    mine = full_iterations()
    k = next((k for k in range(2) if mine[k] == f), None)
    if k is None:
        raise SystemExit(f"ettr_pipeline: stage {st.s} holds full snapshots of iterations {mine}, not {f}: "
                         "no state every stage can go back to")
    load_snapshot(st, f"f{k}.")
    log.discard(f + 1)
    if new or st.log_from > f + 1:
        log.truncate(f + 1)
        st.log_from = f + 1
    st.done, st.kept = f, None
    return f


def recover_stage(st: Stage, new: bool, era: int, events, from_disk: bool = False):
    """One attempt at the recovery; returns (era, kind). A failed op in it
    raises, and the caller starts over. `from_disk`: the snapshots were
    just loaded from the persisted version, and every stage goes back to it."""
    from torch_eccl import log

    for opt in st.opts:  # what the interrupted iteration (or rebuild) had accumulated is redone
        opt.zero_grad(set_to_none=True)
    rows = positions(st, new, era)
    era = int(rows[:, ERA_COL].max())
    t = None if from_disk else local_plan(rows)
    if t is None:
        f = rollback_to_full(st, rows, new)
        events("rollback", rank=st.s, to=f, era=era, disk=from_disk)
        # A new era on every recovery: a redone iteration snapshots under a newer version.
        return era + 1, "disk" if from_disk else "global"
    if not new:
        if st.done == t + 1:
            for b in range(BLOCKS):
                st.load_block(b, st.kept[b])
            st.done, st.kept = t, None
        log.discard(t + 1)
        for n in neighbours(st.s):
            need = int(rows[n, BLK:].min()) + 1
            if rows[n, NEW] and need <= t:
                log.replay(n, need, t)
    else:
        rebuild(st, t)
    events("plan", rank=st.s, meet=t, rows=rows.tolist())  # not t=: that is the event's time
    return era + 1, "local"


def restore_snapshots(persist_dir: str | None, events, st: Stage) -> bool:
    """From the other stages' memory; from the persisted version where no
    memory holds some shards. Returns whether it came from disk."""
    from torch_eccl import snapshot

    try:
        st.version = snapshot.restore()
        return False
    except snapshot.ShardsLost as e:
        if not persist_dir:
            raise
        events("lost", rank=st.s, why=str(e).splitlines()[0][:300])
    try:
        st.version = snapshot.load(persist_dir)
    except RuntimeError as e:
        if "holds no version" in str(e):
            raise SystemExit(f"ettr_pipeline: stage {st.s}: state lost from every memory and disk: {e}") from e
        raise
    events("loaded", rank=st.s, version=st.version)
    return True


def persist_after(st: Stage, it: int, persist_dir: str | None):
    """One iteration after a full snapshot was put (nothing put since, so
    every stage's newest committed version is that one): persisted in the
    background, the previous persist long done."""
    from torch_eccl import snapshot

    if not persist_dir or it <= 2 or (it - 2) % FULL_EVERY:
        return
    snapshot.wait(st.version)
    snapshot.persist_wait()
    snapshot.persist(persist_dir)


def warm_up():
    """What a process does the first time (torch's lazy imports of the
    optimizer's machinery, autograd's engine), done before it waits."""
    st = Stage(0)
    x, y = data(0, 0)
    for b in range(BLOCKS):
        block_loss(st.blocks[b](x[:, st.sl(b)].contiguous()), y[:, st.sl(b)].contiguous()).backward()
    step_blocks(st, range(BLOCKS))
    st.load_block(0, st.block_state(0))


def loss_fields(st: Stage, loss_sum: float) -> dict:
    """What perf/ettr.py sums over ranks: only the last stage has rows."""
    rows = MICRO * ROWS if st.last else 0
    return {"loss": loss_sum / max(1, rows), "loss_sum": loss_sum, "rows": rows}


def digest(st: Stage) -> str:
    mine = st.flat()
    every = [torch.empty_like(mine) for _ in range(STAGES)]
    dist.all_gather(every, mine)
    return hashlib.sha256(b"".join(t.numpy().tobytes() for t in every)).hexdigest()[:16]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--step-ms", type=float, default=100)
    ap.add_argument("--events", required=True)
    ap.add_argument("--persist-dir", help="the second level: full snapshots persisted here (every host reaches it)")
    ap.add_argument("--die-at", metavar="STAGE:ITERATION", default="",
                    help="tests: that stage's first process SIGKILLs itself in that iteration before it sends its "
                         "last gradient back (the stages after it have stepped: one iteration ahead of the others)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    events = Events(args.events)
    events("start", restart=0, role=os.environ.get("ECCL_ROLE", "rank"), nice=STARTED_AT_NICE)
    import torch_eccl
    from torch_eccl import log, snapshot

    warm_up()  # a standby's first module, optimizer and backward cost a second; not after the failure
    torch_eccl.init_process_group()  # a stage, or a standby that waits for one
    events("joined", above=late_start.joined())
    if dist.get_world_size() != STAGES:
        raise SystemExit(f"ettr_pipeline: {STAGES} stages, one per rank; run with -np {STAGES}")
    st = Stage(dist.get_rank())
    new = torch_eccl.stats()["joined_epoch"] != 1
    if args.die_at and not new:  # the first process only: its replacement redoes the iteration
        global DIE_AT
        DIE_AT = tuple(int(x) for x in args.die_at.split(":"))
    snapshot.configure(replicas=2)  # any two stages may die together
    log.configure(64 << 20, peers=neighbours(st.s))
    era, loss = 0, float("nan")
    if not new:
        first_snapshot(st, args.persist_dir)
        events("ready", rank=st.s, world=STAGES, step=0)
    # A promoted standby joins the recovery in progress (it is in the new
    # view already); anyone whose op fails recovers and starts it over. A
    # replacement stays "new" until its rebuild is through.
    failed, joining, refusals = new, new, 0
    while True:
        try:
            if failed:
                if not joining:
                    torch_eccl.recover("replace")
                    events("recovered", rank=st.s, world=STAGES)
                joining = False
                from_disk = restore_snapshots(args.persist_dir, events, st)  # what was put since is dropped
                events("restored", rank=st.s, version=st.version)
                era, kind = recover_stage(st, new, era, events, from_disk)
                new = failed = False
                events("ready", rank=st.s, world=STAGES, step=st.done, how=kind)
            if st.done >= args.steps:
                snapshot.wait(st.version)  # every stage put the same versions: none left replicating
                final = digest(st)
                break
            started = time.monotonic()
            it = st.done + 1
            loss = sum(micro_batch(st, it, mb) for mb in range(MICRO))
            # Kept only now, at the step: a stage that finished `it` and
            # failed in `it` + 1 must still hold the state before `it`'s step
            # (kept at the top of the iteration, it held `it`'s own, and a
            # rollback from `it` to `it` - 1 applied `it`'s step twice).
            st.kept = [st.block_state(b) for b in range(BLOCKS)]
            step_blocks(st, range(BLOCKS))
            st.done = it
            events("step", rank=st.s, world=STAGES, step=it, **loss_fields(st, loss))
            snapshot_after(st, it, era)
            persist_after(st, it, args.persist_dir)
            time.sleep(max(0.0, args.step_ms / 1000 - (time.monotonic() - started)))
        except RuntimeError as e:
            events("fail", rank=st.s, step=st.done, why=str(e).splitlines()[0][:300])
            failed = True
            if isinstance(e, snapshot.ShardsLost):  # with no second level to go back to
                raise SystemExit(f"ettr_pipeline: stage {st.s}: state lost from every memory: {e}") from e
            refusals = refusals + 1 if "refused" in str(e) else 0
            if refusals >= 3:  # each waited ECCL_REPLACE_WAIT_MS for standbys that did not come
                raise SystemExit(f"ettr_pipeline: stage {st.s}: recovery refused {refusals} times: {e}") from e
    mine = hashlib.sha256(st.flat().numpy().tobytes()).hexdigest()[:16]
    events("done", rank=st.s, world=STAGES, step=st.done, digest=final, stage_digest=mine, **loss_fields(st, loss))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
