"""torch_eccl.moe over real processes: the layer's output and the
gradients of x, topk_weights and every expert replica's parameters (after
reduce_replica_grads) against a one-process reference, on 2, 3 and 4 ranks
and several routings; bad input named on every rank; a dead rank named."""

import os

import pytest
import torch
import torch.distributed as dist

import moe_reference as ref
import world

EXPERTS, HIDDEN, TOKENS = 7, 16, 24
CASES = ("random", "skewed", "one_expert")


def _one_step(rank, n, case, k, dtype, table):
    import torch_eccl.moe as moe

    W, b = ref.experts_params(EXPERTS, HIDDEN, dtype)
    x, ids, w = ref.routing(case, rank, TOKENS, k, EXPERTS, HIDDEN, dtype)
    x.requires_grad_(True)
    w.requires_grad_(True)
    # This rank's replicas: one (W, b) pair per replica, equal to the expert's.
    replicas = {e: [(W[e].clone().requires_grad_(True), b[e].clone().requires_grad_(True))
                    for _ in range(int(table[e, rank]))] for e in range(EXPERTS)}
    inputs, handle = moe.dispatch(x, ids, table)
    used = {e: 0 for e in range(EXPERTS)}
    outputs = []
    for e, rows in zip(handle.local_experts, inputs):
        We, be = replicas[e][used[e]]
        used[e] += 1
        outputs.append(rows @ We + be)
    y = moe.combine(outputs, w, handle)
    g = torch.Generator().manual_seed(5 + rank)
    upstream = torch.randn(y.shape, generator=g, dtype=torch.float64).to(dtype)
    (y * upstream).sum().backward()
    grads = {e: [p.grad if p.grad is not None else torch.zeros_like(p) for pair in replicas[e] for p in pair]
             for e in range(EXPERTS) if replicas[e]}
    moe.reduce_replica_grads({e: grads[e][0::2] for e in grads}, table)
    moe.reduce_replica_grads({e: grads[e][1::2] for e in grads}, table)
    return y.detach(), x.grad, w.grad, grads


def _reference(n, case, k, dtype):
    W, b = ref.experts_params(EXPERTS, HIDDEN, dtype)
    W.requires_grad_(True)
    b.requires_grad_(True)
    ys, xs, ws = [], [], []
    loss = 0
    for r in range(n):
        x, ids, w = ref.routing(case, r, TOKENS, k, EXPERTS, HIDDEN, dtype)
        x.requires_grad_(True)
        w.requires_grad_(True)
        y = ref.layer(x, ids, w, W, b)
        g = torch.Generator().manual_seed(5 + r)
        loss = loss + (y * torch.randn(y.shape, generator=g, dtype=torch.float64).to(dtype)).sum()
        ys.append(y)
        xs.append(x)
        ws.append(w)
    loss.backward()
    return [y.detach() for y in ys], [x.grad for x in xs], [w.grad for w in ws], W.grad, b.grad


def _close(a, b, dtype, what):
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(a.to(b.dtype), b, **tol, msg=lambda m: f"{what}: {m}")


def _numerics(rank, n, port):
    world.init(rank, n, port)
    checked = 0
    for case in CASES:
        for k in (1, 2, 3):
            for dtype in (torch.float32, torch.float64):
                table = ref.replica_table(case, EXPERTS, n)
                got = _one_step(rank, n, case, k, dtype, table)
                again = _one_step(rank, n, case, k, dtype, table)
                ys, gxs, gws, gW, gb = _reference(n, case, k, dtype)
                where = f"rank {rank}/{n} {case} k={k} {dtype}"
                _close(got[0], ys[rank], dtype, f"{where} y")
                _close(got[1], gxs[rank], dtype, f"{where} grad x")
                _close(got[2], gws[rank], dtype, f"{where} grad topk_weights")
                for e, gs in got[3].items():
                    for i, t in enumerate(gs):
                        _close(t, gW[e] if i % 2 == 0 else gb[e], dtype, f"{where} grad of expert {e} replica {i // 2}")
                    # Every holder's sum has the same bits.
                    assert all(torch.equal(t, gs[i % 2]) for i, t in enumerate(gs)), where
                # Repeated runs give the same bits.
                assert torch.equal(got[0], again[0]) and torch.equal(got[1], again[1]), where
                assert torch.equal(got[2], again[2]), where
                assert all(torch.equal(a, c) for e in got[3] for a, c in zip(got[3][e], again[3][e])), where
                checked += 1
    dist.destroy_process_group()
    return checked


@pytest.mark.parametrize("n", [2, 3, 4])
def test_layer_and_gradients_match_a_one_process_reference(n):
    out = world.run(n, _numerics, timeout=300)
    assert all(o.status == "ok" for o in out), out
    assert all(o.value == len(CASES) * 3 * 2 for o in out), out


