"""When a prompt's work is worth handing to the other workers.

A long prompt's products, and a prompt's attention (the crew's workers wait in compiled code for
one token, a decode batch and a short prompt's products, `prompt_jobs`, only; the crew leaves its
loop for such work) go to the workers through Python threads (`WorkerPool.run`): a hand-off measured
0.2-0.4 ms on the Intel Xeon VM (family 6 model 106: wake, GIL, join), more than a short prompt's
product takes on the calling thread. On the R1 shape (`make_moe_model.py --shape r1`), 8 tokens at
2 threads: 720 hand-offs, 215-252 ms a prompt; with each worker's share run in turn on the calling
thread, 96-105 ms (1 thread: 82-97 ms). Work estimated under HANDOFF_SECONDS runs there
(`Runtime.each_worker`) in one piece when it can (each product over all its rows, as one worker
computes it: the R1 shape's 32-token prompt at 2 threads went from 300-450 to ~200 ms; 1 thread
~180 ms): the same kernel calls on the same rows, so the same bits.
"""
from __future__ import annotations

HANDOFF_SECONDS = 1e-3
STREAM_SECONDS_PER_BYTE = 1 / 13e9    # one core's read from memory (the probe on that host: 13 GB/s)
PRODUCT_SECONDS_PER_BYTE = 0.07e-9    # a quantized matmat's arithmetic per weight byte and column
ATTENTION_SECONDS_PER_FLOP = 1 / 10e9  # a prompt's F16 scores and values with their softmax, one thread


def product_seconds(nbytes: float, columns: float) -> float:
    """A rough one-thread time of a product over `nbytes` of quantized weights and `columns`
    inputs: each byte streamed once, then multiplied by each column."""
    return nbytes * (STREAM_SECONDS_PER_BYTE + columns * PRODUCT_SECONDS_PER_BYTE)


def attention_seconds(query_rows: int, key_slots: int, key_width: int, value_width: int) -> float:
    """A rough one-thread time of a prompt's attention: every query row's dots with `key_slots`
    keys and its weighted sum of as many values (as if no key were masked)."""
    return 2.0 * query_rows * key_slots * (key_width + value_width) * ATTENTION_SECONDS_PER_FLOP
