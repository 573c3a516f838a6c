"""A decoded token's whole mixture-of-experts layer in one compiled call.

With the attention sub-layer (`token_attention`) and the routed FFN (`expert_token`) each one
compiled call, what remained between them was Python: the residual adds, the norms, argument
lists. `crew_timeline.py` measured it as serial gaps of 55-110 us before each layer's q/k/v
products and 24-58 us before its router on the EPYC host (2 threads), while the crew's workers
spin: a quarter of a synthetic Qwen3-MoE token. `layer_runner` composes both calls with the residual
adds and norms (`ops.add_rms_norm`, the function the step-by-step path calls) in one function, so
the result is the same to the bit; `Runtime.layer_token` keeps the arguments that do not change
from token to token (tests/engine/test_token_attention.py compares both paths).
"""
from __future__ import annotations

from typing import Callable

import numba
import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic
from numba.typed import listobject

from . import ops
from .crew import ahead
from .kernels.jitcache import JIT as _NB

_LAYERS: dict = {}


def layer_runner(attn: Callable, ffn: Callable, inline: bool = False) -> Callable:
    """The compiled layer around `attn` (a `token_attention.block_runner` function) and `ffn` (an
    `expert_token.routed_runner` or `dense_token.dense_runner` function); `a_post`, `f_post`: the
    norms of the sub-layers' outputs before their residual adds (Gemma's post-attention and post-FFN
    norms; size 0: none), as `Decoder.add_norm`. inline: for compiled callers only (`token_runner`),
    compiled into the caller (numba's inline="always") instead of on its own and then again
    inside it (a callee's code is optimized once per caller it is linked into)."""
    key = (attn, ffn, inline)
    fn = _LAYERS.get(key)
    if fn is not None:
        return fn

    @numba.njit(**_NB, inline="always" if inline else "never")
    def fn(ctl, n_workers, x, h, a_head, rope, a_mid, pos0, a_win, start, base, a_tail, o, ffn_norm, f_args,
           f_out, next_norm, eps, h_next, a_post, f_post, f_first, next_first):
        """x [1, n_embd] (the residual, updated in place), h its normed value -> h_next, x normed
        by `next_norm`; o, f_out: the sub-layers' outputs [1, n_embd]; f_first, next_first: the
        first crew jobs of the FFN and of what follows the layer (`crew.ahead`: the workers read
        their weights while the norms between run here). False if a worker failed."""
        if not attn(ctl, n_workers, h[0], *a_head, rope, *a_mid, pos0, *a_win, start, base, *a_tail):
            return False
        ahead(ctl, f_first)
        h2 = np.empty_like(x)
        ops.add_rms_norm(x, o, a_post, a_post.shape[0] != 0, ffn_norm, eps, h2)
        if not ffn(ctl, n_workers, h2, *f_args):
            return False
        ahead(ctl, next_first)
        ops.add_rms_norm(x, f_out, f_post, f_post.shape[0] != 0, next_norm, eps, h_next)
        return True

    _LAYERS[key] = fn
    return fn


_TOKENS: dict = {}
A_FIRST = 16   # where a layer's argument tuple (`Runtime._token_layers`) holds its attention's first job


@numba.njit(**_NB)
def _list_of(item):
    out = numba.typed.List()
    out.append(item)
    return out


@numba.njit(**_NB)
def _append(items, item) -> None:
    items.append(item)


def typed_layers(layers: tuple, check: bool = True) -> numba.typed.List:
    """A typed list of the layers' argument tuples (all of one type), made in compiled code: made
    from Python, each append compiles numba's list methods for the item type in every process
    (1.9 s before a model's first decoded token); here they come from the disk cache. One layer
    per call: a function taking the whole tuple compiled the unboxing of every layer's ~50 arrays
    (14 s on a fresh install for 8 layers, more with more layers); this one compiles once per
    layer type, whatever the layer count. Raises numba's TypingError when the layers differ
    (check False: the caller knows they do not; numba.typeof of a tuple of arrays is ~0.5 ms)."""
    kinds = {numba.typeof(layer) for layer in layers} if check else {0}
    if len(kinds) != 1:  # appending a layer of another type would fail inside numba, not in typing
        raise numba.core.errors.TypingError(f"layers of {len(kinds)} different argument types")
    out = _list_of(layers[0])
    for layer in layers[1:]:
        _append(out, layer)
    return out


def one_call_layers(layers: list, fns: set) -> numba.typed.List | None:
    """The layers' typed list (`typed_layers`) when they can run in one compiled call: one set of
    sub-layer functions (`fns`) and arguments of one type; else None (the caller goes layer by
    layer)."""
    if len(fns) != 1:
        return None
    try:
        return typed_layers(tuple(layers))
    except numba.core.errors.TypingError:  # the layers' arguments differ in type
        return None


