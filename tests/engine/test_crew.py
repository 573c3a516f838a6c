"""The crew: one-token products split over workers that wait in compiled code.

Every output row must be the same kernel dot product as a single-thread call, whoever
computes it, with shared chunks (taken through the atomic counter) and with chunks
pinned to a worker (NUMA plans where each worker reads its own copy).
"""
from __future__ import annotations

import numpy as np
import pytest

from workbench.engine import kernels as K
from workbench.engine.crew import CURSORS, STEALABLE, TRACE_LEAD, Crew, CrewError, Job, same_matrix_heads
from workbench.numa import WorkerPool

TYPES = [K.F32, K.F16, K.BF16, K.Q8_0, K.Q4_0, K.Q5_0, K.Q4_1, K.Q5_1, K.Q4_K, K.Q5_K, K.Q6_K]


def _matrix(t: int, rows: int, k: int, rng) -> np.ndarray:
    bs, ts = K.BLOCK_SIZES[t]
    if t in (K.F32, K.F16, K.BF16):
        x = rng.standard_normal((rows, k), dtype=np.float32) * 0.05
        if t == K.F32:
            return x.view(np.uint8)
        if t == K.F16:
            return x.astype(np.float16).view(np.uint8)
        return (x.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    w = rng.integers(0, 256, (rows, k // bs, ts), dtype=np.uint8)
    # keep the f16 scale fields small and finite
    scale_at = {K.Q6_K: (208,), K.Q4_1: (0, 2), K.Q5_1: (0, 2), K.Q4_K: (0, 2), K.Q5_K: (0, 2)}.get(t, (0,))
    for off in scale_at:
        w[..., off:off + 2] = np.array([0.01], np.float16).view(np.uint8)
    return w.reshape(rows, -1)


@pytest.fixture(scope="module")
def pool():
    p = WorkerPool(2, smt=True)
    yield p
    p.close()


@pytest.fixture(scope="module")
def crew(pool):
    # a crew links the kernels of the types precompile was asked for (an engine asks for its
    # model's types); earlier tests in this process may have asked for others only
    K.precompile(TYPES)
    return Crew(pool, pool.n_threads)


@pytest.mark.parametrize("t", TYPES, ids=[K.SUPPORTED_TYPES[t] for t in TYPES])
def test_shared_and_pinned_chunks_match_single_thread(pool, crew, t):
    rng = np.random.default_rng(t)
    rows, k = 320, 512
    w = _matrix(t, rows, k, rng)
    x = rng.standard_normal(k).astype(np.float32)
    xp = K.prepare(t, x)
    ref = np.empty(rows, np.float32)
    K.matvec(t, w, xp, ref, 0, rows)
    # two copies of the weights, like two nodes' mirrors: worker 0 reads rows [0, 128) of one,
    # worker 1 rows [128, 320) of the other (out offset 128); then the same as shared chunks
    tail = np.ascontiguousarray(w[128:])
    pinned = Job([(t, w, 0, 0, 0), (t, tail, 0, 0, 128)], [(0, 0, 128, 0), (1, 0, rows - 128, 1)], [])
    shared = Job([(t, w, 0, 0, 0)], [], [(0, lo, min(lo + 64, rows)) for lo in range(0, rows, 64)])
    with pool.lead():
        crew.start()
        try:
            for job in (pinned, shared, pinned):
                out = np.full(rows, np.nan, np.float32)
                crew.run(job, xp, xp, [out])
                np.testing.assert_array_equal(out, ref)
        finally:
            crew.stop()


@pytest.mark.parametrize("heads,k", [(4, 256), (6, 128), (2, 2048)])
def test_query_heads_of_one_matrix_run_in_one_call_with_each_heads_bits(pool, crew, heads, k):
    """A chunk's span of F16 tasks over one matrix, inputs and outputs equally spaced (the query
    heads of a kv head over its keys): run by one kernels.f16_heads call (each row converted once
    for the group), every output the task's own matvec to the bit; a span whose tasks read
    different matrices, or whose inputs are not equally spaced, runs task by task, the same."""
    rng = np.random.default_rng(heads)
    rows = 200
    w, other = _matrix(K.F16, rows, k, rng), _matrix(K.F16, rows, k, rng)
    x = rng.standard_normal((heads + 1, k)).astype(np.float16).astype(np.float32)
    xp = K.prepare(K.F16, x)
    mats = [w] * heads
    mats2 = [w] * (heads - 1) + [other]
    refs = []
    for m in (mats, mats2):
        r = np.empty((heads, rows), np.float32)
        for h in range(heads):
            K.matvec(K.F16, m[h], (xp[0][h],), r[h], 0, rows)
        refs.append(r)
    jobs = [Job([(K.F16, m[h], 0, 0, 0, h, h) for h in range(heads)], [],
                [(0, lo, min(lo + 64, rows), heads) for lo in range(0, rows, 64)]) for m in (mats, mats2)]
    skip = Job([(K.F16, w, 0, 0, 0, [0, 1, 3, 4, 5, 6][h], h) for h in range(heads)], [],
               [(0, lo, min(lo + 64, rows), heads) for lo in range(0, rows, 64)])
    with pool.lead():
        crew.start()
        try:
            for job, ref, rows_x in ((jobs[0], refs[0], range(heads)), (jobs[1], refs[1], range(heads)),
                                     (skip, None, [0, 1, 3, 4, 5, 6][:heads])):
                out = np.full((heads, rows), np.nan, np.float32)
                crew.run(job, xp, xp, [out])
                if ref is None:
                    ref = np.empty((heads, rows), np.float32)
                    for h, xr in enumerate(rows_x):
                        K.matvec(K.F16, w, (xp[0][xr],), ref[h], 0, rows)
                np.testing.assert_array_equal(out, ref)
                assert (same_matrix_heads(job.tasks, 0, heads) >= (0, 0)) == (job is jobs[0] or heads == 2 and job is skip)
        finally:
            crew.stop()
    assert same_matrix_heads(jobs[0].tasks, 0, heads) == (k, rows)
    assert same_matrix_heads(jobs[0].tasks, 0, 1) == (-1, -1)


def _thefts(crew: Crew, victim: int) -> int:
    """Pieces of `victim`'s pinned list that others took in the last job (its cursor's low half)."""
    return int(crew.ctl[int(crew.ctl[CURSORS]) + 8 * victim]) & 0xFFFFFFFF


def _run_pieces(pool, crew: Crew, t: int, rows: int, seed: int, runs: int) -> list[int]:
    """A product whose rows are all pinned to worker 1 in pieces of 8, STEALABLE, run `runs` times:
    each output equals the single-thread product to the bit (every row written: it starts as NaN);
    returns how many of worker 1's pieces others took in each run."""
    rng = np.random.default_rng(seed)
    k = 512
    w = _matrix(t, rows, k, rng)
    xp = K.prepare(t, rng.standard_normal(k).astype(np.float32))
    ref = np.empty(rows, np.float32)
    K.matvec(t, w, xp, ref, 0, rows)
    pieces = [(0, lo, lo + 8, 1) for lo in range(0, rows, 8)]
    job = Job([(t, w, 0, 0, 0)], pieces, [])
    job.n_owned = len(pieces) | STEALABLE
    stolen = []
    with pool.lead():
        crew.start()
        try:
            for _ in range(runs):
                out = np.full(rows, np.nan, np.float32)
                crew.run(job, xp, xp, [out])
                np.testing.assert_array_equal(out, ref)
                stolen.append(_thefts(crew, 1))
        finally:
            crew.stop()
    return stolen


@pytest.mark.parametrize("t", [K.Q4_K, K.Q8_0], ids=["q4_K", "q8_0"])
def test_a_free_worker_takes_pinned_pieces_of_its_node_from_the_back(pool, crew, t):
    """STEALABLE: every piece pinned to worker 1; the caller (worker 0) has none of its own, so it
    takes worker 1's last pieces while worker 1 works through the first ones; each row is still one
    kernel call's dot product (the same bits)."""
    assert max(_run_pieces(pool, crew, t, 320, 11, 20)) > 0, "the idle caller never took a piece"


def test_pinned_pieces_stay_on_their_node(pool):
    """Workers of different steal groups (nodes) never take each other's pieces: a piece is read
    from its owner's node's memory."""
    crew = Crew(pool, pool.n_threads)
    crew._groups = [0, 1]
    crew._init_ctl()
    assert _run_pieces(pool, crew, K.Q4_K, 256, 12, 5) == [0] * 5


def test_two_prepared_inputs_and_three_outputs(pool, crew):
    """One job, like q/k/v with different types: each task reads its own prepared input."""
    rng = np.random.default_rng(7)
    k = 512
    ws = [(K.Q5_0, _matrix(K.Q5_0, 192, k, rng)), (K.Q6_K, _matrix(K.Q6_K, 64, k, rng)),
          (K.Q8_0, _matrix(K.Q8_0, 128, k, rng))]
    x = rng.standard_normal(k).astype(np.float32)
    xa, xb = K.prepare(K.Q8_0, x), K.prepare(K.Q6_K, x)
    refs = []
    for t, w in ws:
        r = np.empty(w.shape[0], np.float32)
        K.matvec(t, w, xa if t != K.Q6_K else xb, r, 0, w.shape[0])
        refs.append(r)
    job = Job([(t, w, 1 if t == K.Q6_K else 0, j, 0) for j, (t, w) in enumerate(ws)], [],
              [(j, lo, min(lo + 64, w.shape[0])) for j, (_, w) in enumerate(ws) for lo in range(0, w.shape[0], 64)])
    outs = [np.full(w.shape[0], np.nan, np.float32) for _, w in ws]
    with pool.lead():
        crew.start()
        try:
            crew.run(job, xa, xb, outs)
        finally:
            crew.stop()
    for o, r in zip(outs, refs):
        np.testing.assert_array_equal(o, r)


def test_pool_is_free_after_the_crew_and_a_failed_worker_is_reported(pool, crew):
    out = []
    pool.run(lambda i: out.append(i))
    assert sorted(out) == list(range(pool.n_threads))
    # a worker whose loop raises: the caller stops waiting and gets an error, the pool survives
    with pool.lead():
        crew.start()
        crew.ctl[:] = 0  # an impossible job table address would crash; instead mark a failure
        crew.ctl[24] = 1  # FAILED
        job = Job([(K.F32, _matrix(K.F32, 8, 32, np.random.default_rng(0)), 0, 0, 0)], [(0, 0, 8, 1)], [])
        with pytest.raises(CrewError):
            crew.run(job, (np.zeros(32, np.float32),), (np.zeros(32, np.float32),), [np.zeros(8, np.float32)])
    assert not crew.active
    out.clear()
    pool.run(lambda i: out.append(i))
    assert sorted(out) == list(range(pool.n_threads))


def test_launch_and_join(pool):
    seen = []
    pool.launch(lambda i: seen.append(i), lead=True)
    pool.join()
    assert sorted(seen) == list(range(1, pool.n_threads))

    def boom(i):
        raise ValueError("worker failed")
    pool.launch(boom)
    with pytest.raises(ValueError):
        pool.join()
    pool.run(lambda i: None)  # still usable


def test_waiting_is_not_counted_as_busy(pool, crew):
    """Workers spin between jobs: the dashboard's busy % must count only the work."""
    import time
    rng = np.random.default_rng(3)
    w = _matrix(K.Q8_0, 64, 256, rng)
    xp = K.prepare(K.Q8_0, rng.standard_normal(256).astype(np.float32))
    job = Job([(K.Q8_0, w, 0, 0, 0)], [(0, 0, 32, 0), (0, 32, 64, 1)], [])
    out = np.empty(64, np.float32)
    pool.busy_fraction()
    with pool.lead():
        crew.start()
        try:
            for _ in range(20):
                crew.run(job, xp, xp, [out])
                time.sleep(0.005)  # the caller does other things; worker 1 spins meanwhile
        finally:
            crew.stop()
    busy = pool.busy_fraction()
    assert 0.0 <= busy[1] < 0.3, busy  # it computed 32 rows 20 times in ~0.1 s


def test_trace_logs_every_job_of_every_pass(pool, crew):
    """`Crew.trace`: per job the caller's post <= end of its own part <= acknowledgements, and one
    record per job from the other worker, numbered in its pass and inside the caller's window; the
    trace spans passes (crew.start keeps it) and stops cleanly."""
    rng = np.random.default_rng(3)
    rows, k = 256, 512
    w = _matrix(K.Q8_0, rows, k, rng)
    xp = K.prepare(K.Q8_0, rng.standard_normal(k).astype(np.float32))
    job = Job([(K.Q8_0, w, 0, 0, 0)], [(0, 0, 128, 0), (0, 128, rows, 1)], [])
    trace = crew.trace(capacity=4096)
    for _pass in range(2):
        with pool.lead():
            crew.start()
            try:
                for _ in range(3):
                    crew.run(job, xp, xp, [np.empty(rows, np.float32)])
            finally:
                crew.stop()
    assert crew.stop_trace() is trace
    lead, work = trace.records
    assert lead.shape == (6, 4) and work.shape == (6, 4)
    assert (lead[:, 0] <= lead[:, 1]).all() and (lead[:, 1] <= lead[:, 2]).all() and (lead[:, 3] == 1).all()
    assert (work[:, 0] == 1).all() and list(work[:, 1]) == [1, 2, 3, 1, 2, 3]
    assert (work[:, 2] >= lead[:, 0]).all() and (work[:, 3] <= lead[:, 2]).all() and (work[:, 2] <= work[:, 3]).all()
    with pool.lead():  # no longer logging
        crew.start()
        try:
            crew.run(job, xp, xp, [np.empty(rows, np.float32)])
        finally:
            crew.stop()
    assert crew.ctl[TRACE_LEAD] == 0 and trace.records[0].shape == (6, 4)


def test_lead_calls_the_job_loop_through_its_address_not_its_code():
    """`lead` (which every one-token runner calls) reaches lead_core through the address the crew
    keeps in its control block: its machine code holds no copy of lead_core, the job loop or the
    kernels (numba would optimize those again inside every runner: most of a first decoded
    token's compile time); the job loop in turn reaches the kernels through run_chunk's address,
    so lead_core holds no kernel either; a control block no crew made posts nothing."""
    import numba
    from numba import types
    from workbench.engine import crew as C
    _serve, lead, core, chunk = C._compiled()
    v1 = types.Array(types.float32, 1, "C")
    one = types.UniTuple(v1, 1)
    sig = (C._VEC, types.int64, C._TAB, C._TAB, types.int64, one, one, one, types.int64, types.int64, types.int64)
    fresh, fresh_core = numba.njit(lead.py_func), numba.njit(core.py_func)  # (cached code cannot be inspected)
    fresh.compile(sig)
    fresh_core.compile(C.CORE_ARGS)
    asm, core_asm = fresh.inspect_asm(sig), fresh_core.inspect_asm(C.CORE_ARGS)
    assert "lead_core" not in asm and "run_chunk" not in asm
    fresh_chunk = numba.njit(chunk.py_func)
    fresh_chunk.compile(C.CHUNK_ARGS)
    chunk_asm = fresh_chunk.inspect_asm(C.CHUNK_ARGS)
    assert "matvec" in chunk_asm                       # run_chunk links the kernels ...
    assert "run_chunk" not in core_asm and "matvec" not in core_asm   # ... the job loop does not
    x, out = np.zeros(4, np.float32), np.zeros(4, np.float32)
    job = Job([(K.F32, np.zeros((4, 16), np.uint8), 0, 0, 0)], [], [(0, 0, 4)])
    ctl = np.zeros(C.ACK + 16, dtype=np.int64)  # no LEAD_FN
    assert not lead(ctl, 1, job.tasks, job.chunks, job.n_owned, (x,), (x,), (out,), 0, C.NO_LIMIT, 0)


def _hinted_rows(crew, job, me):
    """The byte range worker `me` reads ahead after the caller's `ahead(ctl, job)` (crew.ahead and
    the range function the workers' wait loop calls, compiled as they are)."""
    import numba

    from workbench.engine.crew import _ahead_rows, ahead

    @numba.njit
    def hint(ctl, job, me):
        ahead(ctl, job)
        return _ahead_rows(ctl, me)

    return hint(crew.ctl, (job.tasks, job.chunks, job.n_owned), me)


def test_a_waiting_worker_is_told_the_rows_it_will_take_next(pool):
    """`crew.ahead`: while the caller runs the serial steps before a job, a waiting worker reads
    the weight rows it will likely take: its own first pinned chunk and the pieces of the same rows'
    run that follow it, else shared chunk number `me`
    (the caller takes the first shared one as it posts); rows from the task's T_LO, cut at T_HI;
    nothing on several nodes (a worker would pull another node's weights across)."""
    from workbench.engine.crew import T_HI, T_LO

    rng = np.random.default_rng(7)
    w = _matrix(K.Q8_0, 64, 256, rng)
    w2 = _matrix(K.Q8_0, 64, 256, rng)
    crew = Crew(pool, pool.n_threads)
    rb, a, a2 = w.shape[1], w.ctypes.data, w2.ctypes.data
    shared = Job([(K.Q8_0, w, 0, 0, 0), (K.Q8_0, w2, 0, 1, 0)], [], [(0, 0, 16), (1, 16, 40), (0, 40, 64)])
    assert _hinted_rows(crew, shared, 1) == (a2 + 16 * rb, a2 + 40 * rb)   # shared chunk 1: w2's rows 16..40
    assert _hinted_rows(crew, shared, 2) == (a + 40 * rb, a + 64 * rb)
    assert _hinted_rows(crew, shared, 3) == (0, 0)                       # fewer shared chunks than workers
    pinned = Job([(K.Q8_0, w, 0, 0, 0)], [(0, 0, 32, 0), (0, 32, 48, 1), (0, 48, 64, 1)], [])
    assert _hinted_rows(crew, pinned, 1) == (a + 32 * rb, a + 64 * rb)   # its own first run of pieces
    gap = Job([(K.Q8_0, w, 0, 0, 0)], [(0, 0, 32, 0), (0, 32, 40, 1), (0, 48, 64, 1)], [])
    assert _hinted_rows(crew, gap, 1) == (a + 32 * rb, a + 40 * rb)      # ... up to a gap in the rows
    pinned.tasks[0, T_LO], pinned.tasks[0, T_HI] = 8, 50                 # an attention window: rows 8..50
    assert _hinted_rows(crew, pinned, 1) == (a + 40 * rb, a + 50 * rb)
    two_nodes = Crew(pool, pool.n_threads)
    two_nodes._groups = [0, 1]
    two_nodes._init_ctl()
    assert _hinted_rows(two_nodes, shared, 1) == (0, 0)


def test_a_worker_asks_for_the_start_of_its_next_scattered_run():
    """`crew.next_run_bytes`: before a pinned run, the first RUN_AHEAD bytes of the worker's next
    run (its next own chunk; a worker alone: the next chunk), from the task's T_LO, cut at T_HI;
    nothing when that run continues this one's rows (one stream) or there is none."""
    from workbench.engine.crew import RUN_AHEAD, T_HI, T_LO, next_run_bytes

    rng = np.random.default_rng(3)
    w = _matrix(K.Q8_0, 512, 256, rng)     # 272-byte rows: 512 rows are more than RUN_AHEAD bytes
    w2 = _matrix(K.Q8_0, 512, 256, rng)
    rb, a2 = w.shape[1], w2.ctypes.data
    # two experts' matrices, each split between workers 0 and 1 (a routed token's job)
    job = Job([(K.Q8_0, w, 0, 0, 0), (K.Q8_0, w2, 0, 1, 0)],
              [(0, 0, 8, 0), (0, 8, 16, 1), (1, 0, 8, 0), (1, 8, 512, 1), (1, 0, 4, 0)], [])

    def nxt(me, last, anyone=False):
        return next_run_bytes(job.tasks, job.chunks, job.n_owned, me, last, anyone)

    assert nxt(0, 0) == (a2 & ~63, a2 + 8 * rb)                      # worker 0: w2's rows 0..8
    assert nxt(1, 1) == (a2 + 8 * rb & ~63, (a2 + 8 * rb & ~63) + RUN_AHEAD)  # a long run: its start
    assert nxt(0, 2) == (a2 & ~63, a2 + 4 * rb)                      # another run of the same task
    assert nxt(1, 3) == (0, 0) and nxt(0, 4) == (0, 0)               # the last ones: none after
    assert nxt(0, 1, anyone=True) == (a2 & ~63, a2 + 8 * rb)          # alone: the next chunk whoever's,
    assert nxt(0, 0, anyone=True) == (0, 0)                          # which here continues this run
    cont = Job([(K.Q8_0, w, 0, 0, 0)], [(0, 0, 8, 0), (0, 8, 16, 0)], [])
    assert next_run_bytes(cont.tasks, cont.chunks, cont.n_owned, 0, 0, False) == (0, 0)   # one stream
    job.tasks[1, T_LO], job.tasks[1, T_HI] = 2, 5                    # an attention window: rows 2..5
    assert nxt(0, 0) == (a2 + 2 * rb & ~63, a2 + 5 * rb)


@pytest.mark.parametrize("rows,row_bytes,n", [([1024, 256, 256], [440, 440, 680], 2), ([2048, 2048], [440, 440], 2),
                                               ([640], [576], 2), ([262144], [680], 2), ([640], [576], 3),
                                               ([24, 8], [34, 34], 4)])
def test_pinned_shares_give_each_worker_one_stream_in_halving_pieces(rows, row_bytes, n):
    """`runtime._pinned_shares` (a one-token product's pinned pieces on one node): every row of
    every task exactly once; each worker's pieces follow one another in the rows, task after task
    (one stream); the workers' shares are equal in bytes up to a piece; pieces end on 8-row
    multiples (or a task's end), the first FIRST_PIECE of the share, and shrink, so the owner claims them one by one and a faster worker
    takes the smallest from the back."""
    from workbench.engine.runtime import FIRST_PIECE, PIECE_BYTES, _pinned_shares

    pieces = _pinned_shares(rows, row_bytes, n)
    seen = [np.zeros(r, int) for r in rows]
    for t, lo, hi, _w in pieces:
        assert 0 <= lo < hi <= rows[t]
        assert hi % 8 == 0 or hi == rows[t]
        seen[t][lo:hi] += 1
    assert all((s == 1).all() for s in seen)
    flat = [(t, lo, hi) for t, lo, hi, _w in pieces]
    assert flat == sorted(flat)                                    # in row order, worker after worker
    owners = [w for *_, w in pieces]
    assert owners == sorted(owners)
    total = sum(r * b for r, b in zip(rows, row_bytes))
    for w in set(owners):
        mine = [(t, lo, hi) for t, lo, hi, o in pieces if o == w]
        share = sum((hi - lo) * row_bytes[t] for t, lo, hi in mine)
        biggest = max((hi - lo) * row_bytes[t] for t, lo, hi in mine)
        assert abs(share - total / n) <= max(PIECE_BYTES, 8 * max(row_bytes)) + biggest * (w == n - 1)
        left = total * (w + 1) // n - total * w // n   # the nominal share (pieces round up to 8 rows)
        for k, (t, lo, hi) in enumerate(mine):   # FIRST_PIECE of the share, then half of what is left
            size = (hi - lo) * row_bytes[t]       # (cut at its task's end), or the least
            want = int(left * FIRST_PIECE) if k == 0 else left // 2
            assert size <= max(want, PIECE_BYTES) + 8 * row_bytes[t] or w == n - 1 and hi == rows[t]
            assert size >= min(want, PIECE_BYTES) - 8 * row_bytes[t] or hi == rows[t]
            left -= size
    if rows == [262144]:
        assert len(pieces) < 40                                    # a few kernel calls, not thousands


@pytest.mark.parametrize("solo", [False, True], ids=["crew", "solo"])
def test_write_ahead_lines_are_asked_once_and_change_nothing(pool, solo):
    """`crew.write_ahead`: the next run of a job asks for lines the caller stores to afterwards
    (prefetchw right after its post): the products' results and the lines' contents are unchanged,
    and the request is for that run only (the count is cleared)."""
    import numba

    from workbench.engine.crew import T_WA_N, write_ahead

    rng = np.random.default_rng(9)
    rows, k = 256, 512
    w = _matrix(K.Q8_0, rows, k, rng)
    xp = K.prepare(K.Q8_0, rng.standard_normal(k).astype(np.float32))
    ref = np.empty(rows, np.float32)
    K.matvec(K.Q8_0, w, xp, ref, 0, rows)
    target = rng.integers(0, 1 << 16, (64, 96), dtype=np.uint16)
    before = target.copy()
    job = Job([(K.Q8_0, w, 0, 0, 0)], [], [(0, lo, min(lo + 64, rows)) for lo in range(0, rows, 64)])
    numba.njit(lambda t, a, n, s, p: write_ahead(t, a, n, s, p))(job.tasks, target.ctypes.data, 64, 2 * 96, 3)
    assert job.tasks[0, T_WA_N] == 64
    crew = Crew(pool, pool.n_threads)
    with pool.lead():
        crew.start(solo=solo)
        try:
            for _ in range(2):
                out = np.full(rows, np.nan, np.float32)
                crew.run(job, xp, xp, [out])
                np.testing.assert_array_equal(out, ref)
                assert job.tasks[0, T_WA_N] == 0
        finally:
            crew.stop()
    assert np.array_equal(target, before)
