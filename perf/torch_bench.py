"""torch.distributed on eccl against the Gloo backend of the same torch, in
the same processes and the same run.

    torch_bench.py allreduce   --np 4   allreduce 1-64 MiB through torch.distributed
                                        (eccl, gloo) and eccl's own all_reduce_perf
    torch_bench.py ddp         --np 2   DDP step time of a ~25M-parameter model
    torch_bench.py reconfigure --np 4   replacing one member: eccl's reconfigure,
                                        Gloo's reconfigure, destroy + init_process_group

Tables use nccl-tests' columns where they apply; --json prints one object.
Run with PYTHONPATH=<build>/python (torch_eccl) and ECCL_BUILD_DIR=<build>.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import queue
import re
import socket
import statistics
import subprocess
import sys
import time
import traceback
from datetime import timedelta

TIMEOUT = timedelta(seconds=120)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _main(fn, index, n, args, q):
    os.environ.setdefault("ECCL_SOCKET_IFNAME", "lo")
    try:
        import torch

        torch.set_num_threads(1)
        q.put((index, "ok", fn(index, n, *args)))
    except BaseException:  # noqa: BLE001  (reported by the parent)
        q.put((index, "error", traceback.format_exc()))


def launch(n: int, fn, *args, timeout: float = 900) -> list:
    """fn(index, n, *args) in n spawned processes; their return values."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_main, args=(fn, i, n, args, q)) for i in range(n)]
    for p in procs:
        p.start()
    out, deadline = {}, time.monotonic() + timeout
    while len(out) < n and time.monotonic() < deadline:
        try:
            i, status, value = q.get(timeout=1)
        except queue.Empty:
            if not any(p.is_alive() for p in procs):
                break
            continue
        if status != "ok":
            for p in procs:
                p.kill()
            raise RuntimeError(f"process {i} failed:\n{value}")
        out[i] = value
    for p in procs:
        p.join(timeout=10)
        if p.is_alive():
            p.kill()
    if len(out) < n:
        raise RuntimeError(f"only {len(out)} of {n} processes reported")
    return [out[i] for i in range(n)]


def init(index, n, port, backend="eccl"):
    import torch.distributed as dist

    import torch_eccl  # noqa: F401

    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=index, world_size=n, timeout=TIMEOUT)


# --- allreduce ---------------------------------------------------------------

def allreduce_body(index, n, port, sizes, iters, warmup):
    import torch
    import torch.distributed as dist

    init(index, n, port)
    gloo = dist.new_group(backend="gloo")
    rows = []
    for nbytes in sizes:
        t = torch.ones(nbytes // 4)
        row = {"bytes": nbytes}
        # Alternate the backends so a noisy moment hits both.
        for rep in range(2):
            for name, group in (("eccl", None), ("gloo", gloo)):
                for _ in range(warmup):
                    dist.all_reduce(t, group=group)
                dist.barrier(group=group)
                start = time.perf_counter()
                for _ in range(iters):
                    dist.all_reduce(t, group=group)
                us = (time.perf_counter() - start) / iters * 1e6
                row[name] = min(row.get(name, float("inf")), us)
        rows.append(row)
    dist.destroy_process_group()
    return rows


def native_allreduce(n, sizes, iters, warmup):
    build = os.environ.get("ECCL_BUILD_DIR", "build")
    cmd = [os.path.join(build, "bootstrap", "eccl-run"), "-np", str(n), "--timeout", "600",
           os.path.join(build, "perf", "all_reduce_perf"), "-b", str(min(sizes)), "-e", str(max(sizes)), "-f", "2",
           "-n", str(iters), "-w", str(warmup), "-c", "0"]
    out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=900).stdout
    times = {}
    for line in out.splitlines():
        m = re.match(r"\[0\]\s+(\d+)\s+\d+\s+float\s+sum\s+-?\d+\s+([\d.]+)", line)
        if m:
            times[int(m.group(1))] = float(m.group(2))
    return times


def busbw(nbytes, us, n):
    return nbytes / us / 1e3 * 2 * (n - 1) / n


