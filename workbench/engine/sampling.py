"""Token sampling: greedy, repetition penalty, top-k, top-p, min-p, temperature, seed.

The order follows llama.cpp's default chain (penalties, top-k, top-p, min-p,
temperature, then a draw), so the same settings mean the same thing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numba
import numpy as np

from .kernels.jitcache import JIT as _NB


@dataclass
class SamplingParams:
    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    seed: int | None = None

    def validate(self) -> None:
        checks = [
            (self.temperature >= 0, f"temperature must be >= 0 (got {self.temperature})"),
            (self.top_k >= 0, f"top-k must be >= 0 (got {self.top_k})"),
            (0 < self.top_p <= 1, f"top-p must be in (0, 1] (got {self.top_p})"),
            (0 <= self.min_p < 1, f"min-p must be in [0, 1) (got {self.min_p})"),
            (self.repeat_penalty > 0, f"repeat penalty must be > 0 (got {self.repeat_penalty})"),
        ]
        for ok, msg in checks:
            if not ok:
                raise ValueError(msg)


@numba.njit(inline="always")
def _worse(v, i, hv, hi, j) -> bool:
    """Candidate (v, i) ranks below kept candidate j: a lower logit, or the same and a later id."""
    return v < hv[j] or (v == hv[j] and i > hi[j])


@numba.njit(**_NB)
def _sift_down(hv, hi, j, k) -> None:
    while True:
        a, b, m = 2 * j + 1, 2 * j + 2, j
        if a < k and _worse(hv[a], hi[a], hv, hi, m):
            m = a
        if b < k and _worse(hv[b], hi[b], hv, hi, m):
            m = b
        if m == j:
            return
        hv[j], hv[m] = hv[m], hv[j]
        hi[j], hi[m] = hi[m], hi[j]
        j = m


TOPK_BLOCK = 64   # logits a block (4 rows of 16 lanes): `block_maxima`


@numba.njit(**dict(_NB, fastmath={"nnan", "nsz"}))
def block_maxima(logits: np.ndarray) -> np.ndarray:
    """The max of each `TOPK_BLOCK` logits (the last block may be short): 16 lanes kept apart
    over a block's 4 rows of 16 (a loop LLVM vectorizes), then across the lanes. 5 us over
    49152 logits where a reduction loop a block took 22."""
    n = logits.shape[0]
    nb = -(-n // TOPK_BLOCK)
    bm = np.empty(nb, np.float32)
    acc = np.empty(16, np.float32)
    for b in range(n // TOPK_BLOCK):
        o = b * TOPK_BLOCK
        for j in range(16):
            a, c = logits[o + j], logits[o + 16 + j]
            d, e = logits[o + 32 + j], logits[o + 48 + j]
            a = a if a > c else c
            d = d if d > e else e
            acc[j] = a if a > d else d
        m = acc[0]
        for j in range(1, 16):
            m = m if m > acc[j] else acc[j]
        bm[b] = m
    if n % TOPK_BLOCK:
        m = np.float32(-np.inf)
        for i in range(n // TOPK_BLOCK * TOPK_BLOCK, n):
            m = logits[i] if logits[i] > m else m
        bm[nb - 1] = m
    return bm


@numba.njit(**_NB)
def _heap_top_k(vals: np.ndarray, k: int) -> np.ndarray:
    """Positions of the k largest of ``vals``, best first (equal values: the lower position
    first), in one pass with a k-entry heap whose root is the worst kept candidate."""
    hv = np.empty(k, np.float32)
    hi = np.empty(k, np.int64)
    for i in range(k):
        hv[i] = vals[i]
        hi[i] = i
    for j in range(k // 2 - 1, -1, -1):
        _sift_down(hv, hi, j, k)
    for i in range(k, vals.shape[0]):
        v = vals[i]
        if v > hv[0]:   # (a later position with the root's value ranks below it)
            hv[0] = v
            hi[0] = i
            _sift_down(hv, hi, 0, k)
    out = np.empty(k, np.int64)
    for n in range(k - 1, -1, -1):   # pop the worst first
        out[n] = hi[0]
        hv[0], hi[0] = hv[n], hi[n]
        _sift_down(hv, hi, 0, n)
    return out


@numba.njit(**_NB)
def top_k_ids(logits: np.ndarray, k: int) -> np.ndarray:
    """The ids of the k largest logits, best first (equal logits: the lower id first).

    The k-th largest of the blocks' maxima (`TOPK_BLOCK` logits a block) is a floor t: those k
    maxima are k logits >= t, so no logit below t is among the k largest. The candidates, the
    logits >= t of the blocks whose max reaches t (a few k blocks' worth), are kept in id order
    and sorted stably by logit, so they rank as a pass over the whole vocabulary would
    rank them. A small vocabulary (2k blocks or fewer): one heap pass (`_heap_top_k`). SmolLM2's
    49152 logits fresh from a decoded token: 69-94 us a token as one heap pass over all."""
    n = logits.shape[0]
    nb = -(-n // TOPK_BLOCK)
    if nb <= 2 * k:
        return _heap_top_k(logits, k)
    bm = block_maxima(logits)
    t = np.partition(bm, nb - k)[nb - k]   # the k-th largest block max
    ids = np.empty(n, np.int64)
    m = 0
    for b in range(nb):
        if bm[b] >= t:
            for i in range(b * TOPK_BLOCK, min(n, (b + 1) * TOPK_BLOCK)):
                if logits[i] >= t:
                    ids[m] = i
                    m += 1
    if m < k:   # only where the logits hold NaNs (the maxima's flags assume none): the plain pass
        return _heap_top_k(logits, k)
    neg = np.empty(m, np.float32)
    for j in range(m):
        neg[j] = -logits[ids[j]]
    pos = np.argsort(neg, kind="mergesort")   # stable: equal logits keep the lower id first
    out = np.empty(k, np.int64)
    for j in range(k):
        out[j] = ids[pos[j]]
    return out


@numba.njit(**_NB)
def _pairwise_block(a: np.ndarray, lo: int, n: int) -> float:
    """NumPy's pairwise sum of a[lo:lo + n] for n <= 128: 8 accumulators, then the rest."""
    if n < 8:
        r = 0.0
        for i in range(lo, lo + n):
            r += a[i]
        return r
    r0, r1, r2, r3 = a[lo], a[lo + 1], a[lo + 2], a[lo + 3]
    r4, r5, r6, r7 = a[lo + 4], a[lo + 5], a[lo + 6], a[lo + 7]
    i = 8
    while i < n - n % 8:
        r0 += a[lo + i]
        r1 += a[lo + i + 1]
        r2 += a[lo + i + 2]
        r3 += a[lo + i + 3]
        r4 += a[lo + i + 4]
        r5 += a[lo + i + 5]
        r6 += a[lo + i + 6]
        r7 += a[lo + i + 7]
        i += 8
    r = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    while i < n:
        r += a[lo + i]
        i += 1
    return r


@numba.njit(**_NB)
def pairwise_sum(a: np.ndarray, lo: int, n: int) -> float:
    """sum(a[lo:lo + n]) as NumPy adds a float64 array (pairwise: blocks of up to 128 summed by
    `_pairwise_block`, longer runs split in halves cut at a multiple of 8, left + right), so the
    probabilities are the ones `ndarray.sum` gave. The halving runs on an explicit stack: Numba's
    cache does not keep a recursive function safely (a cached recursive version segfaulted)."""
    if n <= 128:
        return _pairwise_block(a, lo, n)
    los = np.empty(64, np.int64)
    ns = np.empty(64, np.int64)
    phase = np.zeros(64, np.int64)
    left = np.empty(64, np.float64)
    los[0], ns[0], phase[0] = lo, n, 0
    top = 0
    ret = 0.0
    while top >= 0:
        m = ns[top]
        n2 = m // 2
        n2 -= n2 % 8
        if m <= 128:
            ret = _pairwise_block(a, los[top], m)
            top -= 1
        elif phase[top] == 0:          # the left half first
            phase[top] = 1
            los[top + 1], ns[top + 1], phase[top + 1] = los[top], n2, 0
            top += 1
        elif phase[top] == 1:          # the left half's sum came back: the right half
            left[top] = ret
            phase[top] = 2
            los[top + 1], ns[top + 1], phase[top + 1] = los[top] + n2, m - n2, 0
            top += 1
        else:
            ret = left[top] + ret
            top -= 1
    return ret


@numba.njit(**_NB)
def _normalized_exps(vals: np.ndarray) -> np.ndarray:
    """exp(vals - vals[0]) / their sum (vals best first)."""
    probs = np.exp(vals - vals[0])
    return probs / pairwise_sum(probs, 0, probs.shape[0])


@numba.njit(**_NB)
def candidates(logits: np.ndarray, top_k: int, top_p: float, log_min_p: float,
               temperature: float) -> tuple[np.ndarray, np.ndarray]:
    """The sampler's chain after the penalties, compiled: top-k, top-p, min-p (``log_min_p``:
    log(min_p), 0 skips it), temperature -> (ids, their probabilities), best first. One call:
    the same steps as NumPy calls took ~150 us a token more, on code and data a decoded token
    had pushed out of the caches."""
    n = logits.shape[0]
    if 0 < top_k < n:
        idx = top_k_ids(logits, top_k)
    else:
        idx = np.argsort(-logits, kind="mergesort")
    vals = np.empty(idx.shape[0], np.float64)
    for i in range(idx.shape[0]):
        vals[i] = logits[idx[i]]
    if top_p < 1.0:
        cut = int(np.searchsorted(np.cumsum(_normalized_exps(vals)), top_p)) + 1
        idx, vals = idx[:cut], vals[:cut]
    if log_min_p != 0.0:
        keep = vals >= vals[0] + log_min_p
        idx, vals = idx[keep], vals[keep]
    return idx, _normalized_exps(vals / temperature)


@numba.njit(**_NB)
def draw(probs: np.ndarray, u: float) -> int:
    """The index ``Generator.choice(len(probs), p=probs)`` picks with its uniform draw ``u``: the
    first whose normalized cumulative probability exceeds u."""
    cdf = np.cumsum(probs)
    cdf /= cdf[-1]
    return int(np.searchsorted(cdf, u, side="right"))


@dataclass
class Sampler:
    params: SamplingParams
    rng: np.random.Generator = field(init=False)

    def __post_init__(self) -> None:
        self.params.validate()
        self.rng = np.random.default_rng(self.params.seed)

    def sample(self, logits: np.ndarray, history: list[int]) -> int:
        p = self.params
        logits = np.asarray(logits, dtype=np.float32)
        if p.repeat_penalty != 1.0 and history:
            logits = logits.copy()
            recent = np.unique(np.asarray(history[-p.repeat_last_n:], dtype=np.int64))
            vals = logits[recent]
            logits[recent] = np.where(vals > 0, vals / p.repeat_penalty, vals * p.repeat_penalty)
        if p.temperature <= 0:
            return int(np.argmax(logits))
        # candidates sorted by logit, best first (equal logits: the lower id first)
        log_min_p = float(np.log(p.min_p)) if p.min_p > 0 else 0.0
        idx, probs = candidates(logits, int(p.top_k), float(p.top_p), log_min_p, float(p.temperature))
        return int(idx[draw(probs, self.rng.random())])
