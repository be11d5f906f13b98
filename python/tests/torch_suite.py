"""PyTorch's own distributed test suite, run on "eccl" and on Gloo side by
side.

The wheel ships the suite (torch/testing/_internal/distributed/
distributed_test.py; upstream runs it as test/distributed/
test_distributed_spawn.py). Here "eccl" takes Gloo's branch of every
backend-name condition in it (``BACKEND != "gloo"`` and the like, the
feature sets of DistTestCases, ``require_backend_is_available({"gloo"})``)
and nothing else changes. By default each test runs alone, in fresh
processes with spawned ranks, once per backend; with --batch each backend's
tests share one parent process (--start fork: its ranks are forked, many
times faster on few cores):

    torch_suite.py [--world-sizes 2,3,4] [--tests NAME,...] [--backends gloo,eccl] [--batch [--start fork]]

It prints one line per test and backend, then the tests Gloo passes that
eccl does not. --gloo-record FILE keeps what Gloo passed, per world size,
with the torch version; --gloo-from FILE (and no "gloo" in --backends)
compares eccl with that record instead of running Gloo again, unless the
record is of another torch or lacks a world size, when Gloo runs too. Those listed in torch_suite_known.txt (each with the reason
docs/pytorch.md gives) are reported but allowed; any other makes the exit
status 1. Needs torch_eccl on PYTHONPATH (or installed).
"""

from __future__ import annotations

import argparse
import os
import re
import json
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))

DRIVER = '''\
import os
import torch_eccl  # noqa: F401  (registers "eccl" in every spawned rank too)
from torch.testing._internal.common_distributed import DistTestCases
for table in (DistTestCases.backend_feature, DistTestCases.skip_collective):
    for names in table.values():
        if "gloo" in names:
            names.add("eccl")
DistTestCases.backend_feature["plugin"].add("eccl")  # the suite's own place for an out-of-tree backend
from eccl_distributed_test import DistributedTest, TestDistBackend


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        self._spawn_processes()


class TestDistBackendWithFork(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        import torch.multiprocessing
        self._start_processes(torch.multiprocessing.get_context("fork").Process)
'''

# Runs many tests in one parent process and writes one JSON line per finished
# test, so the caller can tell which test a hang is in and go on after it.
BATCH = '''\
import json, sys, unittest
import eccl_spawn_suite as suite

cls = getattr(suite, sys.argv[1])
out = open(sys.argv[2], "a", buffering=1)


class Result(unittest.TestResult):
    def startTest(self, test):
        super().startTest(test)
        self._status, self._detail = "pass", ""

    def addSkip(self, test, reason):
        self._status, self._detail = "skip", reason

    def addFailure(self, test, err):
        self._status, self._detail = "fail", self._exc_info_to_string(err, test)

    addError = addFailure

    def stopTest(self, test):
        super().stopTest(test)
        out.write(json.dumps({"name": test._testMethodName, "status": self._status,
                              "detail": self._detail[-4000:]}) + "\\n")


for name in sys.argv[3:]:
    out.write(json.dumps({"start": name}) + "\\n")
    cls(name).run(Result())
'''


def rewrite(source: str) -> str:
    """Gloo's branch of each backend-name condition, for eccl too."""
    out = source.replace('BACKEND != "gloo"', 'BACKEND not in ("gloo", "eccl")')
    out = out.replace('BACKEND == "gloo"', 'BACKEND in ("gloo", "eccl")')
    out = out.replace('require_backend_is_available({"gloo"})', 'require_backend_is_available({"gloo", "eccl"})')
    return out


def prepare(workdir: str) -> None:
    import importlib.util

    spec = importlib.util.find_spec("torch.testing._internal.distributed.distributed_test")
    with open(spec.origin) as f:
        source = f.read()
    with open(os.path.join(workdir, "eccl_distributed_test.py"), "w") as f:
        f.write(rewrite(source))
    with open(os.path.join(workdir, "eccl_spawn_suite.py"), "w") as f:
        f.write(DRIVER)
    with open(os.path.join(workdir, "eccl_batch.py"), "w") as f:
        f.write(BATCH)


def env_for(backend: str, world: int, workdir: str, tmp: str) -> dict:
    env = dict(os.environ)
    env.update(BACKEND=backend, WORLD_SIZE=str(world), TEMP_DIR=tmp, ECCL_SOCKET_IFNAME=env.get("ECCL_SOCKET_IFNAME", "lo"))
    env["PYTHONPATH"] = os.pathsep.join([workdir, env.get("PYTHONPATH", "")])
    return env


