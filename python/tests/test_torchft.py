"""torch_eccl.torchft.ProcessGroupEccl under torchft.

1. torchft's own process-group tests (torchft/process_group_test.py of the
   pinned torchft), run against the eccl process group: its multi-PG suite
   (every collective, then every collective with a member that shuts down
   and the rest reconfigured) and its single-process API check with DDP.
   Not applicable: the NCCL, XCCL and "Baby" (subprocess) variants and the
   CUDA parameterisations (no GPU, and they test other back ends), Gloo's
   timeout test (it checks Gloo's message).
2. reconfigure_with_store across real processes: a member sits out a
   quorum and comes back, a new process joins; results and connection
   counts checked after each change.
3. torchft's Manager under a real torchft_lighthouse (the example
   python/examples/torchft_train.py): a replica group killed mid-allreduce,
   the others go on, it restarts, heals and rejoins; parameters identical.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

import torch_eccl
import world

import torchft.process_group_test as process_group_test  # scripts/setup.sh pins torchft and parameterized
from torchft.process_group import ReconfigureOptions, reconfigure_with_store

from torch_eccl.torchft import ProcessGroupEccl

HERE = os.path.dirname(__file__)
EXAMPLE = os.path.join(HERE, "..", "examples", "torchft_train.py")


@pytest.fixture(scope="module", autouse=True)
def eccl_job():
    """One job for the module's in-process groups (its coordinator runs on
    a thread of this process)."""
    old = os.environ.get("ECCL_UNIQUE_ID")
    os.environ.setdefault("ECCL_SOCKET_IFNAME", "lo")
    os.environ["ECCL_UNIQUE_ID"] = torch_eccl.make_job()
    yield
    if old is None:
        os.environ.pop("ECCL_UNIQUE_ID", None)
    else:
        os.environ["ECCL_UNIQUE_ID"] = old


# ------------------------------------------------- torchft's own PG tests


class TestEcclMultiPg(process_group_test.MultiPgBaseTest):
    """torchft's MultiPgBaseTest (3 groups on threads of one process) with
    ProcessGroupEccl; eccl does every collective, so nothing is skipped."""

    WORLD_SIZE = 3

    @classmethod
    def _create_pg(cls, backend: str):
        return ProcessGroupEccl(timeout=timedelta(seconds=10))

    @classmethod
    def setUpClass(cls) -> None:
        if not os.environ.get("ECCL_UNIQUE_ID"):
            os.environ["ECCL_UNIQUE_ID"] = torch_eccl.make_job()
        super().setUpClass()

    def test_collective(self):
        for collective in process_group_test._ALL_COLLECTIVES:
            with self.subTest(collective=collective):
                self._run_parallel(collective, device="cpu")

    def assertRaisesRegex(self, exception, regex, *args, **kwargs):
        # torchft's resiliency check lists the messages Gloo and NCCL give
        # for a member that shut down; eccl says the member left, or failed.
        if "Connection closed by peer" in str(regex):
            regex = regex[:-1] + "|has left|failed)"
        return super().assertRaisesRegex(exception, regex, *args, **kwargs)

    def test_collective_with_resiliency(self):
        # torchft's own sequence: reconfigure everyone (the member that shut
        # down in the previous round comes back as a new member), run the
        # collective, shut the last member down, and the others' next
        # collective fails or is refused, never hangs.
        for collective in process_group_test._ALL_COLLECTIVES:
            with self.subTest(collective=collective):
                self._run_with_resiliency(collective, device="cpu")


def test_torchft_api_checks_and_ddp_on_one_member():
    """torchft's test_gloo_apis for eccl: every collective of its _test_pg
    helper on a one-member group, then DDP over it."""
    store = dist.TCPStore("localhost", 0, is_master=True, wait_for_workers=False)
    pg = ProcessGroupEccl(timeout=timedelta(seconds=10))
    reconfigure_with_store(pg, f"localhost:{store.port}/prefix", 0, 1)
    assert pg.size() == 1
    works = process_group_test._test_pg(pg, torch.tensor([2]))
    assert set(works) >= {"allreduce", "allgather", "alltoall_base", "barrier", "broadcast", "reduce_scatter"}
    m = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(3, 4), process_group=pg)
    m(torch.rand(2, 3))
    pg.shutdown()


def test_handles_are_torchft_json_with_the_eccl_member():
    pg = ProcessGroupEccl()
    pg.set_rank_info("replica7", 0, 1, 7)
    h = json.loads(pg.get_reconfigure_handle())
    assert set(h) >= {"id", "store", "global_rank", "eccl_member", "job", "rank", "epoch"}
    assert h["global_rank"] == 7 and h["rank"] == -1  # a standby until a quorum names it
    opts = ReconfigureOptions()
    opts.uuid = 1
    opts.handles = [pg.get_reconfigure_handle(), json.dumps({"id": "missing", "store": "x:1", "global_rank": None})]
    with pytest.raises(ValueError, match="has no \"eccl_member\""):
        pg.reconfigure(opts)
    pg.shutdown()


# ------------------- the drop-in for ProcessGroupGloo: no job, torchft's store


def test_without_a_job_it_bootstraps_through_the_store_and_says_once_what_a_job_adds(monkeypatch, caplog):
    """Code written for ProcessGroupGloo with the class name changed: no
    ECCL_UNIQUE_ID, no ecclcoord; reconfigure_with_store builds the group
    through the store, twice (a new quorum), and the log says once what
    `ecclcoord serve` would add."""
    monkeypatch.delenv("ECCL_UNIQUE_ID")
    store = dist.TCPStore("localhost", 0, is_master=True, wait_for_workers=False)
    pg = ProcessGroupEccl(timeout=timedelta(seconds=10))
    handle = json.loads(pg.get_reconfigure_handle())
    assert "eccl_member" not in handle and {"id", "store", "global_rank"} <= set(handle)
    with caplog.at_level("WARNING", logger="torch_eccl.torchft"):
        for quorum in ("q1", "q2"):
            reconfigure_with_store(pg, f"localhost:{store.port}/{quorum}", 0, 1)
            assert pg.size() == 1
            works = process_group_test._test_pg(pg, torch.tensor([2]))
            assert set(works) >= {"allreduce", "allgather", "alltoall_base", "barrier", "broadcast"}
    notes = [r.getMessage() for r in caplog.records if "ecclcoord serve" in r.getMessage()]
    assert len(notes) == 1 and "delta" in notes[0] and "standbys" in notes[0], notes
    m = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(3, 4), process_group=pg)
    m(torch.rand(2, 3))
    pg.shutdown()


class TestEcclMultiPgThroughTheStore(TestEcclMultiPg):
    """torchft's multi-PG suite again, with no eccl job: every group (and
    every re-formed group of the resiliency test) is bootstrapped through
    torchft's store, as ProcessGroupGloo's are."""

    @classmethod
    def setUpClass(cls) -> None:
        cls._saved_job = os.environ.pop("ECCL_UNIQUE_ID", None)
        process_group_test.MultiPgBaseTest.setUpClass.__func__(cls)

    @classmethod
    def tearDownClass(cls) -> None:
        super().tearDownClass()
        if cls._saved_job is not None:
            os.environ["ECCL_UNIQUE_ID"] = cls._saved_job


# ------------------------------------- reconfigure_with_store, processes


def _quorums(rank, n, port, job, store_port, rounds):
    """Process `rank` takes part in the quorums that name it: each round is
    (prefix, members); a member's rank is its index. Returns, per round it
    took part in: (size, allreduce result, connections opened, closed)."""
    os.environ["ECCL_UNIQUE_ID"] = job
    torch.set_num_threads(1)
    pg = ProcessGroupEccl(timeout=timedelta(seconds=30))
    out = []
    for prefix, members in rounds:
        if rank not in members:
            continue
        r = members.index(rank)
        reconfigure_with_store(pg, f"localhost:{store_port}/{prefix}", r, len(members), timedelta(seconds=30))
        t = torch.tensor([float(rank + 1)])
        pg.allreduce([t], dist.ReduceOp.SUM).wait()
        s = pg.stats()
        out.append((pg.size(), t.item(), int(s["connections_opened"]), int(s["connections_closed"])))
    pg.shutdown()
    return out


def test_a_member_sits_out_a_quorum_and_comes_back_touching_only_its_links():
    store = dist.TCPStore("localhost", 0, is_master=True, wait_for_workers=False)
    job = torch_eccl.make_job()
    rounds = [("q1", [0, 1, 2, 3]), ("q2", [0, 1, 2]), ("q3", [0, 1, 2, 3]), ("q4", [3, 0, 1, 2])]
    outs = world.run(4, _quorums, job, store.port, rounds, timeout=120)
    for o in outs:
        assert o.status == "ok", o
    total = lambda r: sum(r + 1 for r in rounds[r][1])  # noqa: E731
    for rank, o in enumerate(outs):
        mine = [i for i, (_, members) in enumerate(rounds) if rank in members]
        assert [v[0] for v in o.value] == [len(rounds[i][1]) for i in mine], o
        assert [v[1] for v in o.value] == [total(i) for i in mine], o
    by_rank = {rank: dict(zip([i for i, (_, m) in enumerate(rounds) if rank in m], o.value)) for rank, o in enumerate(outs)}
    # q2: member 3 left out: the others open nothing (they close only their links to it).
    for rank in (0, 1, 2):
        assert by_rank[rank][1][2] == 0, by_rank[rank]
    # q3: it comes back as a standby named again: its partners open one
    # link each at most, it opens at most its own algorithm's few.
    for rank in (0, 1, 2):
        assert by_rank[rank][2][2] <= 1, by_rank[rank]
    assert by_rank[3][2][2] <= 3, by_rank[3]
    # q4: the same members renumbered: no new connection anywhere, none closed.
    for rank in range(4):
        assert by_rank[rank][3][2] <= 1, by_rank[rank]


# ----------------------------------------- Manager + lighthouse (example)


def _example(pg: str, out_dir: str, *args: str) -> str:
    env = dict(os.environ)
    env.pop("ECCL_UNIQUE_ID", None)  # the example runs its own `ecclcoord serve`
    # The build that made this torch_eccl (<build>/python/torch_eccl) holds the ecclcoord it needs.
    env.setdefault("ECCL_BUILD_DIR", os.path.dirname(os.path.dirname(torch_eccl.__path__[0])))
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(torch_eccl.__path__[0]), env.get("PYTHONPATH", "")])
    r = subprocess.run([sys.executable, EXAMPLE, "--pg", pg, "--out", out_dir, *args], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]
    return r.stdout.strip().splitlines()[-1]


def test_manager_under_lighthouse_a_killed_replica_group_rejoins(tmp_path):
    # 100 ms of "compute" per step: torchft's lighthouse takes the restarted replica back only if its
    # request is in before the others' next ones, which a loaded machine must not make a close race.
    summary = _example("eccl", str(tmp_path / "eccl"), "--replicas", "3", "--steps", "160", "--step-ms", "100",
                       "--kill", "1:20")
    assert "parameters identical" in summary, summary
    # The survivors' failed op named the member that died.
    assert re.search(r"peer rank \d \(127\.0\.0\.1:\d+\)|rank \d \(member [0-9a-f]+", summary), summary
    m = re.search(r"(\d+) survivor step\(s\) not committed, restarted replica committed (\d+) steps", summary)
    assert m and int(m.group(1)) >= 1 and int(m.group(2)) >= 1, summary


def test_manager_drop_in_without_a_job_a_killed_replica_group_rejoins(tmp_path):
    """ProcessGroupEccl where ProcessGroupGloo was, nothing else: no
    ecclcoord, no ECCL_UNIQUE_ID; torchft's Manager under its lighthouse,
    a replica group killed mid-allreduce, restarted, healed."""
    summary = _example("eccl-store", str(tmp_path / "store"), "--replicas", "3", "--steps", "60", "--step-ms", "50",
                       "--kill", "1:20")
    assert "parameters identical" in summary, summary
    m = re.search(r"restarted replica committed (\d+) steps", summary)
    assert m and int(m.group(1)) >= 1, summary


def test_manager_training_matches_torchft_gloo_without_failures(tmp_path):
    """The same failure-free run on eccl and on torchft's ProcessGroupGloo
    ends with the same parameters (within float rounding: the allreduce
    sums in a different order)."""
    for pg in ("eccl", "gloo"):
        summary = _example(pg, str(tmp_path / pg), "--replicas", "2", "--min-replicas", "2", "--steps", "40",
                           "--step-ms", "0")
        assert "parameters identical" in summary, summary
    a = torch.load(tmp_path / "eccl" / "replica0.pt")
    b = torch.load(tmp_path / "gloo" / "replica0.pt")
    assert a["step"] == b["step"] == 40
    torch.testing.assert_close(a["state"]["model"], b["state"]["model"], rtol=1e-4, atol=1e-5)


# --------------------------------- torchft's native-reconfigure test, on eccl


def _torchft_resize_worker(rank: int, port: int) -> None:
    import torch_eccl  # noqa: F401  (registers "eccl" in this spawned process)
    from torchft.reconfigure_test import _resize_worker

    _resize_worker(rank, port, "eccl")


def test_torchft_native_resize_and_recover_on_eccl():
    """torchft's ReconfigureTest.test_resize_and_recover (its worker, run
    with backend "eccl"): a native group made with enable_reconfigure goes
    through memberships [0,1,2], [2,0], [1,2,0] by reconfigure_with_store
    (rank 1 is left out alive, then taken back), is aborted, and is
    reconfigured again; allreduce checked after each."""
    store = dist.TCPStore("localhost", 0, is_master=True, wait_for_workers=False)
    torch.multiprocessing.spawn(_torchft_resize_worker, args=(store.port,), nprocs=3)
