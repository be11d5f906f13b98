"""The MoE example (python/examples/moe_elastic.py) under eccl-run, 4 ranks:
failure-free; rank 2 killed with a standby right after step 16, where the
experts are re-placed from the load (the final parameters equal the
failure-free run's bit for bit: the move is planned as if the newcomer
held rank 2's experts, so it is the failure-free run's); rank 3 killed with no standby while it
holds the only replicas of two experts (the survivors shrink to 3, bring
those two back from the peer-memory snapshot, going back a step with them
when their copies are one behind, re-place the experts, move what each
lacks and train to the end with all 16 experts)."""

import json
import os
import re
import subprocess
import sys

HERE = os.path.dirname(__file__)
EXAMPLE = os.path.join(HERE, "..", "examples", "moe_elastic.py")
BUILD = os.environ.get("ECCL_BUILD_DIR", os.path.join(HERE, "..", "..", "build"))
STEPS = ["--steps", "24", "--rebalance", "8", "--step-ms", "30"]


def run(args, timeout=240):
    eccl_run = os.path.join(BUILD, "bootstrap", "eccl-run")
    assert os.access(eccl_run, os.X_OK), f"no eccl-run at {eccl_run} (build it, or set ECCL_BUILD_DIR)"
    p = subprocess.run([eccl_run, "-np", "4", *args[0], "--timeout", str(timeout - 20), sys.executable, EXAMPLE,
                        *STEPS, *args[1]], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=timeout, env={**os.environ, "ECCL_SOCKET_IFNAME": "lo"})
    return p.returncode, p.stdout


def test_moe_training_survives_a_killed_rank_with_and_without_a_standby(tmp_path):
    base, standby, shrink = (tmp_path / f"{n}.json" for n in ("base", "standby", "shrink"))
    rc, out = run(([], ["--out", str(base)]))
    assert rc == 0, out
    assert len(re.findall(r"re-placed from the load", out)) == 2, out
    rc, out = run((["--standby", "1", "--kill-when", "2:step 16 "], ["--out", str(standby), "--print-every", "1"]))
    assert rc == 0, out
    assert re.search(r"\[s0\] rank 2: joined at epoch 2", out), out
    failed = re.findall(r"rank \d: step (\d+) failed: .*rank 2", out)
    assert len(failed) == 3 and min(int(s) for s in failed) >= 16, out
    # No standby, and cold experts with one replica: rank 3 holds the only
    # ones of experts 0 and 1 (the planner's placement for 16 experts in 4x7
    # slots); they come back from the snapshot copies rank 0 holds.
    rc, out = run((["--kill-when", "3:step 10"], ["--out", str(shrink), "--min-replicas", "1", "--rebalance", "0"]))
    assert rc == 0, out
    assert len(re.findall(r"recovered into epoch 2, 3 ranks", out)) == 3, out
    assert len(re.findall(r"done after 24 steps on 3 ranks", out)) == 3, out
    restored = re.findall(r"rank 0: expert (\d+) lost every replica; restored from the snapshot of step (\d+) held "
                          r"for old rank 3 \(training is at step (\d+)\)", out)
    assert sorted(int(e) for e, _, _ in restored) == [0, 1], out
    # Copies of the step the others reached, or one behind (rank 3 died
    # before its last snapshot committed): then every rank went back a step.
    assert all(int(at) == int(v) for _, v, at in restored), out
    rc = subprocess.run([sys.executable, EXAMPLE, "--compare", str(base), str(standby), str(shrink)],
                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
    assert rc.returncode == 0, rc.stdout
    assert "bit-equal to the failure-free run" in rc.stdout, rc.stdout
    s = json.load(open(shrink))
    assert s["world"] == 3 and len(s["experts"]) == 16 and len(s["losses"]) == 24, s
    assert s["recovery_ms"] and max(s["recovery_ms"]) < 5000, s


def test_one_recovery_that_replaces_a_rank_and_drops_another_starts_the_snapshots_over():
    # Ranks 2 and 3 die together with one standby: it takes rank 2 and the
    # view shrinks to 3 ranks, so the snapshots cannot follow their rank
    # numbers; every rank, the newcomer too, starts them over.
    rc, out = run((["--standby", "1", "--kill-when", "2:step 10 ", "--kill-when", "3:step 10 "],
                   ["--print-every", "1", "--rebalance", "0"]))
    assert rc == 0, out
    assert len(re.findall(r"a view that shrank cannot restore them.*the snapshots start over", out)) == 3, out
    done = re.findall(r"done after 24 steps on 3 ranks, dense sha256 (\w+), 16 experts", out)
    assert len(done) == 3 and len(set(done)) == 1, out


def test_across_machines_a_machines_loss_leaves_a_replica_of_every_expert():
    # eccl-run's --ranks-per-host 2: ranks 0-1 and 2-3 are two machines
    # (ECCL_HOSTID). The load decides the replicas at step 8 and 16 (cold
    # experts get two), and the placement keeps every expert on both
    # machines; machine 1 then dies whole with no standby, and the two
    # survivors take every expert from a replica, none from a snapshot.
    rc, out = run((["--ranks-per-host", "2", "--kill-when", "2:step 17 ", "--kill-when", "3:step 17 "],
                   ["--print-every", "1", "--rebalance", "8"]))
    assert rc == 0, out
    assert len(re.findall(r"re-placed from the load.*any one machine's loss with probability 1\.000", out)) >= 2, out
    assert "restored from the snapshot" not in out, out
    done = re.findall(r"done after 24 steps on 2 ranks, dense sha256 (\w+), 16 experts", out)
    assert len(done) == 2 and len(set(done)) == 1, out
