"""WorkerPool: pinning, getcpu from inside the workers, dispatch, errors, busy fraction."""
from __future__ import annotations

import threading
import time

import pytest

from workbench.numa import WorkerPool, load_topology
from workbench.numa import syscalls as sc
from workbench.numa.topology import fixture_path


@pytest.fixture(scope="module")
def pool():
    p = WorkerPool(smt=True)
    yield p
    p.close()


def test_workers_pinned_and_located(pool):
    t = load_topology()
    assert pool.n_threads == len(t.allowed_cpus)
    for i, w in enumerate(pool.workers):
        assert w.index == i
        assert w.cpu in t.allowed_cpus and w.actual_cpu == w.cpu
        assert w.node == t.node_of(w.cpu) and w.actual_node == w.node
        assert not w.misplaced
    assert pool.check() == pool.workers
    assert "worker   0: cpu" in pool.describe()


def test_run_calls_every_worker_on_its_own_thread(pool):
    seen = {}

    def fn(i):
        seen[i] = (threading.get_native_id(), sc.getcpu().value[0])
    pool.run(fn)
    assert sorted(seen) == list(range(pool.n_threads))
    assert len({tid for tid, _ in seen.values()}) == pool.n_threads
    assert threading.get_native_id() not in {tid for tid, _ in seen.values()}
    assert all(cpu == pool.workers[i].cpu for i, (_, cpu) in seen.items())


def test_run_reraises_first_error_and_keeps_working(pool):
    def fn(i):
        if i == pool.n_threads - 1:
            raise KeyError("boom")
    with pytest.raises(KeyError):
        pool.run(fn)
    out = []
    pool.run(lambda i: out.append(i))
    assert sorted(out) == list(range(pool.n_threads))


def test_busy_fraction(pool):
    pool.busy_fraction()
    pool.run(lambda i: time.sleep(0.05))
    time.sleep(0.05)
    bf = pool.busy_fraction()
    assert len(bf) == pool.n_threads
    assert all(0.2 < b <= 1.0 for b in bf)


def test_round_trip_latency(pool, capsys):
    """Measures run(noop) round trip; 45-100 us with 2 workers on the shared 2-core build box."""
    noop = lambda i: None  # noqa: E731
    for _ in range(50):
        pool.run(noop)
    n = 500
    t0 = time.perf_counter()
    for _ in range(n):
        pool.run(noop)
    us = (time.perf_counter() - t0) / n * 1e6
    with capsys.disabled():
        print(f"\nWorkerPool.run round trip: {us:.1f} us with {pool.n_threads} workers")
    assert us < 5000


def test_misplaced_worker_flagged():
    """A fixture topology claims CPU 1 is on node 1: the worker pinned there is flagged."""
    t = load_topology()
    if len(t.allowed_cpus) < 2 or len(t.node_ids) > 1:
        pytest.skip("needs >= 2 CPUs on a 1-node box")
    fake = load_topology(fixture_path("offline-cpus"))  # cpu 8 is on node 1 there
    with WorkerPool(policy="cpus", cpus=[0, 1], topology=fake) as p:
        assert not p.workers[0].misplaced
    with WorkerPool(cpus=[0, 8], topology=fake) as p:
        w = p.workers[1]
        assert w.node == 1 and w.cpu is None  # cpu 8 does not exist here: pinning failed
        assert w.misplaced and any("pinning to cpu 8 failed" in n for n in p.notes)
        assert "MISPLACED" in p.describe()


def test_closed_pool_refuses():
    p = WorkerPool(1)
    p.close()
    p.close()
    with pytest.raises(RuntimeError):
        p.run(lambda i: None)


def test_lead_runs_worker_zero_on_the_caller_and_restores_affinity():
    import os
    import threading
    from workbench.numa.workers import WorkerPool
    pool = WorkerPool(2)
    try:
        before = os.sched_getaffinity(0)
        seen: dict[int, int] = {}

        def fn(i: int) -> None:
            seen[i] = threading.get_ident()
        with pool.lead():
            node_cpus = {w.cpu for w in pool.workers if w.node == pool.workers[0].node and w.cpu is not None}
            if node_cpus:
                assert os.sched_getaffinity(0) == node_cpus
            pool.run(fn, lead=True)
            assert seen[0] == threading.get_ident()          # worker 0's share ran right here
            assert seen[1] != threading.get_ident()
            seen.clear()
            pool.run(fn)                                     # without lead: every share on a pool thread
            assert threading.get_ident() not in seen.values()
        assert os.sched_getaffinity(0) == before

        def boom(i: int) -> None:
            if i == 0:
                raise ValueError("worker 0 failed")
        with pool.lead():
            try:
                pool.run(boom, lead=True)
            except ValueError as e:
                assert "worker 0 failed" in str(e)
            else:
                raise AssertionError("the caller's error was lost")
        pool.run(fn)  # the pool still works after an error in the caller's share
    finally:
        pool.close()


def test_a_held_launch_is_released_before_the_next_use_from_any_thread():
    """`hold(release)`: a launch whose workers stay busy past their caller's pass (the engine's crew
    spinning between tokens) is ended by `release` before the next launch -- from another thread
    too -- and before `close`; each release is called once."""
    pool = WorkerPool(2)
    try:
        stop = threading.Event()
        released: list[str] = []

        def spin(i: int) -> None:
            stop.wait(30)

        def release() -> None:
            released.append(threading.current_thread().name)
            stop.set()
            pool.join()

        pool.launch(spin, lead=True)
        pool.hold(release)
        seen: list = []
        t = threading.Thread(target=lambda: seen.append(pool.check()), name="other")
        t.start()
        t.join(timeout=30)
        assert not t.is_alive() and len(seen[0]) == 2
        assert released == ["other"]
        stop.clear()
        pool.launch(spin, lead=True)
        pool.hold(release)
        pool.hold(None)      # let go by its holder: nothing to call
        stop.set()
        pool.join()
        stop.clear()
        pool.launch(spin, lead=True)
        pool.hold(release)
    finally:
        pool.close()         # releases the held launch first
    assert released == ["other", threading.current_thread().name]
