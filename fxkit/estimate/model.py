"""A model's shape from its Hugging Face ``config.json``: what the KV cache and the weights need.

:func:`read_config` gives a :class:`ModelShape`: layers, heads, head sizes, the attention kind (GQA,
which covers MHA and MQA, or DeepSeek's MLA), which layers slide and over what window, the MoE
layout, dtypes and declared quantization. A multimodal config's ``text_config`` is read instead of
the top level. Every key the calculator needs and cannot read, and every key that would change
the numbers in a way it does not model (cross-attention, linear attention, DeepSeek's sparse
attention indexer...), is an :class:`EstimateError` naming the key: never a silent wrong number.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fxkit.estimate.errors import EstimateError
from fxkit.yamlfile import read_json, short

#: Bytes per element of the dtypes a config (or an input) may name.
DTYPE_BYTES = {
    "float32": 4.0, "fp32": 4.0, "float16": 2.0, "fp16": 2.0, "half": 2.0,
    "bfloat16": 2.0, "bf16": 2.0, "float8": 1.0, "fp8": 1.0, "float8_e4m3fn": 1.0,
    "float8_e5m2": 1.0, "int8": 1.0, "int4": 0.5,
    # OCP MX: 32 four-bit values share one 8-bit scale.
    "mxfp4": (32 * 4 + 8) / 8 / 32,
}  # fmt: skip

#: Keys that change the KV cache in ways this calculator does not model.
UNSUPPORTED = {
    "cross_attention_layers": "cross-attention layers keep a KV cache of image tokens",
    "hybrid_override_pattern": "Mamba/attention hybrids keep a recurrent state, not a KV cache",
    "attention_chunk_size": "chunked local attention (Llama 4) is not modelled",
    "index_head_dim": "DeepSeek sparse attention adds an indexer cache that is not modelled",
    "full_attention_interval": "linear/full attention hybrids (Qwen3-Next) are not modelled",
}

#: Model types whose MLPs are gated (gate, up and down projections).
GATED = {
    "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "deepseek_v2",
    "deepseek_v3", "gpt_oss", "gemma", "gemma2", "gemma3_text", "phi3", "mllama_text_model",
}  # fmt: skip

#: Layer kinds of ``layer_types`` this calculator reads.
LAYER_KINDS = {"full_attention": "full", "sliding_attention": "sliding"}

MAX_LAYERS = 1024

#: The plausible range of every number the reader takes from a config (docs/ESTIMATOR.md):
#: beyond it no real model lies, and the arithmetic would overflow, divide by zero or not end.
#: A list's range holds for each of its entries.
RANGES: dict[str, tuple[int, int]] = {
    "num_hidden_layers": (1, MAX_LAYERS),
    "hidden_size": (1, 2**18),
    "num_attention_heads": (1, 4096),
    "num_key_value_heads": (1, 4096),
    "head_dim": (1, 4096),
    "vocab_size": (1, 2**24),
    "intermediate_size": (1, 2**20),
    "kv_lora_rank": (1, 2**16),
    "q_lora_rank": (1, 2**16),
    "qk_rope_head_dim": (1, 4096),
    "qk_nope_head_dim": (1, 4096),
    "v_head_dim": (1, 4096),
    "sliding_window": (1, 2**30),
    "sliding_window_pattern": (1, MAX_LAYERS),
    "max_window_layers": (0, MAX_LAYERS),
    "n_routed_experts": (0, 2**16),
    "num_experts": (0, 2**16),
    "num_local_experts": (0, 2**16),
    "num_experts_per_tok": (1, 2**16),
    "experts_per_token": (1, 2**16),
    "moe_intermediate_size": (1, 2**20),
    "n_shared_experts": (0, MAX_LAYERS),
    "shared_expert_intermediate_size": (0, 2**20),
    "first_k_dense_replace": (0, MAX_LAYERS),
    "moe_layer_freq": (1, MAX_LAYERS),
    "decoder_sparse_step": (1, MAX_LAYERS),
    "mlp_only_layers": (0, MAX_LAYERS - 1),
    "quantization_config.bits": (1, 16),
    "quantization_config.group_size": (1, 2**16),
    "quantization_config.weight_block_size": (1, 2**16),
}


@dataclass(frozen=True)
class MLA:
    """DeepSeek's multi-head latent attention: the cache keeps a compressed latent per token."""

    kv_lora_rank: int
    qk_rope_head_dim: int
    qk_nope_head_dim: int
    v_head_dim: int
    q_lora_rank: int | None


