"""`token_layer`'s typed lists passed to the token call by address (`list_address`, `borrowed`).

The token call takes its layers' arguments as the address of a typed list (numba unboxes a List
object through Python code: ~50 us a token when the interpreter ran cold). The compiled side must
read the very items of the list, and take no reference of its own: a reference taken and not given
back leaks the list, one given back and not taken frees it under the caller."""

from __future__ import annotations

import numba
import pytest
import numpy as np

from workbench.engine.token_layer import borrowed, list_address, typed_layers


def test_a_list_passed_by_address_reads_its_items_and_leaves_its_reference_count():
    items = typed_layers(((np.arange(3.0), 1), (np.arange(3.0) * 2, 2), (np.full(3, 0.5), 4)))
    list_type = numba.typeof(items)

    @numba.njit
    def weighted_sum(addr):
        total = 0.0
        n = 0
        for arr, w in borrowed(addr, list_type):
            total += arr.sum() * w
            n += 1
        return total, n

    refs = items._opaque.refcount
    for _ in range(3):
        assert weighted_sum(list_address(items)) == (3.0 * 1 + 6.0 * 2 + 1.5 * 4, 3)
    assert items._opaque.refcount == refs
    # the list still holds its items after the calls (nothing freed under it)
    assert [float(a.sum()) * w for a, w in items] == [3.0, 12.0, 6.0]


@pytest.mark.parametrize("threads", [1, 2])
def test_prepare_decoding_compiles_the_very_call_a_decoded_token_makes(tiny_model, threads):
    """`Session.prepare_decoding` compiles the one-token call without running a token; decoding
    afterwards adds no other specialisation of it, and replies as an unprepared session does."""
    from workbench.engine import token_layer
    from workbench.engine.engine import Engine, Placement, TokenEvent
    from workbench.engine.sampling import SamplingParams
    eng = Engine.load(tiny_model, placement=Placement(threads=threads))
    try:
        prompt, greedy = [2, 270, 271, 272, 273], SamplingParams(temperature=0.0)
        plain = eng.new_session(256)
        want = [e.token for e in plain.generate(prompt, greedy, 6) if isinstance(e, TokenEvent)]
        token_layer._TOKENS.clear()  # a new dispatcher: its specialisations are this test's
        s = eng.new_session(256)
        assert s.prepare_decoding()
        (fn,) = token_layer._TOKENS.values()
        assert len(fn.overloads) == 1
        assert s.kv.n == 0 and s.tokens == []  # nothing ran
        got = [e.token for e in s.generate(prompt, greedy, 6) if isinstance(e, TokenEvent)]
        assert len(fn.overloads) == 1 and len(got) == 6
        assert got == want
    finally:
        eng.close()
