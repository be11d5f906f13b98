"""torch_eccl.sandbox: a standby's group (reconfigure regime) runs the
training step before it has a rank, as rank 1 of 3, every collective
answered locally (its own input where a one-rank group returns it, zeros
for others' data) while the job trains; rank 1 records a step with
sandbox_record and the (eager) standby's next steps answer with those real
outputs; rank 1 is killed, the survivors recover, try_promotion() takes
the standby in, and the same group object runs real collectives with
them."""

import os
import signal
from datetime import timedelta

import torch
import torch.distributed as dist

import world

TIMEOUT = timedelta(seconds=60)


def _env(job_id, role, rank=-1, nranks=-1):
    os.environ.update({"ECCL_UNIQUE_ID": job_id, "ECCL_ROLE": role, "ECCL_RANK": str(rank), "ECCL_NRANKS": str(nranks)})


def _input(rank):
    return torch.arange(12, dtype=torch.float32) + 100.0 * (rank + 1)


def _job_step(rank):
    """The step the ranks run (and rank 1 records): three collectives."""
    y = _input(rank)
    dist.all_reduce(y)
    parts = [torch.empty(12) for _ in range(3)]
    dist.all_gather(parts, _input(rank))
    b = _input(rank)
    dist.broadcast(b, src=0)


def _sandboxed_step():
    """The same step in the sandbox: the sandbox's own answers until a
    recording came, then rank 1's real outputs. True once replayed."""
    import torch_eccl

    before = torch_eccl.stats()["sandbox_replayed"]
    x = _input(1)
    y = x.clone()
    dist.all_reduce(y)
    parts = [torch.full((12,), -1.0) for _ in range(3)]
    dist.all_gather(parts, x)
    b = x.clone()
    dist.broadcast(b, src=0)
    replayed = torch_eccl.stats()["sandbox_replayed"] - before
    if replayed == 0:
        assert torch.equal(y, x), "all_reduce in the sandbox is not its own input"
        assert torch.equal(parts[1], x) and not parts[0].any() and not parts[2].any(), parts
        assert not b.any(), "a broadcast from another rank is not zeros"
        return False
    if replayed != 3:
        return False  # the recording came in mid-step
    assert torch.equal(y, _input(0) + _input(1) + _input(2)), y
    assert all(torch.equal(parts[r], _input(r)) for r in range(3)), parts
    assert torch.equal(b, _input(0)), b
    return True


def body(index, _n, _port, job_id, ready_dir):
    import torch_eccl

    if index == 3:
        _env(job_id, "standby")
        os.environ["ECCL_PREPARE"] = "eager"  # members keep connections to it: recordings reach it
        dist.init_process_group("eccl", rank=0, world_size=1, store=dist.HashStore(), timeout=TIMEOUT,
                                enable_reconfigure=True)
        torch_eccl.sandbox(3, 1)
        assert (dist.get_rank(), dist.get_world_size()) == (1, 3)
        assert torch_eccl.backend().is_standby()
        steps = replayed = 0
        while not torch_eccl.try_promotion():
            replayed += _sandboxed_step()
            steps += 1
            # At least one replayed: under load the job outruns the standby
            # and two recordings can be replayed by its third step (== 1
            # then never held, and the ranks looped until killed, 120 s).
            if steps >= 3 and replayed >= 1:
                assert torch_eccl.stats()["sandbox_recordings_received"] >= 1
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
    for step in range(100000):
        if index == 1 and step % 5 == 0:
            torch_eccl.sandbox_record(3)
        _job_step(index)
        ready = torch.tensor([1.0 if os.path.exists(os.path.join(ready_dir, "warm")) else 0.0])
        dist.all_reduce(ready, op=dist.ReduceOp.MIN)
        if ready.item():
            break
    else:
        raise AssertionError("the standby never replayed rank 1's recording")
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