def cmd_allreduce(a):
    sizes = [1 << s for s in range(20, 27)]  # 1 MiB .. 64 MiB
    native = native_allreduce(a.np, sizes, a.iters, a.warmup)
    rows = launch(a.np, allreduce_body, free_port(), sizes, a.iters, a.warmup)[0]
    for r in rows:
        r["eccl_native"] = native.get(r["bytes"])
    if a.json:
        return {"np": a.np, "rows": rows}
    print(f"# torch.distributed allreduce, {a.np} ranks, float32 sum, {a.iters} iterations (best of 2 alternating runs)")
    print(f"# {'size':>10} {'count':>10}   {'eccl us':>9} {'busbw':>7}   {'gloo us':>9} {'busbw':>7}   "
          f"{'native us':>9}   {'eccl/gloo':>9} {'eccl/native':>11}")
    for r in rows:
        nb = r["bytes"]
        nat = r["eccl_native"]
        print(f"  {nb:>10} {nb // 4:>10}   {r['eccl']:9.1f} {busbw(nb, r['eccl'], a.np):7.2f}   {r['gloo']:9.1f} "
              f"{busbw(nb, r['gloo'], a.np):7.2f}   {nat if nat else float('nan'):9.1f}   {r['gloo'] / r['eccl']:8.2f}x "
              f"{(nat / r['eccl']) if nat else float('nan'):10.2f}x")
    return None


# --- DDP ---------------------------------------------------------------------

def ddp_body(index, n, port, steps, warmup):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    init(index, n, port)
    gloo = dist.new_group(backend="gloo")
    torch.manual_seed(0)

    def model():  # 25.2M parameters
        return torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 4096),
                                   torch.nn.ReLU(), torch.nn.Linear(4096, 1024))

    x = torch.randn(8, 1024)
    out = {}
    nets = {"eccl": DDP(model()), "gloo": DDP(model(), process_group=gloo)}
    for rep in range(2):
        for name, net in nets.items():
            opt = torch.optim.SGD(net.parameters(), lr=1e-4)
            for i in range(warmup + steps):
                if i == warmup:
                    dist.barrier()
                    start = time.perf_counter()
                opt.zero_grad()
                net(x).square().mean().backward()
                opt.step()
            ms = (time.perf_counter() - start) / steps * 1e3
            out[name] = min(out.get(name, float("inf")), ms)
    params = sum(p.numel() for p in nets["eccl"].parameters())
    dist.destroy_process_group()
    return {"params": params, **out}


def cmd_ddp(a):
    r = launch(a.np, ddp_body, free_port(), a.steps, a.warmup)[0]
    if a.json:
        return {"np": a.np, **r}
    print(f"# DDP step time, {r['params'] / 1e6:.1f}M parameters, {a.np} ranks, batch 8 (best of 2 alternating runs)")
    print(f"  eccl {r['eccl']:.1f} ms   gloo {r['gloo']:.1f} ms   eccl speed-up {r['gloo'] / r['eccl']:.2f}x")
    return None


# --- reconfigure -------------------------------------------------------------

def _handles(store, keys):
    store.wait(keys, TIMEOUT)
    return [store.get(k).decode() for k in keys]


def _leaver(cycle: int, n: int) -> int:
    return 1 + cycle % (n - 1)  # rank 0 stays: its process hosts the first group's store


