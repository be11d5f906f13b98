"""Async work and futures, issue order, errors: a killed rank raises naming
it within ECCL_TIMEOUT_MS (also under a receive from any source), a stopped one at the timeout, bad arguments raise
at the call, abort and shutdown end pending work."""

import os
import signal
import threading
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

import world


def async_work(rank, n, port):
    world.init(rank, n, port)
    # Twenty async allreduces waited in reverse order; then an op that reads
    # the first one's output, issued after it, sees the reduced value.
    ts = [torch.full((1000,), float(rank + i)) for i in range(20)]
    works = [dist.all_reduce(t, async_op=True) for t in ts]
    bcast = dist.broadcast(ts[0], src=0, async_op=True)
    for i, w in reversed(list(enumerate(works))):
        w.wait()
        assert w.is_completed() and w.is_success()
        assert ts[i].eq(sum(r + i for r in range(n))).all(), f"allreduce {i}"
    bcast.wait()
    assert ts[0].eq(sum(range(n))).all(), "broadcast did not run after the allreduce issued before it"
    # Futures: the value is the output list; then() chains run once it completes (DDP comm hooks).
    t = torch.ones(8)
    fut = dist.all_reduce(t, async_op=True).get_future()
    halved = fut.then(lambda f: f.value()[0] / n)
    assert torch.equal(halved.wait(), torch.ones(8)), "then() on the future"
    assert fut.value()[0] is not None and fut.value()[0].data_ptr() == t.data_ptr()
    # A DDP-style comm hook through torch.futures.
    futs = [dist.all_reduce(torch.full((4,), 1.0), async_op=True).get_future() for _ in range(5)]
    assert all(torch.equal(v[0], torch.full((4,), float(n))) for v in torch.futures.wait_all(futs))
    # wait(timeout) on an op that cannot finish yet: a recv nobody sends to.
    if rank == 0:
        pending = dist.irecv(torch.empty(3), src=1)
        with pytest.raises(RuntimeError, match="not completed within"):
            pending.wait(timeout=timedelta(milliseconds=200))
    dist.barrier()
    if rank == 1:
        dist.send(torch.arange(3.0), dst=0)
    if rank == 0:
        pending.wait()
    dist.destroy_process_group()
    return "ok"


def test_async_work_runs_in_issue_order_with_futures():
    world.values(world.run(3, async_work))


def killed_rank(rank, n, port):
    world.init(rank, n, port)
    t = torch.ones(64)
    dist.all_reduce(t)
    if rank == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(RuntimeError) as e:
        for _ in range(1000):
            dist.all_reduce(t)
    return str(e.value), time.monotonic() - start


def expect_rank_2_killed_and_named(fn):
    """Runs fn at 3 ranks, rank 2 SIGKILLs itself; the others must raise
    naming it within ECCL_TIMEOUT_MS (fn returns the message and the time)."""
    outcomes = world.run(3, fn, env={"ECCL_TIMEOUT_MS": "5000"})
    assert outcomes[2].status == "died" and outcomes[2].exitcode == -signal.SIGKILL
    for message, seconds in world.values(outcomes[:2]):
        assert "rank 2" in message, message
        assert seconds < 5, f"took {seconds:.1f} s"


def test_a_killed_rank_makes_the_pending_wait_raise_naming_it():
    expect_rank_2_killed_and_named(killed_rank)


def any_source(rank, n, port):
    world.init(rank, n, port)
    # Ranks 1 and 2 each send twice to rank 0, which receives from any source.
    if rank > 0:
        for k in range(2):
            dist.send(torch.full((5,), float(10 * rank + k)), dst=0)
    else:
        got = []
        for k in range(4):
            t = torch.empty(5)
            if k % 2:
                w = dist.irecv(t)
                w.wait()
                sender = w._source_rank()
            else:
                sender = dist.recv(t)
            got.append((sender, t[0].item()))
            assert t.eq(t[0]).all(), t
        # Each sender's two messages come in its order.
        for r in (1, 2):
            assert [v for s, v in got if s == r] == [10.0 * r, 10.0 * r + 1], got
    dist.barrier()
    # A receive from any source that nothing will answer ends with the
    # failure of a rank, named, not at the timeout.
    if rank == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(RuntimeError) as e:
        if rank == 0:
            dist.recv(torch.empty(5))
        else:
            for _ in range(1000):
                dist.all_reduce(torch.ones(2))
    return str(e.value), time.monotonic() - start


