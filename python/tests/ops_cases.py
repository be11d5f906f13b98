"""Every op DDP, FSDP and pipeline schedules use, on every dtype torch and
eccl share, run through the eccl backend and through the Gloo backend of
the same torch on the same inputs. Where Gloo cannot run a case (bool
reductions, AVG, PREMUL_SUM, some dtypes) the result is checked against a
reference each rank computes locally from every rank's inputs (inputs are
a function of rank and case, so no communication is involved)."""

from __future__ import annotations

import zlib

import torch
import torch.distributed as dist

DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "int32": torch.int32,
    "int64": torch.int64,
    "bool": torch.bool,
}
REDUCE_OPS = ["SUM", "PRODUCT", "MIN", "MAX", "AVG", "PREMUL_SUM"]


def make(rank: int, dtype: torch.dtype, shape, seed: int, op: str = "") -> torch.Tensor:
    g = torch.Generator().manual_seed(rank * 7919 + seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype.is_floating_point:
        if op == "PRODUCT":  # stay near 1 so products of 4 stay representable
            return (1 + 0.25 * torch.rand(shape, generator=g)).to(dtype)
        return torch.randn(shape, generator=g).to(dtype)
    lo, hi = (1, 3) if op == "PRODUCT" else (0, 30)  # no overflow at 4 ranks
    return torch.randint(lo, hi, shape, generator=g).to(dtype)


def reference_reduce(inputs, op: str, dtype: torch.dtype, factor: float = 0.5) -> torch.Tensor:
    n = len(inputs)
    if dtype == torch.bool:
        stack = torch.stack(inputs)
        return stack.any(0) if op in ("SUM", "MAX") else stack.all(0)
    wide = torch.float64 if dtype.is_floating_point else torch.int64
    stack = torch.stack([t.to(wide) for t in inputs])
    if op == "SUM":
        r = stack.sum(0)
    elif op == "PRODUCT":
        r = stack.prod(0)
    elif op == "MIN":
        r = stack.min(0).values
    elif op == "MAX":
        r = stack.max(0).values
    elif op == "AVG":
        r = stack.sum(0) / n if dtype.is_floating_point else torch.div(stack.sum(0), n, rounding_mode="trunc")
    elif op == "PREMUL_SUM":
        r = (stack * factor).sum(0)
    return r.to(dtype)


def tolerance(dtype: torch.dtype, n: int):
    if dtype in (torch.float16, torch.bfloat16):
        return dict(rtol=2e-2, atol=2e-2 * n)
    if dtype == torch.float32:
        return dict(rtol=1e-5, atol=1e-5 * n)
    if dtype == torch.float64:
        return dict(rtol=1e-12, atol=1e-12 * n)
    return dict(rtol=0, atol=0)


def same(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype, n: int, what: str) -> None:
    if dtype.is_floating_point:
        torch.testing.assert_close(a.double(), b.double(), **tolerance(dtype, n), msg=lambda m: f"{what}: {m}")
    else:
        assert torch.equal(a, b), f"{what}: {a.tolist()} != {b.tolist()}"


def redop(op: str, factor: float = 0.5):
    if op == "PREMUL_SUM":
        return dist._make_nccl_premul_sum(factor)
    return getattr(dist.ReduceOp, op)


def gloo_or_reference(run_gloo, reference, dtype, n, got, what):
    """Compares `got` with Gloo's result when Gloo can run the case, else
    with the local reference; always checks Gloo agrees with the reference."""
    try:
        expected = run_gloo()
        same(expected, reference, dtype, n, what + " (gloo vs reference)")
    except (RuntimeError, ValueError, TypeError):
        expected = reference
    same(got, expected, dtype, n, what)


def reduction_cases():
    cases = []
    for dname, dtype in DTYPES.items():
        for op in REDUCE_OPS:
            if dtype == torch.bool and op in ("AVG", "PREMUL_SUM"):
                continue
            if op == "PREMUL_SUM" and not dtype.is_floating_point:
                continue
            cases.append((dname, op))
    return cases


def check(rank: int, n: int, gloo, case: str) -> None:
    """Runs one case on this rank; raises on a wrong result."""
    kind, dname, *rest = case.split(":")
    dtype = DTYPES[dname]
    seed = zlib.crc32(case.encode()) % 100000
    inputs = [make(r, dtype, (37,), seed, rest[0] if rest else "") for r in range(n)]
    x = inputs[rank]
    if kind == "all_reduce":
        op = rest[0]
        got = x.clone()
        dist.all_reduce(got, op=redop(op))

        def g():
            y = x.clone()
            dist.all_reduce(y, op=redop(op), group=gloo)
            return y

        gloo_or_reference(g, reference_reduce(inputs, op, dtype), dtype, n, got, case)
    elif kind == "all_reduce_noncontiguous":
        base = torch.stack([x, x])  # rows 2x37; the column view is strided
        view = base.t()[:, 0]
        dist.all_reduce(view, op=dist.ReduceOp.SUM)
        same(base[0], reference_reduce(inputs, "SUM", dtype), dtype, n, case)
    elif kind == "reduce":
        op, root = rest[0], n - 1
        got = x.clone()
        dist.reduce(got, dst=root, op=redop(op))
        if rank == root:
            same(got, reference_reduce(inputs, op, dtype), dtype, n, case)
        else:
            same(got, x, dtype, n, case + " (a non-root input must be left alone)")
    elif kind == "all_reduce_coalesced":
        ts = [x.clone(), (x[:5] if dtype == torch.bool else x[:5] * 1).clone()]
        dist.all_reduce_coalesced(ts, op=dist.ReduceOp.MAX)
        same(ts[0], reference_reduce(inputs, "MAX", dtype), dtype, n, case)
        same(ts[1], reference_reduce([i[:5] for i in inputs], "MAX", dtype), dtype, n, case)
    elif kind == "broadcast":
        root = 1 % n
        got = x.clone()
        dist.broadcast(got, src=root)
        same(got, inputs[root], dtype, n, case)
    elif kind == "all_gather":
        outs = [torch.empty_like(x) for _ in range(n)]
        dist.all_gather(outs, x)
        for r in range(n):
            same(outs[r], inputs[r], dtype, n, f"{case} from rank {r}")
    elif kind == "all_gather_into_tensor":
        out = torch.empty(n * 37, dtype=dtype)
        dist.all_gather_into_tensor(out, x)
        same(out, torch.cat(inputs), dtype, n, case)
    elif kind == "reduce_scatter":
        chunks = [make(rank, dtype, (5,), seed + r) for r in range(n)]
        out = torch.empty(5, dtype=dtype)
        op = "MAX" if dtype == torch.bool else "SUM"
        dist.reduce_scatter(out, chunks, op=redop(op))
        ref = reference_reduce([make(r, dtype, (5,), seed + rank) for r in range(n)], op, dtype)
        same(out, ref, dtype, n, case)
    elif kind == "reduce_scatter_tensor":
        big = [make(r, dtype, (n * 6,), seed) for r in range(n)]
        out = torch.empty(6, dtype=dtype)
        op = "MAX" if dtype == torch.bool else "SUM"
        dist.reduce_scatter_tensor(out, big[rank], op=redop(op))
        same(out, reference_reduce([b[rank * 6:(rank + 1) * 6] for b in big], op, dtype), dtype, n, case)
    elif kind == "all_to_all":
        ins = [make(rank, dtype, (r + 2,), seed + r) for r in range(n)]  # uneven: r+2 to rank r
        outs = [torch.empty(rank + 2, dtype=dtype) for _ in range(n)]
        dist.all_to_all(outs, ins)
        for r in range(n):
            same(outs[r], make(r, dtype, (rank + 2,), seed + rank), dtype, n, f"{case} from rank {r}")
    elif kind == "all_to_all_single":
        in_splits = [r + 1 for r in range(n)]  # rank sends r+1 rows to rank r
        rows = make(rank, dtype, (sum(in_splits), 3), seed)
        out = torch.empty((n * (rank + 1), 3), dtype=dtype)
        dist.all_to_all_single(out, rows, output_split_sizes=[rank + 1] * n, input_split_sizes=in_splits)
        at = 0
        for r in range(n):
            src = make(r, dtype, (sum(in_splits), 3), seed)
            start = sum(in_splits[:rank])
            same(out[at:at + rank + 1], src[start:start + rank + 1], dtype, n, f"{case} from rank {r}")
            at += rank + 1
    elif kind == "send_recv":
        right, left = (rank + 1) % n, (rank - 1) % n
        got = torch.empty_like(x)
        reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, x, right), dist.P2POp(dist.irecv, got, left)])
        for req in reqs:
            req.wait()
        same(got, inputs[left], dtype, n, case)
    elif kind == "gather":
        root = 0
        outs = [torch.empty_like(x) for _ in range(n)] if rank == root else None
        dist.gather(x, gather_list=outs, dst=root)
        if rank == root:
            for r in range(n):
                same(outs[r], inputs[r], dtype, n, f"{case} from rank {r}")
    elif kind == "scatter":
        root = n - 1
        pieces = [make(root, dtype, (9,), seed + r) for r in range(n)]
        got = torch.empty(9, dtype=dtype)
        dist.scatter(got, scatter_list=pieces if rank == root else None, src=root)
        same(got, pieces[rank], dtype, n, case)
    elif kind == "barrier":
        dist.barrier()
    else:
        raise AssertionError(f"unknown case {case}")


def all_cases() -> list[str]:
    cases = [f"all_reduce:{d}:{op}" for d, op in reduction_cases()]
    cases += [f"reduce:{d}:{op}" for d, op in reduction_cases() if op in ("SUM", "MAX", "MIN")]
    for d in DTYPES:
        for kind in ("all_reduce_coalesced", "broadcast", "all_gather", "all_gather_into_tensor", "reduce_scatter",
                     "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "send_recv", "gather", "scatter",
                     "all_reduce_noncontiguous"):
            cases.append(f"{kind}:{d}")
    cases.append("barrier:int8")
    return cases


def run_all(rank: int, n: int, port: int) -> dict[str, str]:
    """Every case on this rank, in the same order on every rank; returns
    case -> "" (passed) or the failure."""
    from world import init

    init(rank, n, port)
    gloo = dist.new_group(backend="gloo")
    results = {}
    for case in all_cases():
        try:
            check(rank, n, gloo, case)
            results[case] = ""
        except Exception as e:  # noqa: BLE001  (reported per case by pytest)
            results[case] = f"{type(e).__name__}: {e}"
    # Ranks agree the world is still whole after everything above.
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == n
    dist.destroy_process_group()
    return results
