"""The pipeline proof through PyTorch: four stages (one process each, no
replica), boundary sends logged (torch_eccl.log), every two iterations a
different quarter of each stage's parameter blocks snapshotted into the
other ranks' memory (torch_eccl.snapshot), logs truncated at the oldest
block a stage still uses. Stage 2 is SIGKILLed in the middle of an
iteration; a standby takes its rank, restores its blocks from the
survivors' memory, its neighbours replay their logs from the oldest block's
version, only it recomputes (block by block from each block's version),
everyone redoes the interrupted iteration, and the final parameters equal a
failure-free run bit for bit. No file is read."""

import os
import signal
from datetime import timedelta

import torch
import torch.distributed as dist

import world

TIMEOUT = timedelta(seconds=60)
STAGES, MICRO, ITERS, HIDDEN, BLOCKS, EVERY = 4, 2, 8, 256, 4, 2
BLOCK = HIDDEN // BLOCKS
FAIL_ITER, FAIL_MICRO, VICTIM = 7, 1, 2
LR = 1e-3


def _env(job_id, role, rank=-1, nranks=-1):
    os.environ.update({"ECCL_UNIQUE_ID": job_id, "ECCL_ROLE": role, "ECCL_RANK": str(rank), "ECCL_NRANKS": str(nranks)})


class Stage:
    def __init__(self, s):
        self.s = s
        self.w = 1.0 + 0.001 * (torch.arange(HIDDEN, dtype=torch.float32) + 7 * s)
        self.grad = torch.zeros(HIDDEN)

    def forward(self, up):
        if self.s == 0:
            return up * self.w
        if self.s < STAGES - 1:
            return up * self.w + (0.5 if self.s == 1 else 0.25)
        g = up * self.w - 1.0
        self.grad += g * up
        return g

    def backward(self, down, up):
        self.grad += down * up
        return down * self.w

    def step(self, sl=slice(None)):
        self.w[sl] -= LR * self.grad[sl] / MICRO
        self.grad[sl] = 0.0

    def replay_grad(self, up, down, sl):
        if self.s == STAGES - 1:
            g = up[sl] * self.w[sl] - 1.0
            self.grad[sl] += g * up[sl]
        else:
            self.grad[sl] += down[sl] * up[sl]


def x_of(it, mb):
    return torch.sin(0.01 * torch.arange(HIDDEN, dtype=torch.float32) + it + 0.1 * mb)


def reference():
    st = [Stage(s) for s in range(STAGES)]
    for it in range(1, ITERS + 1):
        for mb in range(MICRO):
            x = x_of(it, mb)
            a0 = st[0].forward(x)
            a1 = st[1].forward(a0)
            a2 = st[2].forward(a1)
            g3 = st[3].forward(a2)
            g2 = st[2].backward(g3, a1)
            g1 = st[1].backward(g2, a0)
            st[0].backward(g1, x)
        for s in st:
            s.step()
    return [s.w for s in st]


