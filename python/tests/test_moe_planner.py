"""torch_eccl.moe's planner (Lazarus): replicas from load, placements,
recovery probability and migration plans, through eccl's C API."""

import pytest
import torch

import torch_eccl.moe as moe


def test_replicas_follow_the_load_and_fill_every_slot():
    load = [100, 50, 10, 10, 5, 5, 1, 1]
    reps = moe.allocate_replicas(load, 4, 6, 2)
    assert sum(reps) == 24 and min(reps) >= 2
    assert reps[0] == max(reps) and reps[0] > reps[-1]
    with pytest.raises(ValueError, match="ecclMoeAllocateReplicas"):
        moe.allocate_replicas(load, 2, 3, 2)  # 16 replicas at least, 6 slots


def test_max_overlap_survives_more_failures_than_spread():
    # Zipf-like load, 10 nodes x 6 slots, at least two replicas (the figures of dispatch_perf).
    load = [1.0 / (e + 1) for e in range(16)]
    reps = moe.allocate_replicas(load, 10, 6, 2)
    placements = {p: moe.place(reps, 10, 6, p) for p in ("max_overlap", "spread", "compact")}
    for p in placements.values():
        assert sorted(e for node in p for e in node) == sorted(e for e, r in enumerate(reps) for _ in range(r))
        assert all(len(node) <= 6 for node in p)
    one = moe.recovery_probability(placements["max_overlap"], 16, 1)
    assert one["probability"] == 1.0 and one["exact"] == 1.0
    three = {p: moe.recovery_probability(pl, 16, 3)["probability"] for p, pl in placements.items()}
    assert three["max_overlap"] > three["spread"] > three["compact"], three
    table = moe.table_from_placement(placements["max_overlap"], 16)
    assert table.shape == (16, 10) and table.sum(1).tolist() == reps
    with pytest.raises(ValueError, match="policy"):
        moe.place(reps, 10, 6, "random")


def test_a_migration_copies_only_what_the_survivors_lack():
    reps = moe.allocate_replicas([1.0] * 16, 4, 12, 2)
    before = moe.place(reps, 4, 12)
    after = moe.place(moe.allocate_replicas([1.0] * 16, 3, 12, 2), 3, 12)
    current = [list(n) for n in before]
    current[2] = []
    plan_to_node, transfers = moe.plan_migration(current, [2], after, 16)
    assert sorted(plan_to_node) == [0, 1, 3]
    for e, src, dst in transfers:
        assert src != 2 and dst != 2 and e in before[src] and e not in before[dst]
    # Every plan node ends with its experts: what it had plus what it receives.
    for p, node in enumerate(plan_to_node):
        have = set(before[node]) | {e for e, _, dst in transfers if dst == node}
        assert set(after[p]) <= have
    # An expert whose every replica is gone is named.
    lost = [list(n) for n in before]
    gone = lost[0][0]
    for n in lost:
        while gone in n:
            n.remove(gone)
    with pytest.raises(ValueError, match=f"expert {gone}"):
        moe.plan_migration(lost, [1], after, 16)


def test_every_expert_sits_on_as_many_nodes_as_its_replicas():
    # 16 experts x 3 on 4 nodes x 12 slots: the groups once left experts
    # 12-15 three times on one node (the example's first placement; a soak
    # run that killed that rank lost expert 12).
    reps = moe.allocate_replicas([1.0] * 16, 4, 12, 2)
    placement = moe.place(reps, 4, 12)
    for e, r in enumerate(reps):
        assert sum(e in node for node in placement) == min(r, 4), (e, placement)
    assert moe.recovery_probability(placement, 16, 1)["probability"] == 1.0
