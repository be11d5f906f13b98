"""perf/ettr.py judges torchft by a one-process replay of the steps its
events say it committed (perf/ettr_torchft.py --replay): which groups'
gradients each step took, what it divided by, and that a final state the
replay does not reach fails the check."""

import json
import os
import subprocess
import sys

import pytest

PERF = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "perf")
sys.path.insert(0, PERF)

import ettr  # noqa: E402
import ettr_torchft  # noqa: E402


def write_events(directory, by_pid):
    """by_pid: {pid: [(ev, fields)]}, times in list order across pids."""
    t = 0.0
    for pid, evs in by_pid.items():
        with open(os.path.join(directory, f"{pid}.jsonl"), "w") as f:
            for ev, fields in evs:
                t = fields.pop("t", t + 1)
                f.write(json.dumps({"t": t, "pid": pid, "ev": ev, **fields}) + "\n")


def took(rank, step, **kw):
    return ("took_part", {"rank": rank, "step": step, **kw})


def stepped(rank, step, world, **kw):
    return ("step", {"rank": rank, "step": step + 1, "world": world, **kw})


def test_healing_groups_count_in_the_world_but_not_in_the_sum(tmp_path):
    # Step 0: groups 1 and 2 heal from group 0 (torchft's init sync): the
    # world is 3, the gradient group 0's alone.
    write_events(tmp_path, {
        1: [took(0, 0), stepped(0, 0, 3), took(0, 1), stepped(0, 1, 3)],
        2: [stepped(1, 0, 3), took(1, 1), stepped(1, 1, 3)],
        3: [stepped(2, 0, 3), took(2, 1), stepped(2, 1, 3)],
    })
    assert ettr_torchft.takers_by_step(str(tmp_path)) == {0: ([0], 3), 1: ([0, 1, 2], 3)}


def test_a_group_killed_after_its_allreduce_took_part(tmp_path):
    write_events(tmp_path, {
        1: [("fail", {"rank": 0, "step": 4, "t": 9}), took(0, 4, t=10), stepped(0, 4, 3, t=11)],
        2: [took(1, 4, t=10.5)],  # killed before its commit: the last record
        3: [took(2, 4, t=9.5), stepped(2, 4, 3, t=11)],
    })
    # Group 0 failed step 4 before group 1's took_part (an earlier attempt);
    # no group failed it after, so group 1's allreduce was the committed one.
    assert ettr_torchft.takers_by_step(str(tmp_path)) == {4: ([0, 1, 2], 3)}


def test_a_group_killed_in_an_attempt_that_failed_did_not(tmp_path):
    write_events(tmp_path, {
        1: [took(0, 4, t=10), ("fail", {"rank": 0, "step": 4, "t": 11}), took(0, 4, t=12), stepped(0, 4, 2, t=13)],
        2: [took(1, 4, t=10.5)],  # killed; the survivors failed the step after it
        3: [took(2, 4, t=10), ("fail", {"rank": 2, "step": 4, "t": 11}), took(2, 4, t=12), stepped(2, 4, 2, t=13)],
    })
    assert ettr_torchft.takers_by_step(str(tmp_path)) == {4: ([0, 2], 2)}


def test_a_group_killed_after_its_share_was_sent_took_part(tmp_path):
    # Group 1 committed step 3 and died in step 4 before took_part, but the
    # others committed step 4 at world 3: its allreduce had sent its share.
    write_events(tmp_path, {
        1: [took(0, 3), stepped(0, 3, 3), took(0, 4), stepped(0, 4, 3)],
        2: [took(1, 3), stepped(1, 3, 3)],
        3: [took(2, 3), stepped(2, 3, 3), took(2, 4), stepped(2, 4, 3)],
    })
    assert ettr_torchft.takers_by_step(str(tmp_path)) == {3: ([0, 1, 2], 3), 4: ([0, 1, 2], 3)}


def test_a_group_whose_own_commit_failed_after_the_allreduce_took_part(tmp_path):
    # What MTBF 100 seed 1 did (session 59): group 3 was killed as step 365's
    # allreduce ended; groups 0 and 1 committed it at world 4, group 2 saw
    # the error and did not (it healed later): every share was summed.
    def before(rank):
        return [took(rank, 364, quorum=7), stepped(rank, 364, 4, quorum=7)]
    write_events(tmp_path, {
        1: before(0) + [took(0, 365, quorum=7), stepped(0, 365, 4, quorum=7)],
        2: before(1) + [took(1, 365, quorum=7), stepped(1, 365, 4, quorum=7)],
        3: before(2) + [took(2, 365, quorum=7), ("fail", {"rank": 2, "step": 365, "quorum": 7})],
        4: before(3),  # killed before its took_part
    })
    assert ettr_torchft.takers_by_step(str(tmp_path)) == {364: ([0, 1, 2, 3], 4), 365: ([0, 1, 2, 3], 4)}


def test_a_world_the_events_cannot_fill_is_an_error(tmp_path):
    write_events(tmp_path, {
        1: [took(0, 3), stepped(0, 3, 3)],
        2: [took(1, 3), stepped(1, 3, 3)],
    })
    with pytest.raises(ValueError, match=r"step 3: committed at world \[3\] with the gradients of replica groups "
                                         r"\[0, 1\]"):
        ettr_torchft.takers_by_step(str(tmp_path))


def test_a_group_that_gave_up_is_not_in_the_job(tmp_path):
    write_events(tmp_path, {
        1: [took(0, 0), stepped(0, 0, 1)],
        2: [took(1, 0), stepped(1, 0, 1), ("gave_up", {"rank": 1, "step": 1})],
    })
    assert ettr_torchft.takers_by_step(str(tmp_path)) == {0: ([0], 1)}


