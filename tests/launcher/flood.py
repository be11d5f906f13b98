#!/usr/bin/env python3
"""Hostile connections to every listener of a running eccl job.

    flood.py --pids PID[,PID...] --modes silent,slow,garbage,many --seconds S

finds every listening socket (TCP, and eccl's abstract Unix sockets) owned
by those processes and their descendants, rediscovering them as processes
come and go (a promoted standby, a restarted rank), and keeps attacking
them until S seconds pass or every process has exited:
  silent   connect and send nothing, holding each connection a few seconds;
  slow     send a hello one byte at a time, never finishing it;
  garbage  send random bytes (sometimes a valid-looking magic) and go;
  many     hold hundreds of silent connections to the coordinator at once.
It prints what it found and did; exit 1 if it found no listener to attack
(so a test cannot pass without a flood).
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import socket
import struct
import sys
import time


def descendants(roots: set[int]) -> set[int]:
    parent = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    parent[int(d)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    found, frontier = set(r for r in roots if r in parent), list(roots)
    while frontier:
        p = frontier.pop()
        for c, pp in parent.items():
            if pp == p and c not in found:
                found.add(c)
                frontier.append(c)
    return found


def program(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def socket_inodes(pids: set[int]) -> dict[int, int]:
    owner = {}
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                try:
                    link = os.readlink(f"/proc/{pid}/fd/{fd}")
                except OSError:
                    continue
                if link.startswith("socket:["):
                    owner[int(link[8:-1])] = pid
        except OSError:
            pass
    return owner


def listeners(pids: set[int]) -> list[tuple[str, object, int]]:
    """(kind, address, pid) of each listening socket the processes own."""
    owner = socket_inodes(pids)
    out = []
    for path, family in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
        try:
            lines = open(path).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if f[3] != "0A" or int(f[9]) not in owner:
                continue
            hexaddr, hexport = f[1].split(":")
            raw = bytes.fromhex(hexaddr)
            if family == socket.AF_INET:
                host = socket.inet_ntop(family, raw[::-1])
            else:
                host = socket.inet_ntop(family, b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4)))
            if host in ("0.0.0.0", "::"):
                host = "127.0.0.1" if family == socket.AF_INET else "::1"
            out.append(("tcp", (host, int(hexport, 16)), owner[int(f[9])]))
    for line in open("/proc/net/unix").read().splitlines()[1:]:
        f = line.split()
        # Flags 00010000: a listening socket; state 01: unconnected.
        if len(f) >= 8 and f[3] == "00010000" and int(f[6]) in owner and f[7].startswith("@eccl-"):
            out.append(("unix", "\0" + f[7][1:], owner[int(f[6])]))
    return out


def connect(kind: str, addr) -> socket.socket | None:
    fam = socket.AF_UNIX if kind == "unix" else (socket.AF_INET6 if ":" in addr[0] else socket.AF_INET)
    s = socket.socket(fam, socket.SOCK_STREAM)
    s.setblocking(False)
    try:
        s.connect(addr)
    except BlockingIOError:
        pass
    except OSError:
        s.close()
        return None
    return s


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pids", required=True)
    ap.add_argument("--modes", default="silent,slow,garbage,many")
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--per-listener", type=int, default=24, help="silent and slow connections held per listener")
    ap.add_argument("--many", type=int, default=400, help="connections held to the coordinator in mode many")
    ap.add_argument("--hold", type=float, default=3.0, help="seconds a silent connection is held")
    ap.add_argument("--coordinator-pid", type=int, default=0, help="whose listener 'many' targets (default: first)")
    a = ap.parse_args()
    modes = set(a.modes.split(","))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    roots = {int(p) for p in a.pids.split(",")}
    rng = random.Random(1)
    held: list[tuple[float, socket.socket, str, object]] = []  # (drop at, socket, mode, target)
    seen: dict[tuple[str, object], int] = {}
    counts = {m: 0 for m in ("silent", "slow", "garbage", "many")}
    end = time.time() + a.seconds
    next_scan = 0.0
    targets: list[tuple[str, object, int]] = []
    while time.time() < end:
        now = time.time()
        if now >= next_scan:
            pids = descendants(roots)
            if not pids:
                break
            targets = listeners(pids)
            for kind, addr, pid in targets:
                if (kind, addr) not in seen:
                    seen[(kind, addr)] = pid
                    print(f"flood: attacking {kind} {addr!r} of process {pid}".replace("\\x00", "@"), flush=True)
            next_scan = now + 0.5
        keep = []
        for drop_at, s, mode, target in held:
            if now >= drop_at:
                s.close()
                continue
            if mode == "slow" and rng.random() < 0.1:
                try:
                    s.send(bytes([rng.randrange(256)]))
                except OSError:
                    s.close()
                    continue
            keep.append((drop_at, s, mode, target))
        held = keep
        live = {}
        for _, _, mode, target in held:
            live[(mode, target)] = live.get((mode, target), 0) + 1
        # The coordinator: that process's listener, or a replicated
        # coordinator's (an ecclcoord under it) when it has none.
        coordinator = [t for t in targets if t[0] == "tcp" and (t[2] == a.coordinator_pid or not a.coordinator_pid)]
        if not coordinator:
            coordinator = [t for t in targets if t[0] == "tcp" and program(t[2]) == "ecclcoord"]
        for kind, addr, pid in targets:
            for mode in ("silent", "slow"):
                if mode in modes and live.get((mode, (kind, addr)), 0) < a.per_listener:
                    s = connect(kind, addr)
                    if s:
                        held.append((now + a.hold * (0.5 + rng.random()), s, mode, (kind, addr)))
                        counts[mode] += 1
            if "garbage" in modes:
                s = connect(kind, addr)
                if s:
                    junk = bytes(rng.randrange(256) for _ in range(rng.choice([1, 7, 56, 57, 200])))
                    if rng.random() < 0.5:
                        junk = struct.pack("<IH", 0x4F4C4845, 1) + junk  # eccl's hello magic, then junk
                    try:
                        s.send(junk)
                    except OSError:
                        pass
                    s.close()
                    counts["garbage"] += 1
        if "many" in modes and coordinator:
            kind, addr, _ = coordinator[0]
            while live.get(("many", (kind, addr)), 0) < a.many:
                s = connect(kind, addr)
                if not s:
                    break
                held.append((now + a.hold * 2, s, "many", (kind, addr)))
                counts["many"] += 1
                live[("many", (kind, addr))] = live.get(("many", (kind, addr)), 0) + 1
        time.sleep(0.02)
    for _, s, _, _ in held:
        s.close()
    print(f"flood: {len(seen)} listeners; connections: " + ", ".join(f"{m} {n}" for m, n in counts.items()), flush=True)
    return 0 if seen else 1


if __name__ == "__main__":
    sys.exit(main())