def test_a_receive_from_any_source_takes_each_senders_messages_in_order_and_a_killed_rank_ends_it():
    expect_rank_2_killed_and_named(any_source)


def stopped_rank(rank, n, port):
    world.init(rank, n, port)
    dist.all_reduce(torch.ones(4))
    if rank == 1:
        os.kill(os.getpid(), signal.SIGSTOP)
    start = time.monotonic()
    with pytest.raises(RuntimeError) as e:
        dist.all_reduce(torch.ones(4))
    return str(e.value), time.monotonic() - start


def test_a_stopped_rank_is_caught_at_the_timeout():
    outcomes = world.run(3, stopped_rank, env={"ECCL_TIMEOUT_MS": "2000", "ECCL_HEARTBEAT_TIMEOUT_MS": "60000"},
                         timeout=60, stopped=(1,))
    assert outcomes[1].status in ("hung", "died")
    named = 0
    for o in (outcomes[0], outcomes[2]):
        assert o.status == "ok", o
        message, seconds = o.value
        assert seconds < 2 * 3 + 2, f"took {seconds:.1f} s: {message}"
        named += "rank 1" in message
    assert named >= 1, [o.value for o in outcomes]


def bad_arguments(rank, n, port):
    world.init(rank, n, port)
    checks = [
        # A tensor on another device needs a GPU (meta tensors never reach a
        # backend; torch's dispatcher refuses sparse ones before it does).
        *([(ValueError, "on the CPU", lambda: dist.all_reduce(torch.ones(3, device="cuda")))]
          if torch.cuda.is_available() else []),
        (ValueError, "elements, expected", lambda: dist.all_gather_into_tensor(torch.empty(5), torch.empty(3))),
        (TypeError, "cannot reduce dtype", lambda: dist.all_reduce(torch.ones(3, dtype=torch.int16))),
        (ValueError, "bitwise", lambda: dist.all_reduce(torch.ones(3, dtype=torch.int32), op=dist.ReduceOp.BXOR)),
        (TypeError, "dtype", lambda: dist.all_gather_into_tensor(torch.empty(6), torch.ones(3, dtype=torch.int64))),
        (ValueError, "outside", lambda: dist.broadcast(torch.ones(2), src=7)),
        (ValueError, "split sizes", lambda: dist.all_to_all_single(torch.empty(4), torch.empty(4), [1], [1])),
    ]
    seen = []
    for kind, words, call in checks:
        try:
            call()
        except kind as e:
            assert words in str(e), f"{kind.__name__} without {words!r}: {e}"
            seen.append(str(e))
            continue
        except Exception as e:  # noqa: BLE001
            raise AssertionError(f"expected {kind.__name__} ({words!r}), got {type(e).__name__}: {e}") from e
        raise AssertionError(f"expected {kind.__name__} ({words!r}), nothing raised")
    # Nothing changed: the group still works and agrees on the op order.
    t = torch.ones(3)
    dist.all_reduce(t)
    assert t.eq(n).all()
    dist.destroy_process_group()
    return seen


def test_bad_arguments_raise_at_the_call_and_change_nothing():
    world.values(world.run(2, bad_arguments))


def abort_pending(rank, n, port):
    import torch_eccl

    world.init(rank, n, port)
    dist.barrier()
    if rank == 0:
        w = dist.irecv(torch.empty(4), src=1)  # never sent
        threading.Timer(0.3, lambda: torch_eccl.backend().abort()).start()
        start = time.monotonic()
        with pytest.raises(RuntimeError, match="revoked|aborted"):
            w.wait()
        took = time.monotonic() - start
        with pytest.raises(RuntimeError, match="aborted"):
            dist.all_reduce(torch.ones(2))
        return took
    time.sleep(1.5)
    return 0.0


def test_abort_ends_pending_work():
    took = world.values(world.run(2, abort_pending))[0]
    assert took < 5, f"abort took {took:.1f} s"


def shutdown_flushes(rank, n, port):
    import torch_eccl

    world.init(rank, n, port)
    works = [dist.all_reduce(torch.ones(100) * i, async_op=True) for i in range(10)]
    torch_eccl.backend().shutdown()  # after the queued work, in order
    assert all(w.is_completed() and w.is_success() for w in works)
    with pytest.raises(RuntimeError, match="shut down"):
        dist.all_reduce(torch.ones(2))
    return "ok"


def test_shutdown_finishes_queued_work_then_leaves():
    world.values(world.run(2, shutdown_flushes))
