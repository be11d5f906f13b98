"""torch_eccl.snapshot: a rank's model and optimizer state (no replica
anywhere: each rank trains its own shard) put every step, sparsely (the
model's tensors every other step, the optimizer's every step), replicated
into the other ranks' memory; rank 2 is SIGKILLed, a standby takes its rank,
restores its state_dict from the survivors' memory and loads it into a fresh
model and optimizer: every tensor equals what rank 2 had at the version it
comes from, bit for bit, and the job trains on."""

import os
import signal
from datetime import timedelta

import torch
import torch.distributed as dist

import world

TIMEOUT = timedelta(seconds=60)
STEPS = 7


def _env(job_id, role, rank=-1, nranks=-1):
    os.environ.update({"ECCL_UNIQUE_ID": job_id, "ECCL_ROLE": role, "ECCL_RANK": str(rank), "ECCL_NRANKS": str(nranks)})


def _shard(rank):
    torch.manual_seed(100 + rank)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.Tanh(), torch.nn.Linear(128, 16))
    optim = torch.optim.Adam(model.parameters(), lr=1e-2)
    return model, optim


def _train_step(rank, step, model, optim):
    g = torch.Generator().manual_seed(1000 * rank + step)
    x, y = torch.randn(32, 64, generator=g), torch.randn(32, 16, generator=g)
    optim.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    optim.step()


def _state(model, optim):
    return {"model": model.state_dict(), "optim": optim.state_dict()}


def _model_names(model):
    return {f"state.model.{k}" for k in model.state_dict()}


def _states_until(rank, last):
    """Rank `rank`'s state after each step up to `last`, recomputed locally."""
    model, optim = _shard(rank)
    out = {}
    for step in range(1, last + 1):
        _train_step(rank, step, model, optim)
        out[step] = {k: v.clone() for k, v in model.state_dict().items()}, {
            k: {n: t.clone() if torch.is_tensor(t) else t for n, t in s.items()}
            for k, s in optim.state_dict()["state"].items()
        }
    return out


def body(index, _n, _port, job_id):
    import torch_eccl
    from torch_eccl import snapshot

    if index == 4:
        _env(job_id, "standby")
        torch_eccl.init_process_group(timeout=TIMEOUT)  # blocks until promoted
        rank = dist.get_rank()
        assert rank == 2, rank
        snapshot.configure(replicas=1)
        version = snapshot.restore()
        state = snapshot.get_state_dict()
        versions = snapshot.versions()
        model, optim = _shard(rank)
        model.load_state_dict(state["model"])
        optim.load_state_dict(state["optim"])
        history = _states_until(rank, version)
        for name, t in model.state_dict().items():
            v = versions[f"state.model.{name}"]
            assert v == version - (version % 2), (name, v, version)  # the model is put on even steps
            assert torch.equal(t, history[v][0][name]), f"model {name} at version {v}"
        for key, s in optim.state_dict()["state"].items():
            for n, t in s.items():
                assert torch.equal(t, history[version][1][key][n]), f"optimizer {key}.{n}"
        _train_step(rank, version + 1, model, optim)
        dist.all_reduce(torch.ones(4))
        dist.destroy_process_group()
        return version
    _env(job_id, "rank", index, 4)
    torch_eccl.init_process_group(timeout=TIMEOUT)
    snapshot.configure(replicas=1)
    model, optim = _shard(index)
    for step in range(1, STEPS + 1):
        _train_step(index, step, model, optim)
        names = None if step % 2 == 0 else {n for n in _flatten_names(model, optim) if n not in _model_names(model)}
        snapshot.put_state_dict(step, _state(model, optim), names=names)
        snapshot.commit(step)
        snapshot.wait(step, TIMEOUT)
        dist.all_reduce(torch.ones(4))
    if index == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        for _ in range(1000):
            dist.all_reduce(torch.ones(4))
        raise AssertionError("rank 2's death went unnoticed")
    except RuntimeError as e:
        assert "rank 2" in str(e), str(e)
    torch_eccl.recover("replace")
    version = snapshot.restore()
    assert version == STEPS, version
    dist.all_reduce(torch.ones(4))
    dist.destroy_process_group()
    return version


def _flatten_names(model, optim):
    from torch_eccl.snapshot import _flatten

    names = {}
    _flatten(_state(model, optim), "state", names)
    return set(names)


def test_a_replacement_restores_a_state_dict_from_peers_memory(monkeypatch):
    import torch_eccl

    monkeypatch.setenv("ECCL_REPLACE_WAIT_MS", "30000")
    out = world.run(5, body, torch_eccl.make_job(), timeout=150, env={"ECCL_TIMEOUT_MS": "10000"})
    assert out[2].status == "died", out
    assert world.values([out[0], out[1], out[3], out[4]]) == [STEPS] * 4, out
