"""What PyTorch's own distributed tests expect of a backend, beyond the ops
(torch/testing/_internal/distributed/distributed_test.py): subgroups that
share a store prefix, and c10d's debug wrapper."""

from __future__ import annotations

import torch
import torch.distributed as dist

import world


def _subgroups(rank, n, port):
    world.init(rank, n, port)
    # Disjoint subgroups of one rank each: c10d gives them one store
    # prefix, and each must still get an eccl job of its own.
    mine, groups = dist.new_subgroups(group_size=1)
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t, group=mine)
    pairs, _ = dist.new_subgroups(group_size=2)
    u = torch.tensor([float(rank + 1)])
    dist.all_reduce(u, group=pairs)
    dist.destroy_process_group()
    return t.item(), u.item()


def test_new_subgroups_get_a_job_each():
    outs = world.run(4, _subgroups, timeout=120)
    for rank, o in enumerate(outs):
        assert o.status == "ok", o
        pair = [r for r in (0, 1, 2, 3) if r // 2 == rank // 2]
        assert o.value == (float(rank + 1), float(sum(r + 1 for r in pair))), o


def _debug_detail(rank, n, port):
    world.init(rank, n, port)
    t = torch.tensor([float(rank)])
    dist.all_reduce(t)
    objs = [None] * n
    dist.all_gather_object(objs, {"rank": rank})
    sub = dist.new_group([0, 1])
    if rank in (0, 1):
        got = [None] * 2
        dist.all_gather_object(got, rank, group=sub)
        assert got == [0, 1], got
    mismatch = ""
    try:  # ranks that disagree about a collective: eccl's call check (or c10d's wrapper) names both calls
        if rank == 0:
            dist.all_reduce(torch.zeros(3))
        else:
            dist.all_reduce(torch.zeros(5))
    except RuntimeError as e:
        mismatch = str(e)
    dist.destroy_process_group()
    return t.item(), [o["rank"] for o in objs], mismatch


def test_torch_distributed_debug_detail_works_and_catches_mismatches():
    outs = world.run(2, _debug_detail, timeout=120, env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"})
    for o in outs:
        assert o.status == "ok", o
        total, ranks, mismatch = o.value
        assert total == 1.0 and ranks == [0, 1], o
        assert "ranks disagree about collective" in mismatch or "Detected mismatch between collectives" in mismatch, o
