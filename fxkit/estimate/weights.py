"""Parameter counts and weight bytes of a :class:`ModelShape`, component by component.

Counted: embeddings and the LM head (once when tied), per layer the attention projections (GQA
or MLA, with their biases and MLA's latent norms), the MLP or the MoE block (router, routed and
shared experts), the two layer norms, and the final norm. Not counted: norms inside attention
(q/k norms, a few thousand values), DeepSeek's multi-token-prediction layer (loaded only for
speculative decoding). ``active`` counts what one token passes through (its top-k experts), the
basis of the prefill FLOPs.
"""

from __future__ import annotations

from dataclasses import dataclass

from fxkit.estimate.model import ModelShape


@dataclass(frozen=True)
class Params:
    """Parameters by where they are (counts, not bytes)."""

    embeddings: int  # embed_tokens and lm_head
    attention: int  # all layers' attention projections and biases
    mlp: int  # all layers' dense MLPs, routers, routed and shared experts
    norms: int
    active_per_token: int  # per token in the decoder layers (attention + top-k experts)
    quantizable_attention: int  # linear weights a quantization may cover
    quantizable_mlp: int

    @property
    def total(self) -> int:
        return self.embeddings + self.attention + self.mlp + self.norms


def attention_params(shape: ModelShape) -> tuple[int, int]:
    """One layer's attention parameters: (all, linear weights only)."""
    h = shape.hidden_size
    if shape.mla:
        m = shape.mla
        q_dim = shape.heads * (m.qk_nope_head_dim + m.qk_rope_head_dim)
        q = h * m.q_lora_rank + m.q_lora_rank * q_dim if m.q_lora_rank else h * q_dim
        kv_a = h * (m.kv_lora_rank + m.qk_rope_head_dim)
        kv_b = m.kv_lora_rank * shape.heads * (m.qk_nope_head_dim + m.v_head_dim)
        o = shape.heads * m.v_head_dim * h
        linear = q + kv_a + kv_b + o
        return linear + m.kv_lora_rank + (m.q_lora_rank or 0), linear
    q_dim = shape.heads * shape.head_dim
    kv_dim = shape.kv_heads * shape.head_dim
    linear = h * q_dim + 2 * h * kv_dim + q_dim * h
    bias = 0
    if shape.attention_bias or shape.qkv_bias:
        bias = q_dim + 2 * kv_dim + (h if shape.attention_bias else 0)
    return linear + bias, linear


def _mlp(shape: ModelShape, size: int) -> int:
    return (3 if shape.gated_mlp else 2) * shape.hidden_size * size


def moe_params(shape: ModelShape) -> tuple[int, int, int]:
    """One MoE layer: (all parameters, linear weights, parameters active per token)."""
    moe = shape.moe
    assert moe is not None
    h, size = shape.hidden_size, moe.expert_intermediate_size
    expert = _mlp(shape, size)
    expert_bias = (2 * size + h) if moe.expert_bias else 0
    router = h * moe.experts + (moe.experts if moe.router_bias else 0)
    shared = _mlp(shape, moe.shared_intermediate_size) + (h if moe.shared_expert_gate else 0)
    linear = moe.experts * expert + _mlp(shape, moe.shared_intermediate_size)
    total = moe.experts * (expert + expert_bias) + router + shared
    active = moe.experts_per_token * (expert + expert_bias) + router + shared
    return total, linear, active


def count(shape: ModelShape) -> Params:
    """The :class:`Params` of ``shape``."""
    h = shape.hidden_size
    attention, attention_linear = attention_params(shape)
    dense = _mlp(shape, shape.intermediate_size)
    moe_layers = sum(shape.moe.layers) if shape.moe else 0
    dense_layers = shape.layers - moe_layers
    moe_total, moe_linear, moe_active = moe_params(shape) if shape.moe else (0, 0, 0)
    embeddings = shape.vocab_size * h * (1 if shape.tie_word_embeddings else 2)
    return Params(
        embeddings=embeddings,
        attention=shape.layers * attention,
        mlp=dense_layers * dense + moe_layers * moe_total,
        norms=(2 * shape.layers + 1) * h,
        active_per_token=shape.layers * attention + dense_layers * dense + moe_layers * moe_active,
        quantizable_attention=shape.layers * attention_linear,
        quantizable_mlp=dense_layers * dense + moe_layers * moe_linear,
    )


def weight_bytes(shape: ModelShape, params: Params) -> float:
    """Bytes of the weights: the dtype's size, except the linear weights a quantization covers
    (at its size, plus its block or group scales)."""
    quant = shape.quantization
    covered = 0
    if quant:
        covered = params.quantizable_mlp + (params.quantizable_attention if quant.attention else 0)
    rest = params.total - covered
    per_covered = (quant.bytes_per_param + quant.scale_bytes_per_param) if quant else 0.0
    return rest * shape.dtype_bytes + covered * per_covered
