"""DeepSeek V2/V3/R1 (`deepseek2`): multi-head latent attention and routed + shared experts.

Attention in llama.cpp's current GGUF layout (the "absorbed" MLA): a token's key and value are
one compressed latent (attn_kv_a_mqa -> kv_lora_rank, RMS-normed by attn_kv_a_norm) plus one
rotary key part (n_rot) shared by all heads, which is all the cache keeps. Queries come from
attn_q, or through the q-LoRA (attn_q_a, attn_q_a_norm, attn_q_b); each head's non-rotary
part is mapped into the latent space by its slice of attn_k_b, so attention is one-KV-head MQA
over [latent, rotary key] rows, and each head's output (in latent space) is decompressed by its
slice of attn_v_b before attn_output. RoPE is the interleaved-pair kind, with YaRN scaling and
DeepSeek's mscale folded into the score scale as llama.cpp does.

FFN: the first `leading_dense_block_count` layers are dense; the others route to experts
(softmax or sigmoid gating, optional exp_probs_b selection bias, grouped selection, optional
weight normalisation and scale) and add the shared experts (ffn_*_shexp).
"""

from __future__ import annotations

import math

import numpy as np

from .. import ops
from ..config import ModelConfig
from ..gguf_file import ModelLoadError
from ..runtime import Runtime
from ..specs import MLASpec
from .moe import MoEDecoder

RECONVERT = "re-convert it with a current llama.cpp (convert_hf_to_gguf.py) to get attn_k_b/attn_v_b"


def _f32(x: float) -> np.float32:
    return np.float32(x)