def block_at(it):
    return (it // EVERY) % BLOCKS


def take_snapshot(st, it):
    from torch_eccl import snapshot

    blocks = {f"b{b}": st.w[b * BLOCK:(b + 1) * BLOCK].clone() for b in range(BLOCKS)}
    names = None if it == 0 else {f"w.b{block_at(it)}"}
    snapshot.put_state_dict(it, blocks, prefix="w", names=names)
    snapshot.commit(it)
    committed = [v for n, v in snapshot.versions().items() if n.startswith("w.b")]
    if len(committed) == BLOCKS:  # the logs keep what the oldest block still needs
        from torch_eccl import log

        log.truncate(min(committed) + 1)


def micro_batch(st, it, mb, die):
    """False when a peer's death failed an op."""
    from torch_eccl import log

    s = st.s
    log.set_tag(it, mb)
    try:
        up = x_of(it, mb)
        if s > 0:
            up = torch.empty(HIDDEN)
            dist.recv(up, s - 1)
        if die:  # before its output goes on: every survivor is still inside this iteration
            os.kill(os.getpid(), signal.SIGKILL)
        out = st.forward(up)
        if s == STAGES - 1:
            dist.send(out, s - 1)
            return True
        dist.send(out, s + 1)
        down = torch.empty(HIDDEN)
        dist.recv(down, s + 1)
        g = st.backward(down, up)
        if s > 0:
            dist.send(g, s - 1)
        return True
    except RuntimeError:
        return False


def body(index, _n, _port, job_id):
    import torch_eccl
    from torch_eccl import log, snapshot

    ref = reference()
    peers = lambda s: [p for p in (s - 1, s + 1) if 0 <= p < STAGES]  # noqa: E731
    if index == STAGES:
        _env(job_id, "standby")
        torch_eccl.init_process_group(timeout=TIMEOUT)  # blocks until promoted
        stage = dist.get_rank()
        st = Stage(stage)
        snapshot.configure(replicas=1)
        log.configure(16 << 20, peers=peers(stage))
        restored = snapshot.restore()
        w = snapshot.get_state_dict(prefix="w")
        versions = snapshot.versions()
        block_version = [versions[f"w.b{b}"] for b in range(BLOCKS)]
        for b in range(BLOCKS):
            st.w[b * BLOCK:(b + 1) * BLOCK] = w[f"b{b}"]
        start = min(block_version) + 1
    else:
        _env(job_id, "rank", index, STAGES)
        torch_eccl.init_process_group(timeout=TIMEOUT)
        stage = index
        st = Stage(stage)
        snapshot.configure(replicas=1)
        log.configure(16 << 20, peers=peers(stage))
        take_snapshot(st, 0)
        snapshot.wait(0, TIMEOUT)
        for it in range(1, ITERS + 1):
            ok = all(micro_batch(st, it, mb, stage == VICTIM and it == FAIL_ITER and mb == FAIL_MICRO)
                     for mb in range(MICRO))
            if not ok:
                break
            st.step()
            if it % EVERY == 0:
                take_snapshot(st, it)
        assert it == FAIL_ITER, f"a failure in iteration {it}"
        torch_eccl.recover("replace")
        restored = snapshot.restore()
        st.grad.zero_()
        log.discard(FAIL_ITER)
        start = 0
    assert restored >= EVERY, restored
    agreed = torch.zeros(STAGES, dtype=torch.int64)
    agreed[stage] = start
    dist.all_reduce(agreed, op=dist.ReduceOp.MAX)
    if index == STAGES:
        replayed = 0
        for it in range(start, FAIL_ITER):
            for mb in range(MICRO):
                up = x_of(it, mb)
                if stage > 0:
                    up = torch.empty(HIDDEN)
                    dist.recv(up, stage - 1)
                down = None
                if stage < STAGES - 1:
                    down = torch.empty(HIDDEN)
                    dist.recv(down, stage + 1)
                for b in range(BLOCKS):
                    if block_version[b] < it:
                        st.replay_grad(up, down, slice(b * BLOCK, (b + 1) * BLOCK))
                replayed += 1
            for b in range(BLOCKS):
                if block_version[b] < it:
                    st.step(slice(b * BLOCK, (b + 1) * BLOCK))
        assert replayed == MICRO * (FAIL_ITER - start), replayed
    else:
        for p in peers(stage):
            if agreed[p] > 0:
                log.replay(p, int(agreed[p]), FAIL_ITER - 1)
    for it in range(FAIL_ITER, ITERS + 1):
        for mb in range(MICRO):
            assert micro_batch(st, it, mb, False), f"iteration {it}"
        st.step()
        if it % EVERY == 0:
            take_snapshot(st, it)
    assert torch.equal(st.w, ref[stage]), f"stage {stage}'s final parameters differ from the failure-free run"
    snapshot.wait(ITERS, TIMEOUT)
    dist.destroy_process_group()
    return stage


def test_a_killed_stage_comes_back_from_peers_memory_bit_for_bit(monkeypatch):
    import torch_eccl

    monkeypatch.setenv("ECCL_REPLACE_WAIT_MS", "30000")
    out = world.run(STAGES + 1, body, torch_eccl.make_job(), timeout=150, env={"ECCL_TIMEOUT_MS": "10000"})
    assert out[VICTIM].status == "died", out
    assert sorted(world.values([o for o in out if o.rank != VICTIM])) == [0, 1, 2, 3], out
