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


def machines_of(e, placement, hosts):
    return {hosts[n] for n, held in enumerate(placement) if e in held}


@pytest.mark.parametrize("nodes,slots,hosts,load,spanning", [
    (4, 12, [0, 0, 1, 1], [1.0] * 16, 16),                                 # the example, two ranks per machine
    (8, 6, [0, 0, 1, 1, 2, 2, 3, 3], [1.0 / (e + 1) for e in range(16)], 16),  # Zipf, four machines
    # The example shrunk by a rank: 16 experts do not fit in machine 1's 12 slots.
    (3, 12, [0, 0, 1], [1.0] * 16, 12),
    (6, 6, ["a", "a", "a", "b", "c", "c"], [1.0 / (e + 1) for e in range(12)], 12),  # uneven machines, any labels
])
def test_across_machines_the_experts_sit_on_as_many_machines_as_fit(nodes, slots, hosts, load, spanning):
    experts = len(load)
    reps = moe.allocate_replicas(load, nodes, slots, 2)
    plain, aware = moe.place(reps, nodes, slots), moe.place(reps, nodes, slots, hosts=hosts)
    assert sorted(e for n in aware for e in n) == sorted(e for n in plain for e in n)
    assert [len(n) for n in aware] == [len(n) for n in plain]
    machines = len(set(hosts))
    assert sum(len(machines_of(e, aware, hosts)) > 1 for e in range(experts)) == spanning, aware
    for e, r in enumerate(reps):
        if spanning == experts:
            assert len(machines_of(e, aware, hosts)) == min(r, machines), (e, aware)
        assert sum(e in n for n in aware) == sum(e in n for n in plain), (e, aware)  # on as many ranks
    # Where every expert fits on two machines, no machine's loss loses one;
    # no rank's loss ever does.
    one = moe.recovery_probability(aware, experts, 1, hosts=hosts)["probability"]
    assert one == 1.0 if spanning == experts else one >= moe.recovery_probability(plain, experts, 1, hosts=hosts)["probability"]
    assert moe.recovery_probability(aware, experts, 1)["probability"] == 1.0
    two = {name: moe.recovery_probability(p, experts, 2, hosts=hosts)["probability"]
           for name, p in (("aware", aware), ("plain", plain))} if machines > 2 else None
    if two:
        assert two["aware"] >= two["plain"], two
    # The same call places alike on every rank.
    assert moe.place(reps, nodes, slots, hosts=hosts) == aware


def test_rank_placement_alone_can_leave_an_expert_on_one_machine():
    """Why hosts matter: by rank, Zipf's load on four machines of two
    ranks leaves experts whose replicas share a machine."""
    reps = moe.allocate_replicas([1.0 / (e + 1) for e in range(16)], 8, 6, 2)
    hosts = [0, 0, 1, 1, 2, 2, 3, 3]
    plain = moe.place(reps, 8, 6)
    assert moe.recovery_probability(plain, 16, 1, hosts=hosts)["probability"] < 1.0
    assert moe.recovery_probability(moe.place(reps, 8, 6, hosts=hosts), 16, 1, hosts=hosts)["probability"] == 1.0
    with pytest.raises(ValueError, match="3 hosts given for 8 nodes"):
        moe.place(reps, 8, 6, hosts=[0, 0, 1])