@intrinsic
def borrowed(typingctx, addr, list_ref):
    """The typed list (of type list_ref) whose C list pointer is stored at `addr` (`list_address`),
    without a reference of its own (a null meminfo: NRT's incref and decref skip it); the caller
    keeps the List alive. A typed List passed from Python is unboxed through Python code (numba's
    type check unpickles the List class, then reads `_opaque`): ~50 us a list when the interpreter
    ran cold after a token's weights streamed through the caches; an int is unboxed in C."""
    list_type = list_ref.instance_type

    def codegen(context, builder, sig, args):
        lst = cgutils.create_struct_proxy(list_type)(context, builder)
        lst.data = builder.load(builder.inttoptr(args[0], listobject.ll_list_type.as_pointer()))
        lst.meminfo = cgutils.get_null_value(lst.meminfo.type)
        return lst._getvalue()
    return list_type(types.intp, list_ref), codegen


def _unowned(context, builder, ty, val):
    """`val` of type `ty` with the meminfo of every array in it (through nested tuples) null."""
    if isinstance(ty, types.Array):
        arr = context.make_array(ty)(context, builder, value=val)
        arr.meminfo = cgutils.get_null_value(arr.meminfo.type)
        return arr._getvalue()
    if isinstance(ty, types.BaseTuple):
        for k, t in enumerate(ty.types):
            val = builder.insert_value(val, _unowned(context, builder, t, builder.extract_value(val, k)), k)
    return val


@intrinsic
def unowned_item(typingctx, lst, index):
    """Item `index` of a typed list of tuples, its arrays without references of their own (null
    meminfos, as `borrowed`); the list keeps them alive. numba's getitem increfs every array of
    the item (a layer's ~50) and the loop decrefs them, each an atomic add on a line of its own
    that a token's streamed weights had pushed out of the caches: ~1.5 % of a decoded token in
    `perf_decode.py`."""
    item_type = lst.item_type

    def codegen(context, builder, sig, args):
        lp = listobject._container_get_data(context, builder, sig.args[0], args[0])
        fnty = ir.FunctionType(cgutils.voidptr_t, [listobject.ll_list_type])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "numba_list_base_ptr")
        base = builder.bitcast(builder.call(fn, [lp]), context.get_data_type(item_type).as_pointer())
        item = context.data_model_manager[item_type].load_from_data_pointer(builder, cgutils.gep(builder, base,
                                                                                                   args[1]))
        return _unowned(context, builder, item_type, item)
    return item_type(lst, types.intp), codegen


def list_address(items: numba.typed.List) -> int:
    """Where `items`' C list pointer is stored (its meminfo's data, as numba's unboxing reads it);
    valid while `items` lives."""
    return int(items._opaque.data)