def test_more_gradients_than_the_world_is_an_error(tmp_path):
    write_events(tmp_path, {
        1: [took(0, 0), stepped(0, 0, 1)],
        2: [took(1, 0), stepped(1, 0, 1)],
    })
    with pytest.raises(ValueError, match=r"step 0: committed at world \[1\] with the gradients of replica groups"):
        ettr_torchft.takers_by_step(str(tmp_path))


def test_a_step_committed_again_counts_as_its_last_quorum_did(tmp_path):
    # What a smoke run did: group 2 started first and committed steps 0-2
    # alone (quorum 1), then was killed before anyone healed from it;
    # groups 0 and 1 began again from step 0 (quorum 2; group 1 healed);
    # group 2's restart healed from them at step 3 (quorum 3).
    write_events(tmp_path, {
        1: [took(2, 0, quorum=1), stepped(2, 0, 1, quorum=1), took(2, 1, quorum=1), stepped(2, 1, 1, quorum=1),
            took(2, 2, quorum=1), stepped(2, 2, 1, quorum=1), took(2, 3, quorum=1)],
        2: [("fail", {"rank": 0, "step": 0, "quorum": 1}), took(0, 0, quorum=2), stepped(0, 0, 2, quorum=2),
            took(0, 1, quorum=2), stepped(0, 1, 2, quorum=2), took(0, 2, quorum=2), stepped(0, 2, 2, quorum=2),
            took(0, 3, quorum=3), stepped(0, 3, 2, quorum=3)],
        3: [stepped(1, 0, 2, quorum=2), took(1, 1, quorum=2), stepped(1, 1, 2, quorum=2), took(1, 2, quorum=2),
            stepped(1, 2, 2, quorum=2), took(1, 3, quorum=3), stepped(1, 3, 2, quorum=3)],
        4: [stepped(2, 3, 2, quorum=3)],
    })
    assert ettr_torchft.takers_by_step(str(tmp_path)) == {0: ([0], 2), 1: ([0, 1], 2), 2: ([0, 1], 2),
                                                         3: ([0, 1], 2)}
    evs = [e for f in ettr_torchft.read_event_files(str(tmp_path)) for e in f]
    assert ettr_torchft.committed_worlds(evs) == {0: 2, 1: 2, 2: 2, 3: 2}


def test_without_the_last_quorum_a_re_committed_step_is_an_error(tmp_path):
    # Events without quorums (older runs) cannot tell the branches apart.
    write_events(tmp_path, {
        1: [took(2, 0), stepped(2, 0, 1)],
        2: [took(0, 0), stepped(0, 0, 2)],
        3: [stepped(1, 0, 2)],
    })
    with pytest.raises(ValueError, match=r"step 0: committed at world \[1, 2\]"):
        ettr_torchft.takers_by_step(str(tmp_path))


def replay(directory, steps):
    r = subprocess.run([sys.executable, os.path.join(PERF, "ettr_torchft.py"), "--replay", str(directory), "--steps",
                        str(steps)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_every_group_every_step_replays_the_full_batch(tmp_path):
    steps = 4
    write_events(tmp_path, {pid: [e for s in range(steps) for e in (took(pid, s), stepped(pid, s, 4))]
                            for pid in range(4)})
    full = replay(tmp_path, steps)
    assert full["short_steps"] == 0
    # The same training on the whole batch at once: the mean of four equal
    # shares' means is the batch's mean.
    probe = (
        "import sys, torch; sys.path.insert(0, sys.argv[1]); from ettr_train import GLOBAL_BATCH, WIDTH, build\n"
        "torch.set_num_threads(1); m, o = build()\n"
        "for s in range(int(sys.argv[2])):\n"
        "    x = torch.randn(GLOBAL_BATCH, WIDTH, generator=torch.Generator().manual_seed(s * 7919 + 17))\n"
        "    o.zero_grad(); ((m(x) - x.roll(1, dims=1).sin()) ** 2).mean().backward(); o.step()\n"
        "with torch.no_grad(): print(((m(x) - x.roll(1, dims=1).sin()) ** 2).mean().item())\n")
    r = subprocess.run([sys.executable, "-c", probe, PERF, str(steps)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert float(r.stdout) == pytest.approx(full["loss"], rel=1e-6)
    # Two groups for the last step: another final state.
    os.remove(tmp_path / "2.jsonl")
    os.remove(tmp_path / "3.jsonl")
    write_events(tmp_path, {2: [e for s in range(steps - 1) for e in (took(2, s), stepped(2, s, 4))],
                            3: [e for s in range(steps - 1) for e in (took(3, s), stepped(3, s, 4))]})
    for pid in (0, 1):  # the last step committed at world 2
        with open(tmp_path / f"{pid}.jsonl") as f:
            lines = f.readlines()
        lines[-1] = lines[-1].replace('"world": 4', '"world": 2')
        with open(tmp_path / f"{pid}.jsonl", "w") as f:
            f.writelines(lines)
    half = replay(tmp_path, steps)
    assert half["short_steps"] == 1 and half["loss"] != full["loss"]


def test_a_final_state_the_replay_does_not_reach_fails():
    baseline = {"steps": 100, "world_min": 4, "losses": [0.1, 0.2], "loss": 0.15, "digest": "a"}
    run = {"contender": "torchft", "ok": True, "steps": 100, "world_min": 2, "loss": 0.107, "replay_loss": 0.107,
           "digest": "b", "ettr": 0.9}
    assert ettr.check(dict(run), baseline)["ok"]
    bad = ettr.check({**run, "replay_loss": 0.1071}, baseline)
    assert not bad["ok"] and bad["ettr"] == 0.0 and "the replay of its commits ends at 0.1071000" in bad["why"]
