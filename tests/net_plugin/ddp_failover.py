"""DDP with torch's "nccl" backend under eccl's preload shim, one rank killed:
the other must raise within 2 s. Two ranks share the one GPU (a distinct
NCCL_HOSTID each, NCCL's P2P and SHM off, so NCCL's bytes take eccl's net
plugin). Run by scripts/hardware.sh (nccl stage) under eccl-run with
LD_PRELOAD=libeccl-preload.so and --kill-when '1:ready to die'; argv[1]: a
file for torch's rendezvous. Exit 0: rank 0 raised in time (or rank 1,
which is killed); 1: it did not; 77: no GPU or no torch here."""

from __future__ import annotations

import os
import sys
import time
from datetime import timedelta

try:
    import torch
    import torch.distributed as dist
except ImportError:
    print("ddp_failover: skipped: torch is not installed")
    sys.exit(77)

if not torch.cuda.is_available():
    print("ddp_failover: skipped: no GPU")
    sys.exit(77)

rank, world = int(os.environ["ECCL_RANK"]), 2
os.environ["NCCL_HOSTID"] = f"eccl-ddp-rank{rank}"
# Abort the communicator on an asynchronous error and raise, rather than
# kill the process (the default), so the time to the exception is visible.
os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "2")
os.environ.setdefault("TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC", "250")
torch.cuda.set_device(0)
dist.init_process_group("nccl", init_method=f"file://{sys.argv[1]}", rank=rank, world_size=world,
                        timeout=timedelta(seconds=60))
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(1024, 1024).cuda(), device_ids=[0])
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(64, 1024, device="cuda")
for step in range(10_000):
    if rank == 1 and step == 5:
        print("rank 1: ready to die", flush=True)
        time.sleep(600)
    start = time.monotonic()
    try:
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001  (whatever torch raises is the point)
        took = time.monotonic() - start
        print(f"rank 0: step {step} raised {took:.2f} s after it began: {type(e).__name__}: {str(e)[:300]}", flush=True)
        sys.exit(0 if took < 2.0 else 1)
print("rank 0: no error in 10000 steps after rank 1's death", flush=True)
sys.exit(1)
