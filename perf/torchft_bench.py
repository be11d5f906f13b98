"""torchft's process groups: eccl's ProcessGroupEccl against torchft's own
ProcessGroupGloo, in the same run.

    torchft_bench.py quorum --np 4 8 --cycles 20
        a quorum change as torchft's Manager makes it (the handles
        exchanged, then pg.reconfigure(opts)) + the first 8-float allreduce. Cycles alternate: the last member sits
        a quorum out, then is back (a replica that was late, then rejoined).
    torchft_bench.py kill --replicas 3
        the example python/examples/torchft_train.py under a real
        torchft_lighthouse: a replica group SIGKILLed mid-allreduce; time
        from the kill to the survivors' first committed step without it.

Cycle time is the job's: from the moment every member of the quorum has
arrived to the last member's allreduce done. Run with
PYTHONPATH=<build>/python and ECCL_BUILD_DIR=<build>.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
import uuid
from datetime import timedelta

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_bench import launch  # noqa: E402  (spawned processes, results collected)

TIMEOUT = timedelta(seconds=60)
HERE = os.path.dirname(os.path.abspath(__file__))


def members_of(cycle: int, n: int) -> list[int]:
    return list(range(n)) if cycle % 2 == 0 else list(range(n - 1))


def quorum_body(index, n, kind, job, store_port, cycles):
    import torch
    import torch.distributed as dist
    from torchft.process_group import ProcessGroupGloo, ReconfigureOptions

    os.environ["ECCL_UNIQUE_ID"] = job
    if kind == "eccl":
        from torch_eccl.torchft import ProcessGroupEccl

        pg = ProcessGroupEccl(timeout=TIMEOUT)
    else:
        pg = ProcessGroupGloo(timeout=TIMEOUT)
    store = dist.TCPStore("127.0.0.1", store_port, is_master=False, wait_for_workers=False, timeout=TIMEOUT)
    ends, opened, exchanged, reconfigured, phases = {}, [], {}, {}, []
    for c in range(cycles + 1):  # cycle 0 forms the group (not counted)
        members = members_of(c, n)
        if index not in members:
            continue
        # Everyone arrives; the last to arrive stamps the start.
        if store.add(f"arrive/{kind}/{c}", 1) == len(members):
            store.set(f"go/{kind}/{c}", repr(time.time()))
        store.wait([f"go/{kind}/{c}"])
        # The handles go round as the Manager's do through the lighthouse
        # (here, a store connection held for the run), then reconfigure.
        rank = members.index(index)
        store.set(f"handle/{kind}/{c}/{rank}", pg.get_reconfigure_handle())
        if rank == 0:
            store.set(f"uuid/{kind}/{c}", str(uuid.uuid4().int & ((1 << 63) - 1)))
        keys = [f"uuid/{kind}/{c}", *(f"handle/{kind}/{c}/{r}" for r in range(len(members)))]
        store.wait(keys)
        communicator, *handles = store.multi_get(keys)
        opts = ReconfigureOptions()
        opts.uuid = int(communicator)
        opts.handles = [h.decode() for h in handles]
        opts.timeout = TIMEOUT
        exchanged[c] = time.time()
        pg.reconfigure(opts).wait()
        reconfigured[c] = time.time()
        t = torch.full((8,), float(index + 1))
        pg.allreduce([t], dist.ReduceOp.SUM).wait()
        ends[c] = time.time()
        want = float(sum(m + 1 for m in members))
        if t[0].item() != want:
            raise RuntimeError(f"cycle {c}: allreduce gave {t[0].item()}, want {want}")
        if kind == "eccl" and c > 0:
            st = pg.stats()
            opened.append(int(st["connections_opened"]))
            phases.append((st["agree_ms"], st["apply_ms"]))
    starts = {c: float(store.get(f"go/{kind}/{c}")) for c in ends}
    pg.shutdown()
    return {"ends": ends, "starts": starts, "opened": opened, "exchanged": exchanged, "reconfigured": reconfigured,
            "phases": phases}


def cmd_quorum(a) -> dict:
    import torch.distributed as dist

    import torch_eccl

    out = {}
    for n in a.np:
        row = {}
        for kind in ("eccl", "gloo"):
            store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=TIMEOUT)
            per = launch(n, quorum_body, kind, torch_eccl.make_job(), store.port, a.cycles)
            times, split, handled = [], [], []
            for c in range(1, a.cycles + 1):
                got = [p for p in per if c in p["ends"]]
                start = got[0]["starts"][c]
                times.append((max(p["ends"][c] for p in got) - start) * 1e3)
                split.append([(max(p[k][c] for p in got) - start) * 1e3 for k in ("exchanged", "reconfigured")])
                # What the process group itself costs: from the moment the
                # last member holds the handles to the last allreduce done.
                handled.append((max(p["ends"][c] for p in got) - max(p["exchanged"][c] for p in got)) * 1e3)
            row[kind] = {"median_ms": statistics.median(times), "max_ms": max(times), "min_ms": min(times),
                         "opened": sorted({o for p in per for o in p["opened"]}),
                         "exchange_ms": statistics.median(x for x, _ in split),
                         "pg_median_ms": statistics.median(handled), "pg_max_ms": max(handled),
                         "agree_ms": statistics.median([x for p in per for x, _ in p["phases"]] or [0]),
                         "apply_ms": statistics.median([y for p in per for _, y in p["phases"]] or [0]),
                         "reconfigured_ms": statistics.median(y for _, y in split)}
        out[n] = row
    if a.json:
        return out
    print(f"# torchft quorum change: handles exchanged, reconfigure + first allreduce (8 floats), {a.cycles} cycles;")
    print("# cycles alternate: the last member sits a quorum out, then is back")
    print(f"# {'ranks':>5} {'pg':>5} {'median ms':>10} {'max ms':>9} {'max/median':>10}  connections opened per member")
    for n, row in out.items():
        for kind in ("eccl", "gloo"):
            r = row[kind]
            print(f"  {n:>5} {kind:>5} {r['median_ms']:10.2f} {r['max_ms']:9.2f} {r['max_ms'] / r['median_ms']:10.1f}  "
                  f"{r['opened'] if kind == 'eccl' else '(a new Gloo group each time)'}  [handles exchanged by "
                  f"{r['exchange_ms']:.2f} ms, reconfigured by {r['reconfigured_ms']:.2f} ms: medians]")
        e, g = row["eccl"], row["gloo"]
        print(f"  {n} ranks, reconfigure + first allreduce (from the last member holding the handles): eccl median "
              f"{e['pg_median_ms']:.2f} max {e['pg_max_ms']:.2f} ms (eccl's agreement {e['agree_ms']:.2f} ms, apply "
              f"{e['apply_ms']:.2f} ms per member), gloo median {g['pg_median_ms']:.2f} max "
              f"{g['pg_max_ms']:.2f} ms")
        print(f"  {n} ranks: eccl {g['pg_median_ms'] / e['pg_median_ms']:.1f}x faster than torchft's ProcessGroupGloo "
              f"at the median (target >= 20x), {g['median_ms'] / e['median_ms']:.1f}x with the handle exchange; "
              f"eccl's slowest cycle {e['pg_max_ms'] / e['pg_median_ms']:.1f}x its median (target < 10x), "
              f"Gloo's {g['pg_max_ms'] / g['pg_median_ms']:.1f}x")
    return out


def cmd_kill(a) -> dict:
    example = os.path.join(HERE, "..", "python", "examples", "torchft_train.py")
    out = {}
    for kind in ("eccl", "gloo"):
        env = dict(os.environ)
        env.pop("ECCL_UNIQUE_ID", None)
        r = subprocess.run([sys.executable, example, "--pg", kind, "--replicas", str(a.replicas), "--steps", str(a.steps),
                            "--kill", "1:20", "--out", os.path.join(a.out, kind)], env=env, capture_output=True,
                           text=True, timeout=600)
        line = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else ""
        m = re.search(r"kill to the survivors' first step without it (\d+) ms, (\d+) survivor", line)
        if r.returncode != 0 or not m:
            raise RuntimeError(f"torchft_bench kill ({kind}) failed:\n{r.stdout[-4000:]}\n{r.stderr[-2000:]}")
        out[kind] = {"recovery_ms": int(m.group(1)), "skipped_steps": int(m.group(2))}
    if not a.json:
        print(f"# one of {a.replicas} replica groups SIGKILLed mid-allreduce under torchft_lighthouse "
              "(heartbeat timeout 1000 ms, join timeout 500 ms)")
        for kind, r in out.items():
            print(f"  {kind:>5}: kill to the survivors' first committed step without it {r['recovery_ms']} ms "
                  f"({r['skipped_steps']} survivor steps not committed)")
        print(f"  eccl/gloo: {out['gloo']['recovery_ms'] / out['eccl']['recovery_ms']:.2f}x (the lighthouse's "
              "timeouts dominate both)")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["quorum", "kill"])
    ap.add_argument("--np", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--cycles", type=int, default=20)
    ap.add_argument("--replicas", type=int, default=3)
    ap.add_argument("--steps", type=int, default=160)
    ap.add_argument("--out", default="/tmp/torchft_bench")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    out = {"quorum": cmd_quorum, "kill": cmd_kill}[a.what](a)
    if a.json:
        print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