@dataclass(frozen=True)
class MoE:
    """The experts of the MoE layers (and which layers are MoE)."""

    experts: int
    experts_per_token: int
    expert_intermediate_size: int
    shared_intermediate_size: int  # all shared experts together; 0 when none
    shared_expert_gate: bool  # Qwen2-MoE's sigmoid gate on the shared expert
    layers: tuple[bool, ...]  # per layer: MoE (True) or dense MLP
    router_bias: bool
    expert_bias: bool


@dataclass(frozen=True)
class Quantization:
    """A declared ``quantization_config``: which weights it covers and at how many bytes each."""

    method: str
    bytes_per_param: float
    attention: bool  # attention projections quantized too (else only the MLP/experts)
    scale_bytes_per_param: float  # block or group scales


@dataclass(frozen=True)
class ModelShape:
    """What the estimator needs of a model, read from its config.json."""

    name: str
    model_type: str
    layers: int
    hidden_size: int
    heads: int
    kv_heads: int
    head_dim: int
    v_head_dim: int
    vocab_size: int
    intermediate_size: int
    tie_word_embeddings: bool
    dtype: str
    dtype_bytes: float
    gated_mlp: bool
    attention_bias: bool
    qkv_bias: bool
    window: tuple[int | None, ...]  # per layer: the sliding window in tokens, or None (full)
    mla: MLA | None = None
    moe: MoE | None = None
    quantization: Quantization | None = None

    @property
    def sliding_layers(self) -> int:
        return sum(w is not None for w in self.window)


class _Config:
    """A config mapping that names missing or wrong keys in its errors, and holds every number
    to its range in :data:`RANGES`. ``section`` is the key of a nested mapping, with a dot."""

    def __init__(self, data: dict[str, Any], where: str, prefix: str, section: str = "") -> None:
        self.data, self.where, self.prefix, self.section = data, where, prefix, section

    def nested(self, key: str) -> _Config:
        """The mapping at ``key`` (for its keys' names and ranges)."""
        return _Config(self.data[key], self.where, self.prefix, f"{self.section}{key}.")

    def error(self, key: str, message: str, hint: str | None = None) -> EstimateError:
        return EstimateError(
            f"config key {self.prefix}{self.section}{key}: {message}",
            where=self.where,
            hint=hint or "fix the config.json or give the value in the estimate inputs",
        )

    def has(self, key: str) -> bool:
        return self.data.get(key) is not None

    def whole(self, key: str, default: int | None = None) -> int:
        value = self.data.get(key)
        if value is None:
            if default is not None:
                return default
            raise self.error(key, "missing (the calculator needs it)")
        return self._bounded(key, key, value)

    def wholes(self, key: str, most: int) -> list[int]:
        """The list of at most ``most`` whole numbers at ``key`` (none when it is missing)."""
        values = self.data.get(key)
        if values is None:
            return []
        if not isinstance(values, list) or len(values) > most:
            raise self.error(key, f"{short(values)} is not a list of at most {most} numbers")
        return [self._bounded(key, f"{key}[{i}]", value) for i, value in enumerate(values)]

    def _bounded(self, key: str, name: str, value: Any) -> int:
        low, high = RANGES[self.section + key]
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(name, f"{short(value)} is not a whole number")
        if not low <= value <= high:
            raise self.error(
                name,
                f"{short(value)} is outside its plausible range {low:,} to {high:,}",
                hint="no real model has such a value: fix the config.json "
                "(docs/ESTIMATOR.md lists the ranges)",
            )
        return value

    def flag(self, key: str, default: bool) -> bool:
        value = self.data.get(key, default)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self.error(key, f"{short(value)} is not true or false")
        return value

    def text(self, key: str) -> str | None:
        value = self.data.get(key)
        if value is not None and not isinstance(value, str):
            raise self.error(key, f"{short(value)} is not a text")
        return value


