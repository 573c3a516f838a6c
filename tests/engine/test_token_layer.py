"""`token_layer`'s typed lists passed to the token call by address (`list_address`, `_borrowed`).

The token call takes its layers' arguments as the address of a typed list (numba unboxes a List
object through Python code: ~50 us a token when the interpreter ran cold). The compiled side must
read the very items of the list, and take no reference of its own: a reference taken and not given
back leaks the list, one given back and not taken frees it under the caller."""

from __future__ import annotations

import numba
import numpy as np

from workbench.engine.token_layer import _borrowed, list_address, typed_layers


def test_a_list_passed_by_address_reads_its_items_and_leaves_its_reference_count():
    items = typed_layers(((np.arange(3.0), 1), (np.arange(3.0) * 2, 2), (np.full(3, 0.5), 4)))
    list_type = numba.typeof(items)

    @numba.njit
    def weighted_sum(addr):
        total = 0.0
        n = 0
        for arr, w in _borrowed(addr, list_type):
            total += arr.sum() * w
            n += 1
        return total, n

    refs = items._opaque.refcount
    for _ in range(3):
        assert weighted_sum(list_address(items)) == (3.0 * 1 + 6.0 * 2 + 1.5 * 4, 3)
    assert items._opaque.refcount == refs
    # the list still holds its items after the calls (nothing freed under it)
    assert [float(a.sum()) * w for a, w in items] == [3.0, 12.0, 6.0]