def list_tests(workdir: str) -> list[str]:
    code = ("import unittest, eccl_spawn_suite as m; "
            "print('\\n'.join(unittest.TestLoader().getTestCaseNames(m.TestDistBackendWithSpawn)))")
    with tempfile.TemporaryDirectory() as tmp:
        r = subprocess.run([sys.executable, "-c", code], env=env_for("eccl", 2, workdir, tmp), capture_output=True,
                           text=True, timeout=300, cwd=workdir)
    if r.returncode:
        sys.exit(f"torch_suite: cannot list the suite's tests:\n{r.stderr[-3000:]}")
    return r.stdout.split()


def run_one(name: str, backend: str, world: int, workdir: str, timeout: float) -> tuple[str, float, str]:
    """('pass' | 'skip' | 'fail' | 'hang', seconds, the output's end)."""
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        try:
            r = subprocess.run([sys.executable, "-m", "unittest", f"eccl_spawn_suite.TestDistBackendWithSpawn.{name}"],
                               env=env_for(backend, world, workdir, tmp), capture_output=True, text=True,
                               timeout=timeout, cwd=workdir)
        except subprocess.TimeoutExpired as e:
            out = (e.stderr or b"").decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
            return "hang", time.time() - t0, out[-2000:]
    took = time.time() - t0
    tail = r.stderr[-4000:]
    if r.returncode == 0:
        return ("skip" if re.search(r"OK \(skipped=\d+\)", r.stderr) else "pass"), took, tail
    return "fail", took, tail