def reconfigure_body(index, n_all, job, store_port, n, cycles, backend, eager):
    """n members and one spare. In each cycle one member's process leaves,
    the spare takes its rank, and the leaver makes a new group in the
    reconfigure regime (the next spare). Every member times its reconfigure
    call to the end of its first allreduce on the new group."""
    import torch
    import torch.distributed as dist

    import torch_eccl

    store = dist.TCPStore("127.0.0.1", store_port, is_master=False, wait_for_workers=False, timeout=TIMEOUT)
    os.environ.update({"ECCL_UNIQUE_ID": job, "ECCL_NRANKS": str(n)})

    spares = [0]
    keep = []  # rank 0's store server lives as long as this process

    def join(spare: bool, rank: int):
        os.environ["ECCL_ROLE"] = "standby" if spare else "rank"
        # A warm standby keeps idle connections to every member (ECCL_PREPARE=eager).
        os.environ["ECCL_PREPARE"] = "eager" if eager and spare else "lazy"
        torch_eccl._env_job_taken = False
        if backend == "eccl":
            dist.init_process_group("eccl", rank=0 if spare else rank, world_size=1 if spare else n,
                                    store=dist.HashStore(), timeout=TIMEOUT, enable_reconfigure=spare)
        elif spare:
            # Gloo's reconfigure meets in the group's store, and its handle is
            # (rank, store): the spare shares the members' store under a rank
            # of its own (the reconfigure regime connects nothing at init).
            spares[0] += 1
            shared = dist.TCPStore("127.0.0.1", store_port + 1, is_master=False, wait_for_workers=False, timeout=TIMEOUT)
            dist.init_process_group("gloo", store=shared, rank=1000 * (index + 1) + spares[0], world_size=100000,
                                    timeout=TIMEOUT, enable_reconfigure=True)
        else:  # the same store object type and prefix as the spares'
            shared = dist.TCPStore("127.0.0.1", store_port + 1, is_master=rank == 0, wait_for_workers=False,
                                   timeout=TIMEOUT)
            keep.append(shared)
            dist.init_process_group("gloo", store=shared, rank=rank, world_size=n, timeout=TIMEOUT,
                                    enable_reconfigure=True)

    spare = index == n
    join(spare, index)
    rank = -1 if spare else index
    times, opened, phases, spans = [], [], [], {}
    for cycle in range(cycles):
        leaver = _leaver(cycle, n)
        store.set(f"c{cycle}/{index}", f"{dist._get_reconfigure_handle()}|{rank}|{int(spare)}")
        entries = [e.rsplit("|", 2) for e in _handles(store, [f"c{cycle}/{i}" for i in range(n + 1)])]
        by_rank = {int(r): h for h, r, s in entries if s == "0"}
        newcomer = next(h for h, r, s in entries if s == "1")
        handles = [newcomer if r == leaver else by_rank[r] for r in range(n)]
        if rank == leaver:  # leaves, and comes back as the next spare
            dist.destroy_process_group()
            join(True, 0)
            spare, rank = True, -1
            continue
        start = time.perf_counter()
        dist._reconfigure(uuid=cycle + 1, handles=handles).wait()
        t = torch.ones(8)
        dist.all_reduce(t)
        end = time.perf_counter()
        times.append((end - start) * 1e3)
        spans[cycle] = (start, end)  # one clock for every process on this host
        assert t[0].item() == n, t
        if backend == "eccl":
            st = torch_eccl.stats()
            opened.append(int(st["connections_opened"]))
            phases.append((st["agree_ms"], st["apply_ms"]))
        spare, rank = False, dist.get_rank()
    store.set(f"done/{index}", "1")
    store.wait([f"done/{i}" for i in range(n + 1)], TIMEOUT)
    dist.destroy_process_group()
    return {"times": times, "opened": opened, "phases": phases, "spans": spans}


def full_init_body(index, n_all, base_port, n, cycles):
    """The baseline: every cycle destroys the group and makes a new one with
    the spare in the leaver's place (a job without reconfigure)."""
    import torch
    import torch.distributed as dist

    times, spans = [], {}
    rank = index if index < n else -1
    if rank >= 0:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{base_port}", rank=rank, world_size=n,
                                timeout=TIMEOUT)
    for cycle in range(cycles):
        leaver = _leaver(cycle, n)
        if rank == leaver:
            dist.destroy_process_group()
            rank = -1
            continue
        start = time.perf_counter()
        if rank == -1:
            rank = leaver
        else:
            dist.destroy_process_group()
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{base_port + 1 + cycle}", rank=rank,
                                world_size=n, timeout=TIMEOUT)
        t = torch.ones(8)
        dist.all_reduce(t)
        end = time.perf_counter()
        times.append((end - start) * 1e3)
        spans[cycle] = (start, end)
    if dist.is_initialized():
        dist.destroy_process_group()
    return {"times": times, "spans": spans}


