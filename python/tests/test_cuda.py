"""CUDA tensors through the eccl backend: each op on CUDA tensors against the
same op on CPU tensors, ordered on the caller's current stream (a side
stream included). Skips where torch has no GPU or torch_eccl was built
without CUDA."""

import pytest
import torch

import world


def _skip_reason():
    import torch_eccl

    if not torch_eccl._C.cuda_build():
        return "torch_eccl was built without CUDA"
    if not torch.cuda.is_available():
        return "no CUDA GPU on this machine"
    return None


def _ops(rank, n, port):
    import torch.distributed as dist

    world.init(rank, n, port)
    torch.cuda.set_device(rank % torch.cuda.device_count())
    dev = torch.device("cuda", torch.cuda.current_device())
    failures = []
    for numel in (1, 1000, 3 << 20):
        base = torch.arange(numel, dtype=torch.float32) * (rank + 1) % 97
        # allreduce, on the default stream and on a side stream
        for side in (False, True):
            cpu = base.clone()
            dist.all_reduce(cpu)
            stream = torch.cuda.Stream() if side else torch.cuda.current_stream()
            with torch.cuda.stream(stream):
                gpu = base.to(dev)
                dist.all_reduce(gpu)
                got = gpu.cpu()
            if not torch.equal(got, cpu):
                failures.append(f"all_reduce numel {numel} side stream {side}")
        # broadcast, all_gather_into_tensor, reduce_scatter_tensor, all_to_all_single
        cpu = base.clone()
        dist.broadcast(cpu, src=n - 1)
        gpu = base.to(dev)
        dist.broadcast(gpu, src=n - 1)
        if not torch.equal(gpu.cpu(), cpu):
            failures.append(f"broadcast numel {numel}")
        out_cpu = torch.empty(numel * n)
        dist.all_gather_into_tensor(out_cpu, base)
        out_gpu = torch.empty(numel * n, device=dev)
        dist.all_gather_into_tensor(out_gpu, base.to(dev))
        if not torch.equal(out_gpu.cpu(), out_cpu):
            failures.append(f"all_gather_into_tensor numel {numel}")
        if numel % n == 0:
            rs_cpu = torch.empty(numel // n)
            dist.reduce_scatter_tensor(rs_cpu, base)
            rs_gpu = torch.empty(numel // n, device=dev)
            dist.reduce_scatter_tensor(rs_gpu, base.to(dev))
            if not torch.equal(rs_gpu.cpu(), rs_cpu):
                failures.append(f"reduce_scatter_tensor numel {numel}")
            a2a_cpu = torch.empty(numel)
            dist.all_to_all_single(a2a_cpu, base)
            a2a_gpu = torch.empty(numel, device=dev)
            dist.all_to_all_single(a2a_gpu, base.to(dev))
            if not torch.equal(a2a_gpu.cpu(), a2a_cpu):
                failures.append(f"all_to_all_single numel {numel}")
        # gather and scatter: sends and receives in one group on device buffers
        parts_cpu = [torch.empty(numel) for _ in range(n)] if rank == 0 else None
        dist.gather(base, parts_cpu, dst=0)
        parts_gpu = [torch.empty(numel, device=dev) for _ in range(n)] if rank == 0 else None
        dist.gather(base.to(dev), parts_gpu, dst=0)
        if rank == 0 and any(not torch.equal(g.cpu(), c) for g, c in zip(parts_gpu, parts_cpu)):
            failures.append(f"gather numel {numel}")
        sc_cpu = torch.empty(numel)
        dist.scatter(sc_cpu, [base + r for r in range(n)] if rank == 0 else None, src=0)
        sc_gpu = torch.empty(numel, device=dev)
        dist.scatter(sc_gpu, [(base + r).to(dev) for r in range(n)] if rank == 0 else None, src=0)
        if not torch.equal(sc_gpu.cpu(), sc_cpu):
            failures.append(f"scatter numel {numel}")
    # send and recv of CUDA tensors, around the ring
    ring = torch.arange(64, dtype=torch.float32, device=dev) + rank
    got = torch.empty(64, device=dev)
    ops = [dist.P2POp(dist.isend, ring, (rank + 1) % n), dist.P2POp(dist.irecv, got, (rank - 1) % n)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    if not torch.equal(got.cpu(), torch.arange(64, dtype=torch.float32) + (rank - 1) % n):
        failures.append("isend/irecv ring of CUDA tensors")
    dist.destroy_process_group()
    return failures


@pytest.mark.parametrize("n", [2, 3])
def test_cuda_tensors_match_cpu_tensors(n):
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    outcomes = world.run(n, _ops, timeout=300)
    for o in outcomes:
        assert o.status == "ok" and o.value == [], o


def _moe(rank, n, port):
    import torch.distributed as dist

    import torch_eccl.moe as moe

    world.init(rank, n, port)
    torch.cuda.set_device(rank % torch.cuda.device_count())
    dev = torch.device("cuda", torch.cuda.current_device())
    experts, hidden, tokens, k = 5, 32, 300, 2
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(tokens, hidden, generator=g)
    ids = torch.randint(0, experts, (tokens, k), generator=g)
    ids[::7, 1] = -1
    w = torch.rand(tokens, k, generator=g)
    table = torch.zeros(experts, n, dtype=torch.int32)
    for e in range(experts):
        table[e, e % n] += 1
        table[e, (e * 3 + 1) % n] += 1
    results = {}
    for where in ("cpu", dev):
        xs, ws = x.to(where).requires_grad_(True), w.to(where).requires_grad_(True)
        inputs, handle = moe.dispatch(xs, ids.to(where), table)
        outs = [rows * (e + 1) for e, rows in zip(handle.local_experts, inputs)]
        y = moe.combine(outs, ws, handle)
        (y * torch.arange(hidden, device=y.device)).sum().backward()
        results[str(where)] = [t.detach().cpu() for t in (y, xs.grad, ws.grad, *inputs)]
    failures = []
    for name, a, b in zip(["y", "grad x", "grad w"] + [f"rows {i}" for i in range(99)], results["cpu"],
                          results[str(dev)]):
        if not torch.allclose(a, b, rtol=1e-6, atol=1e-6):
            failures.append(f"moe {name} on the GPU differs from the CPU")
    dist.destroy_process_group()
    return failures


def test_moe_dispatch_and_combine_on_cuda_tensors_match_cpu_tensors():
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    outcomes = world.run(3, _moe, timeout=300)
    for o in outcomes:
        assert o.status == "ok" and o.value == [], o
