"""The DDP example (python/examples/ddp_elastic.py): a failure-free run
under plain torchrun, then a run under eccl-run with a standby where rank 2
is killed mid-run. The survivors recover, the standby takes rank 2 and
receives model and optimizer state, and the final parameters equal the
failure-free run's bit for bit."""

import os
import re
import subprocess
import sys

import torch

HERE = os.path.dirname(__file__)
EXAMPLE = os.path.join(HERE, "..", "examples", "ddp_elastic.py")
BUILD = os.environ.get("ECCL_BUILD_DIR", os.path.join(HERE, "..", "..", "build"))


def run(cmd, timeout):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout,
                       env={**os.environ, "ECCL_SOCKET_IFNAME": "lo"})
    return p.returncode, p.stdout


def test_ddp_with_a_killed_rank_ends_equal_to_a_failure_free_run(tmp_path):
    eccl_run = os.path.join(BUILD, "bootstrap", "eccl-run")
    assert os.access(eccl_run, os.X_OK), f"no eccl-run at {eccl_run} (build it, or set ECCL_BUILD_DIR)"
    base, elastic = tmp_path / "base.pt", tmp_path / "elastic.pt"
    rc, out = run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "4", EXAMPLE,
                   "--steps", "150", "--step-ms", "0", "--out", str(base)], timeout=240)
    assert rc == 0, out
    rc, out = run([eccl_run, "-np", "4", "--standby", "1", "--kill-when", "2:step 40", "--timeout", "240",
                   sys.executable, EXAMPLE, "--steps", "150", "--step-ms", "20", "--out", str(elastic)], timeout=300)
    assert rc == 0, out
    for r in (0, 1, 3):
        assert re.search(rf"\[{r}\] rank {r}: recovered into epoch 2", out), out
    assert re.search(r"\[s0\] rank 2: joined at epoch 2", out), out
    done = re.findall(r"rank \d: done after 150 steps, \d recoveries, parameters sha256 (\w+)", out)
    assert len(done) == 4 and len(set(done)) == 1, out
    a, b = torch.load(base), torch.load(elastic)
    assert len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b)), "parameters differ from the failure-free run"
    failed_at = [int(s) for s in re.findall(r"rank \d: step (\d+) failed", out)]
    assert failed_at and min(failed_at) >= 40, f"rank 2 was not killed mid-run: {failed_at}\n{out}"