def cmd_reconfigure(a):
    import torch.distributed as dist

    import torch_eccl

    n, cycles = a.np, a.cycles
    results = {}
    for name, backend, eager in (("eccl", "eccl", False), ("eccl eager", "eccl", True), ("gloo", "gloo", False)):
        store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=TIMEOUT)
        per = launch(n + 1, reconfigure_body, torch_eccl.make_job(), store.port, n, cycles, backend, eager)
        flat = [t for p in per for t in p["times"]]
        # The job's stall in a cycle: from the last member's call to the
        # last member's first allreduce done (what reconfig_perf reports).
        stalls = []
        for c in range(cycles):
            got = [p["spans"][c] for p in per if c in p["spans"]]
            stalls.append((max(e for _, e in got) - max(s for s, _ in got)) * 1e3)
        results[name] = {"median_ms": statistics.median(flat), "max_ms": max(flat),
                         "stall_median_ms": statistics.median(stalls), "stall_max_ms": max(stalls),
                         "opened": sorted({o for p in per for o in p["opened"]})}
        phases = [ph for p in per for ph in p["phases"]]
        if phases:  # eccl's own split: waiting for the agreement, then applying the view
            results[name]["agree_ms"] = statistics.median(a for a, _ in phases)
            results[name]["apply_ms"] = statistics.median(b for _, b in phases)
    per = launch(n + 1, full_init_body, free_port_range(cycles + 2), n, cycles)
    flat = [t for p in per for t in p["times"]]
    stalls = []
    for c in range(cycles):
        got = [p["spans"][c] for p in per if c in p["spans"]]
        stalls.append((max(e for _, e in got) - max(s for s, _ in got)) * 1e3)
    results["destroy+init"] = {"median_ms": statistics.median(flat), "max_ms": max(flat),
                               "stall_median_ms": statistics.median(stalls), "stall_max_ms": max(stalls)}
    if a.json:
        return {"np": n, "cycles": cycles, **results}
    g, f = results["gloo"], results["destroy+init"]
    print(f"# replacing one member of {n}: reconfigure + first allreduce, {cycles} cycles")
    print(f"# member: each member from its call to its first allreduce done; stall: the job, from the last")
    print(f"# member's call to the last member's first allreduce done")
    for name in ("eccl", "eccl eager", "gloo", "destroy+init"):
        r = results[name]
        extra = f"  opened per member: {r['opened']}" if r.get("opened") else ""
        if "agree_ms" in r:
            extra += f"  (agreement {r['agree_ms']:.2f} ms, apply {r['apply_ms']:.2f} ms)"
        label = name + " reconfigure" if name != "destroy+init" else "destroy + init"
        print(f"  {label:22} member median {r['median_ms']:7.2f} max {r['max_ms']:7.2f} ms   stall median "
              f"{r['stall_median_ms']:7.2f} max {r['stall_max_ms']:7.2f} ms{extra}")
    for name in ("eccl", "eccl eager"):
        e = results[name]
        print(f"  {name}: {g['median_ms'] / e['median_ms']:.1f}x faster than Gloo's reconfigure per member, "
              f"{g['stall_median_ms'] / e['stall_median_ms']:.1f}x by the job's stall; "
              f"{f['stall_median_ms'] / e['stall_median_ms']:.1f}x faster than destroy + init (stall medians)")
    return None


def free_port_range(count: int) -> int:
    """A base port with `count` free ports after it (checked, not reserved)."""
    for _ in range(100):
        base = free_port()
        ok = True
        for p in range(base, base + count):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", p))
                except OSError:
                    ok = False
                    break
        if ok:
            return base
    raise RuntimeError("no free port range")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["allreduce", "ddp", "reconfigure"])
    ap.add_argument("--np", type=int, default=4)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--cycles", type=int, default=20)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    out = {"allreduce": cmd_allreduce, "ddp": cmd_ddp, "reconfigure": cmd_reconfigure}[a.what](a)
    if a.json:
        print(json.dumps(out))


if __name__ == "__main__":
    sys.exit(main())