def run_batch(names: list[str], backend: str, world: int, workdir: str, timeout: float, start: str):
    """Yields (name, status, seconds, detail) for each test, running them in as
    few parent processes as hangs and crashes allow."""
    cls = "TestDistBackendWithFork" if start == "fork" else "TestDistBackendWithSpawn"
    todo = list(names)
    while todo:
        with tempfile.TemporaryDirectory() as tmp:
            results, log = os.path.join(tmp, "results.jsonl"), open(os.path.join(tmp, "output.log"), "w+")
            proc = subprocess.Popen([sys.executable, "eccl_batch.py", cls, results, *todo], cwd=workdir,
                                    env=env_for(backend, world, workdir, tmp), stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            seen, current, since = 0, None, time.time()
            while True:
                exited = proc.poll() is not None
                lines = open(results).read().splitlines() if os.path.exists(results) else []
                for line in lines[seen:]:
                    record = json.loads(line)
                    if "start" in record:
                        current, since = record["start"], time.time()
                    else:
                        todo.remove(record["name"])
                        current = None
                        yield record["name"], record["status"], time.time() - since, record["detail"]
                seen = len(lines)
                if exited:
                    break
                if current and time.time() - since > timeout:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                    break
                time.sleep(0.2)
            if proc.returncode not in (0, None) or current:
                log.seek(0)
                tail = crash_and_tail(log.read())
                if current:  # the test that hung or took its parent down
                    todo.remove(current)
                    yield current, "hang" if time.time() - since > timeout else "fail", time.time() - since, tail
                elif todo:
                    sys.exit(f"torch_suite: the batch runner failed before any test:\n{tail}")


CRASH = re.compile(r"SIGSEGV|SIGABRT|SIGBUS|Fatal Python error|Segmentation fault")


def crash_and_tail(output: str) -> str:
    """The end of a batch's output, after the first crash report in it (the
    crashing thread's stack comes first; the tail only shows the others)."""
    tail = output[-2000:]
    m = CRASH.search(output)
    if m is None or m.start() >= len(output) - 2000:
        return tail
    return output[max(0, m.start() - 500):m.start() + 3000] + "\n    ...\n" + tail


def load_known() -> dict[str, str]:
    known = {}
    path = os.path.join(HERE, "torch_suite_known.txt")
    if os.path.exists(path):
        for line in open(path):
            line = line.strip()
            if line and not line.startswith("#"):
                name, _, why = line.partition(" ")
                known[name] = why.strip()
    return known


def read_gloo_record(path: str) -> tuple[str, dict[int, set[str]]]:
    """The torch version a Gloo record was made with, and its passes per world size."""
    version, passes = "", {}
    if os.path.exists(path):
        for line in open(path):
            line = line.strip()
            if line.startswith("# torch "):
                version = line.split()[2]
            elif line and not line.startswith("#"):
                world, name = line.split()
                passes.setdefault(int(world), set()).add(name)
    return version, passes


def write_gloo_record(path: str, passes: dict[int, set[str]]) -> None:
    import torch

    with open(path, "w") as f:
        f.write("# The tests of PyTorch's distributed suite Gloo passes here, per world size\n"
                "# (written by torch_suite.py --gloo-record; CI compares eccl with it).\n")
        f.write(f"# torch {torch.__version__}\n")
        for world in sorted(passes):
            for name in sorted(passes[world]):
                f.write(f"{world} {name}\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world-sizes", default="2")
    ap.add_argument("--backends", default="gloo,eccl")
    ap.add_argument("--tests", default="", help="comma-separated test names (default: the whole suite)")
    ap.add_argument("--match", default="", help="only tests whose name matches this regular expression")
    ap.add_argument("--timeout", type=float, default=300, help="seconds per test and backend")
    ap.add_argument("--show-failures", action="store_true", help="print the end of each failing test's output")
    ap.add_argument("--batch", action="store_true",
                    help="run each backend's tests in one parent process (resumed after a hang) instead of one each")
    ap.add_argument("--start", choices=("spawn", "fork"), default="spawn",
                    help="how ranks start (with --batch): spawn as upstream, or fork, many times faster on few cores")
    ap.add_argument("--gloo-record", default="", help="write the tests Gloo passes to this file")
    ap.add_argument("--gloo-from", default="",
                    help="compare with this record of Gloo's passes instead of running Gloo (same torch only)")
    a = ap.parse_args()
    backends = a.backends.split(",")
    known = load_known()
    worlds = [int(w) for w in a.world_sizes.split(",")]
    recorded = {}
    if a.gloo_from and "gloo" not in backends:
        import torch

        version, recorded = read_gloo_record(a.gloo_from)
        missing = [w for w in worlds if w not in recorded]
        if version != torch.__version__ or missing:
            print(f"torch_suite: {a.gloo_from} is of torch {version or '(none)'} with world sizes "
                  f"{sorted(recorded)}; this is torch {torch.__version__}, sizes {worlds}: Gloo runs too", flush=True)
            backends, recorded = ["gloo"] + backends, {}
    gloo_passes = {}
    with tempfile.TemporaryDirectory() as workdir:
        prepare(workdir)
        names = a.tests.split(",") if a.tests else list_tests(workdir)
        if a.match:
            names = [n for n in names if re.search(a.match, n)]
        regressions, allowed = [], []
        for world in worlds:
            counts = {b: {"pass": 0, "skip": 0, "fail": 0, "hang": 0} for b in backends}
            got = {name: {} for name in names}

            def record(b, name, status, took, tail):
                got[name][b] = status
                counts[b][status] += 1
                print(f"{world} ranks  {b:5s} {status:4s} {took:6.1f} s  {name}", flush=True)
                if status in ("fail", "hang") and a.show_failures:
                    lines = tail.splitlines()
                    print("    | " + "\n    | ".join(lines if CRASH.search(tail) else lines[-25:]), flush=True)

            if a.batch:
                for b in backends:
                    for name, status, took, tail in run_batch(names, b, world, workdir, a.timeout, a.start):
                        record(b, name, status, took, tail)
            else:
                for name in names:
                    for b in backends:
                        record(b, name, *run_one(name, b, world, workdir, a.timeout))
            for name in names:
                if world in recorded and name in recorded[world]:
                    got[name]["gloo"] = "pass"  # Gloo's recorded result
                if got[name].get("gloo") == "pass":
                    gloo_passes.setdefault(world, set()).add(name)
                if got[name].get("gloo") == "pass" and got[name].get("eccl", "pass") != "pass":
                    (allowed if name in known else regressions).append((world, name, got[name]["eccl"]))
            for b in backends:
                c = counts[b]
                print(f"torch_suite: {world} ranks, {b}: {c['pass']} passed, {c['fail'] + c['hang']} failed "
                      f"({c['hang']} hung), {c['skip']} skipped", flush=True)
        if recorded:
            print(f"torch_suite: Gloo's passes from {a.gloo_from} (torch {torch.__version__})")
        if a.gloo_record and "gloo" in backends:
            write_gloo_record(a.gloo_record, gloo_passes)
        for world, name, status in allowed:
            print(f"torch_suite: known, {world} ranks: {name} ({status} on eccl; passes on Gloo): {known[name]}")
        for world, name, status in regressions:
            print(f"torch_suite: REGRESSION, {world} ranks: {name} passes on Gloo, {status} on eccl")
        return 1 if regressions else 0


if __name__ == "__main__":
    sys.exit(main())