def read_config(
    path: Path, dtype: str | None = None, weight_dtype: str | None = None
) -> ModelShape:
    """The :class:`ModelShape` of the config.json at ``path``. ``dtype`` overrides the config's
    ``torch_dtype``; ``weight_dtype`` its dtype and quantization of the decoder layers' linear
    weights."""
    data = read_json(
        path, EstimateError, "model config", "give the path of a Hugging Face config.json"
    )
    if not isinstance(data, dict):
        raise EstimateError("model config is not a JSON object", where=str(path))
    return shape_of(data, name=path.stem, where=str(path), dtype=dtype, weight_dtype=weight_dtype)


def shape_of(
    data: dict[str, Any],
    *,
    name: str,
    where: str,
    dtype: str | None = None,
    weight_dtype: str | None = None,
) -> ModelShape:
    """The :class:`ModelShape` of a parsed config (``where`` names it in errors)."""
    prefix = ""
    text = data.get("text_config")
    if isinstance(text, dict):
        merged = {k: v for k, v in data.items() if k in ("torch_dtype", "dtype")}
        merged.update({k: v for k, v in text.items() if v is not None})
        if "quantization_config" in data and "quantization_config" not in text:
            merged["quantization_config"] = data["quantization_config"]
        data, prefix = merged, "text_config."
    config = _Config(data, where, prefix)
    for key, why in UNSUPPORTED.items():
        if config.has(key) and data[key] not in ([], 0, False):
            raise config.error(key, f"not supported: {why}", hint="the estimate would be wrong")

    layers = config.whole("num_hidden_layers")
    hidden = config.whole("hidden_size")
    heads = config.whole("num_attention_heads")
    kv_heads = config.whole("num_key_value_heads", default=heads)
    if heads % kv_heads:
        raise config.error("num_key_value_heads", f"{kv_heads} does not divide {heads} heads")
    mla = _mla(config)
    if not config.has("head_dim") and hidden < heads:
        raise config.error("head_dim", f"missing, and hidden_size {hidden} < {heads} heads")
    head_dim = config.whole("head_dim", default=hidden // heads)
    model_type = config.text("model_type") or ""
    dtype = _dtype(config) if dtype is None else _known_dtype("model.dtype", dtype)
    return ModelShape(
        name=name,
        model_type=model_type,
        layers=layers,
        hidden_size=hidden,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=mla.qk_nope_head_dim + mla.qk_rope_head_dim if mla else head_dim,
        v_head_dim=mla.v_head_dim if mla else head_dim,
        vocab_size=config.whole("vocab_size"),
        intermediate_size=config.whole("intermediate_size"),
        tie_word_embeddings=config.flag("tie_word_embeddings", default=False),
        dtype=dtype,
        dtype_bytes=DTYPE_BYTES[dtype],
        gated_mlp=_gated(config, model_type),
        attention_bias=config.flag("attention_bias", default=False),
        qkv_bias=config.flag("qkv_bias", default=model_type == "qwen2"),
        window=_windows(config, layers, model_type),
        mla=mla,
        moe=_moe(config, layers, model_type),
        quantization=(
            _override(config, dtype, weight_dtype) if weight_dtype else _quantization(config)
        ),
    )


def _dtype(config: _Config) -> str:
    key = "torch_dtype" if config.has("torch_dtype") else "dtype"
    value = config.data.get(key)
    if value is None:
        raise config.error(
            "torch_dtype", "missing: the weights' dtype is unknown", "set model.dtype in the inputs"
        )
    if not isinstance(value, str) or value not in DTYPE_BYTES:
        raise config.error(key, f"{short(value)} is not a dtype the calculator knows")
    return value


def _known_dtype(key: str, dtype: str) -> str:
    """``dtype``, an input named ``key``, when the calculator knows its size."""
    if dtype not in DTYPE_BYTES:
        raise EstimateError(
            f"{key} {dtype!r} is not a dtype the calculator knows",
            hint=f"one of {', '.join(DTYPE_BYTES)}",
        )
    return dtype


def _gated(config: _Config, model_type: str) -> bool:
    if model_type in GATED:
        return True
    act = config.data.get("hidden_act") or config.data.get("hidden_activation")
    if act in ("silu", "swiglu"):
        return True
    if act in ("gelu", "gelu_new", "relu", "gelu_fast"):
        return False
    raise config.error(
        "hidden_act",
        f"{short(act)}: cannot tell whether the MLP is gated (model_type {model_type!r})",
    )


def _mla(config: _Config) -> MLA | None:
    if not config.has("kv_lora_rank"):
        return None
    return MLA(
        kv_lora_rank=config.whole("kv_lora_rank"),
        qk_rope_head_dim=config.whole("qk_rope_head_dim"),
        qk_nope_head_dim=config.whole("qk_nope_head_dim"),
        v_head_dim=config.whole("v_head_dim"),
        q_lora_rank=config.whole("q_lora_rank") if config.has("q_lora_rank") else None,
    )


def _windows(config: _Config, layers: int, model_type: str) -> tuple[int | None, ...]:
    """Per layer, the sliding window (tokens) or None for full attention, as declared."""
    types = config.data.get("layer_types")
    window = config.data.get("sliding_window")
    if config.data.get("use_sliding_window") is False or (window is None and types is None):
        return (None,) * layers
    if types is not None:
        if not isinstance(types, list) or len(types) != layers:
            raise config.error("layer_types", f"is not a list of {layers} layer kinds")
        for index, kind in enumerate(types):
            if not isinstance(kind, str) or kind not in LAYER_KINDS:
                raise config.error(
                    f"layer_types[{index}]",
                    f"{short(kind)} is not supported (only {', '.join(LAYER_KINDS)})",
                    hint="the estimate would be wrong",
                )
        if "sliding_attention" in types:
            size = config.whole("sliding_window")
            return tuple(size if kind == "sliding_attention" else None for kind in types)
        return (None,) * layers
    size = config.whole("sliding_window")
    if config.has("sliding_window_pattern"):  # Gemma 3: every pattern-th layer is global
        pattern = config.whole("sliding_window_pattern")
        return tuple(None if (i + 1) % pattern == 0 else size for i in range(layers))
    if model_type == "gemma2":  # alternating, even layers slide (its modelling code)
        return tuple(size if i % 2 == 0 else None for i in range(layers))
    if config.data.get("use_sliding_window") is True and config.has("max_window_layers"):
        first = config.whole("max_window_layers")  # Qwen2: layers from there on slide
        return tuple(size if i >= first else None for i in range(layers))
    if model_type in ("mistral", "mixtral", "qwen2", "qwen2_moe", "starcoder2", "phi3"):
        return (size,) * layers
    raise config.error(
        "sliding_window",
        f"declared for model_type {model_type!r} without layer_types: "
        "cannot tell which layers slide",
        hint="add layer_types to the config, or report the model type to fxkit",
    )


def _moe(config: _Config, layers: int, model_type: str) -> MoE | None:
    key = next(
        (k for k in ("n_routed_experts", "num_experts", "num_local_experts") if config.has(k)),
        None,
    )
    experts = config.whole(key) if key else 0
    if experts <= 1:
        return None
    top_k_key = "num_experts_per_tok" if config.has("num_experts_per_tok") else "experts_per_token"
    top_k = config.whole(top_k_key)
    if top_k > experts:
        raise config.error(top_k_key, f"{top_k} is more than the {experts} experts ({key})")
    size = (
        config.whole("moe_intermediate_size")
        if config.has("moe_intermediate_size")
        else config.whole("intermediate_size")
    )
    shared = 0
    if config.has("n_shared_experts"):
        shared = config.whole("n_shared_experts") * size
    elif config.has("shared_expert_intermediate_size"):
        shared = config.whole("shared_expert_intermediate_size")
    return MoE(
        experts=experts,
        experts_per_token=top_k,
        expert_intermediate_size=size,
        shared_intermediate_size=shared,
        shared_expert_gate=model_type == "qwen2_moe" and shared > 0,
        layers=_moe_layers(config, layers),
        router_bias=model_type == "gpt_oss",
        expert_bias=model_type == "gpt_oss",
    )


def _moe_layers(config: _Config, layers: int) -> tuple[bool, ...]:
    """Which layers are MoE: DeepSeek's first_k_dense_replace/moe_layer_freq, Qwen's
    mlp_only_layers/decoder_sparse_step, else all."""
    if config.has("first_k_dense_replace") or config.has("moe_layer_freq"):
        first = config.whole("first_k_dense_replace", default=0)
        every = config.whole("moe_layer_freq", default=1)
        return tuple(i >= first and i % every == 0 for i in range(layers))
    dense = set(config.wholes("mlp_only_layers", MAX_LAYERS))
    step = config.whole("decoder_sparse_step", default=1)
    return tuple(i not in dense and (i + 1) % step == 0 for i in range(layers))


def _quantization(config: _Config) -> Quantization | None:
    if not config.has("quantization_config"):
        return None
    if not isinstance(config.data["quantization_config"], dict):
        raise config.error("quantization_config", "is not a mapping")
    quant = config.nested("quantization_config")
    method = quant.data.get("quant_method")
    attention = _covers_attention(quant)
    if method == "fp8":
        block = quant.wholes("weight_block_size", 2)
        return Quantization("fp8", 1.0, attention, 4 / math.prod(block) if block else 0.0)
    if method == "mxfp4":
        return Quantization("mxfp4", DTYPE_BYTES["mxfp4"], attention, 0.0)
    if method in ("gptq", "awq"):
        if not quant.has("bits"):
            raise quant.error(
                "bits",
                f"missing for quant_method {method!r}: the weights' size is unknown",
                hint="set model.weight_dtype in the inputs (e.g. int4, mxfp4, bf16)",
            )
        grouped = quant.data.get("group_size") not in (None, -1)  # -1: GPTQ's one group
        scale = 2 / quant.whole("group_size") if grouped else 0.0
        return Quantization(method, quant.whole("bits") / 8, attention, scale)
    raise quant.error(
        "quant_method",
        f"{short(method)} is not a quantization the calculator sizes",
        hint="set model.weight_dtype in the inputs (e.g. fp8, int4, bf16)",
    )


def _override(config: _Config, dtype: str, weight_dtype: str) -> Quantization | None:
    """The decoder layers' linear weights stored as ``weight_dtype`` (an input), whatever the
    config declares; modules its ``quantization_config`` leaves out (attention) stay in dtype."""
    size = DTYPE_BYTES[_known_dtype("model.weight_dtype", weight_dtype)]
    if size == DTYPE_BYTES[dtype]:
        return None
    quant = config.data.get("quantization_config")
    attention = (
        _covers_attention(config.nested("quantization_config")) if isinstance(quant, dict) else True
    )
    return Quantization(weight_dtype, size, attention, 0.0)


def _covers_attention(quant: _Config) -> bool:
    """Whether a ``quantization_config`` covers the attention projections too: unless its
    ``modules_to_not_convert`` names ``self_attn``."""
    skipped = quant.data.get("modules_to_not_convert") or []
    if not isinstance(skipped, list) or not all(isinstance(m, str) for m in skipped):
        raise quant.error("modules_to_not_convert", f"{short(skipped)} is not a list of names")
    return not any("self_attn" in module for module in skipped)