def token_runner(attn: Callable, ffn: Callable, layers_type: types.Type, out: Callable | None = None,
                 embed: Callable | None = None, prologue_type: types.Type | None = None) -> Callable:
    """A decoded token's every layer in one compiled call: `layer_runner`'s steps in a loop over a
    typed list of the layers' fixed arguments (one list for the token, not arrays per layer: a
    layer's ~50 arrays cost ~20 us to pass from Python), the attention window computed here.

    Each layer's routed experts go to a journal row (`routing.TokenJournal`: read in bulk, not per
    layer from Python). With `out` (a `crew.product_runner`) the call ends with the output product
    and returns the logits: the Python around the last layer ran cold after a token's weights
    streamed through the caches (~0.1 ms a token measured on the EPYC VM).

    With `embed` (a `kernels.dequantizer`, and `out`) the call starts from the token id: the
    embedding row, its scale, the first layer's input norm and the RoPE table of the position
    (the functions the Python path calls, in its order), from a prologue tuple made once.

    The typed lists come as `list_address` ints (see `borrowed`) of the types `layers_type` and
    `prologue_type` (numba.typeof of the lists; the latter with `embed`).

    The layer loop and the layer are compiled into the call (inline="always"): numba optimizes a
    callee's code again in every caller it is linked into, so on their own they cost a fresh
    install ~13 s more before the first decoded token. Not inlined further down: the attention
    block and the routed FFN take `*args`, and the crew's job tables carry raw addresses, so an
    array whose last use is inlined before the job runs would be freed under it."""
    if embed is not None and prologue_type is None:
        raise TypeError("token_runner with an embedding needs the prologue list's type")
    key = (attn, ffn, out, embed, layers_type, prologue_type)
    fn = _TOKENS.get(key)
    if fn is not None:
        return fn
    layer = layer_runner(attn, ffn, inline=True)

    @numba.njit(**_NB, inline="always")
    def layers_(ctl, n_workers, x, h, layers_at, ropes, pos0, skip_slid, journal, written, last_first):
        """... last_first: the crew job after the last layer (the output product's, or none)."""
        layers = borrowed(layers_at, layers_type)
        row = written[0] % journal.shape[0]
        n = len(layers)
        routed = 0   # the journal's row of the next routed layer (a dense layer journals nothing)
        for i in range(n):
            (a_head, a_mid, window, scale, a_tail, o, ffn_norm, f_args, f_out, next_norm, eps, h_next,
             ids, a_post, f_post, rope_i, _a_first, f_first) = unowned_item(layers, i)
            start = max(pos0 - window + 1, 0) if window else 0
            base = start // 64 * 64 if skip_slid else 0
            next_first = unowned_item(layers, i + 1)[A_FIRST] if i + 1 < n else last_first
            if not layer(ctl, n_workers, x, h, a_head, ropes[rope_i], a_mid, pos0, (window, scale), start, base,
                         a_tail, o, ffn_norm, f_args, f_out, next_norm, eps, h_next, a_post, f_post, f_first,
                         next_first):
                return False, h
            if ids.shape[0]:
                for j in range(ids.shape[0]):
                    journal[row, routed, j] = ids[j]
                routed += 1
            h = h_next
        written[0] += 1
        return True, h

    if out is not None:
        @numba.njit(**_NB)
        def output(ctl, n_workers, out_job, h_last, logits):
            tasks, chunks, n_owned, _n_out = out_job
            return out(ctl, n_workers, tasks, chunks, n_owned, h_last.reshape(-1), (logits,))

    if embed is not None:
        assert out is not None

        @numba.njit(**_NB)
        def fn(ctl, n_workers, tok, pos0, prologue, layers, skip_slid, journal, written, out_job, logits):
            """Token id `tok` at position pos0: its logits into `logits` [rows of the output]; False if
            a worker failed."""
            (emb, scale, norm_w, eps, n_rot, bases, freq_scale, freq_factors, ext, attn_f, c0,
             c1) = borrowed(prologue, prologue_type)[0]
            x = embed(emb, tok, tok + 1)
            if scale != 0.0:
                x *= np.float32(scale)
            h = np.empty_like(x)
            ops.rms_norm(x, norm_w, eps, h)
            pos = np.full(1, pos0, dtype=np.int64)
            ropes = np.empty((bases.shape[0], 1, n_rot // 2, 2), dtype=np.float32)
            for b in range(bases.shape[0]):
                r = ops.rope_cache(pos, n_rot, bases[b], freq_scale, freq_factors, ext, attn_f, c0, c1)
                # element by element: `ropes[b] = r` compiles numba's shape-mismatch message (its
                # string formatting: 5.3 s of this call's first compile)
                for i in range(n_rot // 2):
                    ropes[b, 0, i, 0] = r[0, i, 0]
                    ropes[b, 0, i, 1] = r[0, i, 1]
            ok, h_last = layers_(ctl, n_workers, x, h, layers, ropes, pos0, skip_slid, journal, written,
                                 (out_job[0], out_job[1], out_job[2]))
            return ok and output(ctl, n_workers, out_job, h_last, logits)
    elif out is None:
        @numba.njit(**_NB)
        def fn(ctl, n_workers, x, h, layers, ropes, pos0, skip_slid, journal, written, out_job, logits):
            """x [1, n_embd] (the residual, updated in place), h its normed value entering the first
            layer; each layer's h_next receives its output normed by the next norm; ropes [bases, 1,
            rope dims / 2, 2]: the position's RoPE table per base (each layer names its own). False
            if a worker failed. Returns a bool only, and takes the logits' buffer: boxing an array
            runs numba's unpickler (Python) on the way out."""
            ok, _h = layers_(ctl, n_workers, x, h, layers, ropes, pos0, skip_slid, journal, written,
                             (out_job[0], out_job[1], out_job[2]))
            return ok
    else:
        @numba.njit(**_NB)
        def fn(ctl, n_workers, x, h, layers, ropes, pos0, skip_slid, journal, written, out_job, logits):
            """As above, then the output product of the last layer's normed output into `logits`."""
            ok, h_last = layers_(ctl, n_workers, x, h, layers, ropes, pos0, skip_slid, journal, written,
                                 (out_job[0], out_job[1], out_job[2]))
            return ok and output(ctl, n_workers, out_job, h_last, logits)

    _TOKENS[key] = fn
    return fn
