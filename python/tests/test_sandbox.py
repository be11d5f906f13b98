"""torch_eccl.sandbox: a standby's group (reconfigure regime) runs the
training step before it has a rank, as rank 1 of 3, every collective
answered locally (its own input where a one-rank group returns it, zeros
for others' data) while the job trains; rank 1 is killed, the survivors
recover, try_promotion() takes the standby in, and the same group object
runs real collectives with them."""

import os
import signal
from datetime import timedelta

import torch
import torch.distributed as dist

import world

TIMEOUT = timedelta(seconds=60)


def _env(job_id, role, rank=-1, nranks=-1):
    os.environ.update({"ECCL_UNIQUE_ID": job_id, "ECCL_ROLE": role, "ECCL_RANK": str(rank), "ECCL_NRANKS": str(nranks)})


def _sandboxed_step(step):
    x = torch.arange(12, dtype=torch.float32) + step
    y = x.clone()
    dist.all_reduce(y)
    assert torch.equal(y, x), "all_reduce in the sandbox is not its own input"
    parts = [torch.full((12,), -1.0) for _ in range(3)]
    dist.all_gather(parts, x)
    assert torch.equal(parts[1], x) and not parts[0].any() and not parts[2].any(), parts
    b = x.clone()
    dist.broadcast(b, src=0)
    assert not b.any(), "a broadcast from another rank is not zeros"


def body(index, _n, _port, job_id, ready_dir):
    import torch_eccl

    if index == 3:
        _env(job_id, "standby")
        dist.init_process_group("eccl", rank=0, world_size=1, store=dist.HashStore(), timeout=TIMEOUT,
                                enable_reconfigure=True)
        torch_eccl.sandbox(3, 1)
        assert (dist.get_rank(), dist.get_world_size()) == (1, 3)
        assert torch_eccl.backend().is_standby()
        steps = 0
        while not torch_eccl.try_promotion():
            _sandboxed_step(steps)
            steps += 1
            if steps == 3:
                open(os.path.join(ready_dir, "warm"), "w").close()
        assert not torch_eccl.backend().is_standby()
        assert (dist.get_rank(), dist.get_world_size()) == (1, 3), (dist.get_rank(), dist.get_world_size())
        t = torch.full((8,), 2.0)
        dist.all_reduce(t)
        assert t.eq(6.0).all(), t
        dist.destroy_process_group()
        return steps
    _env(job_id, "rank", index, 3)
    torch_eccl.init_process_group(timeout=TIMEOUT)
    while True:
        ready = torch.tensor([1.0 if os.path.exists(os.path.join(ready_dir, "warm")) else 0.0])
        dist.all_reduce(ready, op=dist.ReduceOp.MIN)
        if ready.item():
            break
    if index == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        for _ in range(1000):
            dist.all_reduce(torch.ones(4))
        raise AssertionError("rank 1's death went unnoticed")
    except RuntimeError as e:
        assert "rank 1" in str(e), str(e)
    torch_eccl.recover("replace")
    t = torch.full((8,), 2.0)
    dist.all_reduce(t)
    assert t.eq(6.0).all(), t
    dist.destroy_process_group()
    return 0


def test_a_standby_warms_up_in_the_sandbox_and_its_group_becomes_the_rank(monkeypatch, tmp_path):
    import torch_eccl

    monkeypatch.setenv("ECCL_REPLACE_WAIT_MS", "30000")
    out = world.run(4, body, torch_eccl.make_job(), str(tmp_path), timeout=120, env={"ECCL_TIMEOUT_MS": "10000"})
    assert out[1].status == "died", out
    steps = world.values([out[0], out[2], out[3]])[2]
    assert steps >= 3, steps