class DeepSeek2(MoEDecoder):
    arch = "deepseek2"

    @staticmethod
    def configure(cfg: ModelConfig, md: dict) -> None:
        a = cfg.arch
        cfg.rope_neox = False
        if not cfg.kv_lora_rank or not cfg.head_dim_k_mla or not cfg.head_dim_v_mla:
            raise ModelLoadError(f"deepseek2 file without MLA metadata ({a}.attention.key_length_mla / "
                                 f"value_length_mla / kv_lora_rank): an old layout; {RECONVERT}")
        if cfg.n_head_kv != 1 or cfg.head_dim != cfg.kv_lora_rank + cfg.rope_dims or cfg.head_dim_v != cfg.kv_lora_rank:
            raise ModelLoadError(f"deepseek2 file with per-head keys/values (head_count_kv {cfg.n_head_kv}, "
                                 f"key_length {cfg.head_dim}): not the MLA layout; {RECONVERT}")
        if cfg.head_dim_k_mla <= cfg.rope_dims:
            raise ModelLoadError(f"{a}.attention.key_length_mla {cfg.head_dim_k_mla} leaves no non-rotary part")
        if cfg.n_expert_groups > 1 and (cfg.n_expert % cfg.n_expert_groups
                                        or not 0 < cfg.n_group_used <= cfg.n_expert_groups):
            raise ModelLoadError(f"{cfg.n_expert} experts cannot be used as {cfg.n_group_used} of "
                                 f"{cfg.n_expert_groups} groups ({a}.expert_group_count / expert_group_used_count)")
        if not cfg.expert_gating:
            cfg.expert_gating = 1  # files from before expert_gating_func: softmax (V2, V2.5)
        # llama.cpp: the GGUF's yarn_log_multiplier is 0.1 x mscale_all_dim
        log_mul = _f32(cfg.rope_yarn_log_mul) / _f32(0.1) if cfg.rope_yarn_log_mul else _f32(0.0)
        fs = _f32(cfg.rope_freq_scale)
        attn_factor = _f32(1.0)
        if cfg.rope_ext_factor != 0.0:
            factor = _f32(1.0) / fs
            # get_mscale(factor, m) / get_mscale(factor, m_all) with m = m_all for DeepSeek 2: 1,
            # then the cancelling 1 / (1 + 0.1 ln factor) that ggml's YaRN RoPE multiplies back
            if not log_mul:
                attn_factor = _f32(_f32(0.1) * _f32(math.log(factor)) + _f32(1.0)) if factor > 1 else _f32(1.0)
            attn_factor = _f32(attn_factor * (_f32(1.0) / (_f32(1.0) + _f32(0.1) * _f32(math.log(factor)))))
        attn_factor = _f32(attn_factor * _f32(float(md.get(f"{a}.rope.scaling.attn_factor", 1.0) or 1.0)))
        cfg.rope_attn_factor = float(attn_factor)
        # the score scale: mscale^2 / sqrt(key size), mscale from the original attn_factor
        inv = _f32(1.0) / fs
        org = _f32(attn_factor * (_f32(1.0) + _f32(0.1) * _f32(math.log(inv))))
        mscale = _f32(org * (_f32(1.0) + _f32(_f32(0.1) * log_mul) * _f32(math.log(inv))))
        cfg.attn_scale = float(_f32(_f32(_f32(1.0) * mscale) * mscale) / _f32(math.sqrt(cfg.head_dim_k_mla)))

    rows_attention = True  # `attention`'s only per-row step is `mla_attention` (engine.batch runs it row by row)

    def __init__(self, cfg: ModelConfig, rt: Runtime):
        if rt.has("blk.0.attn_kv_b.weight") and not rt.has("blk.0.attn_k_b.weight"):
            raise ModelLoadError(f"deepseek2 file with the old attn_kv_b tensor (no attn_k_b): {RECONVERT}")
        self.norm_weights = cfg.expert_weights_norm
        super().__init__(cfg, rt)

    def attention_tensors(self, il: int) -> list[str]:
        q = ["attn_q_a", "attn_q_a_norm", "attn_q_b"] if self.cfg.q_lora_rank else ["attn_q"]
        return ["attn_norm", *q, "attn_kv_a_mqa", "attn_kv_a_norm", "attn_k_b", "attn_v_b", "attn_output"]

    def expected_shapes(self) -> dict[str, tuple[int, ...]]:
        c = self.cfg
        out = super().expected_shapes()
        nope = c.head_dim_k_mla - c.rope_dims
        out["blk.0.attn_kv_a_mqa.weight"] = (c.n_embd, c.kv_lora_rank + c.rope_dims)
        out["blk.0.attn_k_b.weight"] = (nope, c.kv_lora_rank, c.n_head)
        out["blk.0.attn_v_b.weight"] = (c.kv_lora_rank, c.head_dim_v_mla, c.n_head)
        out["blk.0.attn_output.weight"] = (c.n_head * c.head_dim_v_mla, c.n_embd)
        if c.q_lora_rank:
            out["blk.0.attn_q_b.weight"] = (c.q_lora_rank, c.n_head * c.head_dim_k_mla)
        else:
            out["blk.0.attn_q.weight"] = (c.n_embd, c.n_head * c.head_dim_k_mla)
        return out

    def token_attention(self, il: int) -> MLASpec:
        """Layer il's MLA for the one-token layer calls (`mla_token`): `attention`'s steps."""
        c, p = self.cfg, f"blk.{il}."
        lora = bool(c.q_lora_rank)
        return MLASpec((p + ("attn_q_a.weight" if lora else "attn_q.weight"), p + "attn_kv_a_mqa.weight"),
                       p + "attn_q_a_norm.weight" if lora else "", p + "attn_q_b.weight" if lora else "",
                       p + "attn_kv_a_norm.weight", p + "attn_k_b.weight", p + "attn_v_b.weight",
                       p + "attn_output.weight", c.n_head, c.head_dim_k_mla - c.rope_dims, float(c.attn_scale),
                       float(c.norm_eps), bool(c.rope_neox))

    def attention(self, il: int, h: np.ndarray, kv, pos0: int, positions: np.ndarray, ropes: dict) -> np.ndarray:
        c, rt = self.cfg, self.rt
        n = h.shape[0]
        p = f"blk.{il}."
        H, dk, rot, lora = c.n_head, c.head_dim_k_mla, c.rope_dims, c.kv_lora_rank
        nope = dk - rot
        cs = ropes.get(0)
        if cs is None:
            cs = ropes[0] = ops.rope_cache(positions, rot, c.rope_base, c.rope_freq_scale, self.freq_factors,
                                           c.rope_ext_factor, c.rope_attn_factor, c.rope_corr[0], c.rope_corr[1])
        if n > 1 and not self.tap:  # a decode batch's rows (engine.batch): the one-token call over every row
            o = rt.rows_mla(self.token_attention(il), h, il - self.layers.start, cs)
            if o is not None:
                return o
        if c.q_lora_rank:
            qa, ckv = rt.linear(h, (p + "attn_q_a.weight", p + "attn_kv_a_mqa.weight"))
            (q,) = rt.linear(self.norm(qa, p + "attn_q_a_norm.weight"), (p + "attn_q_b.weight",))
        else:
            q, ckv = rt.linear(h, (p + "attn_q.weight", p + "attn_kv_a_mqa.weight"))
        q = q.reshape(n, H, dk)
        q_pe = np.ascontiguousarray(q[:, :, nope:])
        ops.apply_rope(q_pe, cs, c.rope_neox)
        k_pe = np.ascontiguousarray(ckv[:, lora:]).reshape(n, 1, rot)
        ops.apply_rope(k_pe, cs, c.rope_neox)
        latent = self.norm(np.ascontiguousarray(ckv[:, :lora]), p + "attn_kv_a_norm.weight")
        # each head's non-rotary query mapped into the latent space: [H, n, lora]
        q_abs = rt.sub_products(p + "attn_k_b.weight", np.ascontiguousarray(q[:, :, :nope].transpose(1, 0, 2)))
        qcat = np.concatenate([q_abs.transpose(1, 0, 2), q_pe], axis=2)  # [n, H, lora + rot]
        rows = np.concatenate([latent, k_pe.reshape(n, rot)], axis=1)     # [n, lora + rot]
        if self.tap:
            self.tap(f"Qcur-{il}", qcat); self.tap(f"Kcur-{il}", rows)
        att = rt.mla_attention(np.ascontiguousarray(qcat, dtype=np.float32), rows, kv, il - self.layers.start, pos0,
                                c.attn_scale)  # a stage's cache holds its own layers
        # decompress each head's output from the latent space: [H, n, v_head]
        out = rt.sub_products(p + "attn_v_b.weight", np.ascontiguousarray(att.transpose(1, 0, 2)))
        (o,) = rt.linear(np.ascontiguousarray(out.transpose(1, 0, 2)).reshape(n, -1), (p + "attn_output.weight",))
        return o