def _bad_input(rank, n, port):
    import torch_eccl.moe as moe

    world.init(rank, n, port)
    messages = []
    for what in ("id", "no_replica", "table"):
        x, ids, w = ref.routing("random", rank, TOKENS, 2, EXPERTS, HIDDEN, torch.float32)
        table = ref.replica_table("random", EXPERTS, n)
        if what == "id" and rank == 1:
            ids = ids.to(torch.int32)
            ids[5, 1] = EXPERTS + 3
        if what == "no_replica":
            ids[:, 0] = EXPERTS - 1  # the expert with no replica
        if what == "table" and rank == 2:
            table = table.clone()
            table[0, 0] += 1
        try:
            moe.dispatch(x, ids, table)
        except Exception as e:  # noqa: BLE001  (the message is the result)
            messages.append(str(e))
        else:
            messages.append("no error")
    # Nothing was lost: the group still works.
    t = torch.ones(3)
    dist.all_reduce(t)
    dist.destroy_process_group()
    return messages, float(t[0])


def test_bad_input_is_named_on_every_rank():
    out = world.run(3, _bad_input, timeout=120)
    assert all(o.status == "ok" for o in out), out
    expect = ["rank 1's token 5 choice 1 names expert 10, outside [0, 7)", "expert 6",
              "replica table differs between ranks: rank"]
    for o in out:
        messages, total = o.value
        assert total == 3.0, o
        for msg, want in zip(messages, expect):
            assert want in msg, (o.rank, msg)
    # Rank 2's table is the odd one: ranks 0 and 1 name it.
    assert "rank 2's" in out[0].value[0][2] and "rank 2's" in out[1].value[0][2]


def _python_checks(rank, n, port):
    import torch_eccl.moe as moe

    world.init(rank, n, port)
    x, ids, w = ref.routing("random", rank, TOKENS, 2, EXPERTS, HIDDEN, torch.float32)
    table = ref.replica_table("random", EXPERTS, n)
    errors = []
    for bad in (lambda: moe.dispatch(x, ids[:-1], table), lambda: moe.dispatch(x, ids, table[:, :1])):
        try:
            bad()
        except ValueError as e:
            errors.append(str(e))
    inputs, handle = moe.dispatch(x, ids, table)
    try:
        moe.combine(inputs[:-1] if inputs else [torch.zeros(1, HIDDEN)], w, handle)
    except ValueError as e:
        errors.append(str(e))
    y = moe.combine(inputs, w, handle)
    try:
        moe.reduce_replica_grads({0: []}, table)
    except ValueError as e:
        errors.append(str(e))
    dist.destroy_process_group()
    return errors, tuple(y.shape)


def test_wrong_shapes_raise_before_any_exchange():
    out = world.run(2, _python_checks, timeout=120)
    assert all(o.status == "ok" for o in out), out
    for o in out:
        errors, shape = o.value
        assert shape == (TOKENS, HIDDEN)
        assert "topk_ids must be [tokens, k]" in errors[0]
        assert "replicas must be [experts, world]" in errors[1]
        assert "expert outputs for" in errors[2] or "has shape" in errors[2]
        assert len(errors) == 4 and "reduce_replica_grads: " in errors[3], errors


def _dies_midway(rank, n, port, where):
    import torch_eccl.moe as moe

    world.init(rank, n, port)
    x, ids, w = ref.routing("random", rank, TOKENS, 2, EXPERTS, HIDDEN, torch.float32)
    table = ref.replica_table("random", EXPERTS, n)
    x.requires_grad_(True)
    if where == "dispatch" and rank == 2:
        os._exit(9)
    try:
        inputs, handle = moe.dispatch(x, ids, table)
        if where == "combine" and rank == 2:
            os._exit(9)
        y = moe.combine([r * 2 for r in inputs], w, handle)
        if where == "backward" and rank == 2:
            os._exit(9)
        y.sum().backward()
        if where == "replica_grads" and rank == 2:
            os._exit(9)
        moe.reduce_replica_grads({e: [torch.ones(4)] * int(table[e, rank]) for e in range(EXPERTS)}, table)
    except Exception as e:  # noqa: BLE001
        return str(e)
    return "no error"


@pytest.mark.parametrize("where", ["dispatch", "combine", "backward", "replica_grads"])
def test_a_dead_rank_is_named_by_every_pending_call(where):
    out = world.run(3, _dies_midway, where, timeout=90, env={"ECCL_TIMEOUT_MS": "20000"})
    assert out[2].status in ("died", "missing") or out[2].exitcode == 9, out
    for o in out[:2]:
        assert o.status == "ok", out
        assert "rank 2" in o.value, (where, o.value)
