"""``fxkit estimate`` against hostile inputs: a config.json or inputs file whose numbers are huge,
zero, negative, non-finite, of the wrong type or nested without end gives one clear error naming
the key, its value, its plausible range and the file (docs/ESTIMATOR.md), never a traceback, an
overflow, a division by zero or a run out of memory."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fxkit.estimate import collect
from fxkit.estimate.errors import EstimateError
from fxkit.estimate.inputs import FIELDS, Field, defaults
from fxkit.estimate.model import RANGES, read_config
from fxkit.estimate.summary import estimate

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "tests" / "data" / "model_configs"
EXAMPLE = ROOT / "examples" / "estimate" / "qwen3-coder-480b-tp8.yml"
DOC = ROOT / "docs" / "ESTIMATOR.md"
DEEP = 200_000  # nesting far beyond any parser's recursion limit

GPTQ = {"torch_dtype": "bfloat16", "quantization_config": {"quant_method": "gptq", "bits": 4}}

#: Real configs, changes to them, and the keys of RANGES the reader reads in each.
READ_IN: list[tuple[str, dict[str, Any], list[str]]] = [
    ("llama-3.1-70b-instruct", {}, ["num_hidden_layers", "vocab_size", "intermediate_size"]),
    ("llama-3.1-70b-instruct", {"num_key_value_heads": 1}, ["num_attention_heads"]),
    ("llama-3.1-70b-instruct", {"num_attention_heads": 4096}, ["num_key_value_heads"]),
    ("qwen3-coder-480b-a35b-instruct", {},
     ["hidden_size", "head_dim", "num_experts", "moe_intermediate_size",
      "shared_expert_intermediate_size", "decoder_sparse_step"]),
    ("qwen3-coder-480b-a35b-instruct", {"num_experts": 65536}, ["num_experts_per_tok"]),
    ("qwen3-coder-480b-a35b-instruct",
     {"num_experts": 65536, "num_experts_per_tok": None, "experts_per_token": 8},
     ["experts_per_token"]),
    ("qwen3-coder-480b-a35b-instruct", {"mlp_only_layers": [0, 1]}, ["mlp_only_layers"]),
    ("deepseek-v3", {},
     ["kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim",
      "n_routed_experts", "n_shared_experts", "first_k_dense_replace", "moe_layer_freq",
      "quantization_config.weight_block_size"]),
    ("mistral-7b-v0.1", {}, ["sliding_window"]),
    ("mistral-7b-v0.1", {"sliding_window_pattern": 6}, ["sliding_window_pattern"]),
    ("mistral-7b-v0.1", {"use_sliding_window": True, "max_window_layers": 8},
     ["max_window_layers"]),
    ("gpt-oss-20b", GPTQ, ["num_local_experts", "quantization_config.bits"]),
    ("gpt-oss-20b",
     {**GPTQ, "quantization_config": {**GPTQ["quantization_config"], "group_size": 128}},
     ["quantization_config.group_size"]),
]  # fmt: skip
CASES = {key: (name, changes) for name, changes, keys in READ_IN for key in keys}

#: Values no config.json should hold, for any key.
HOSTILE: list[Any] = [
    10**4000, -1, 0, 10**9, 0.5, float("nan"), True, "128", [], [0, 0], {}, [[[[1]]]],
]  # fmt: skip


def config_with(name: str, changes: dict[str, Any]) -> dict[str, Any]:
    data = {**json.loads((CONFIGS / f"{name}.json").read_text()), **changes}
    return {k: v for k, v in data.items() if v is not None}


def get(data: dict[str, Any], key: str) -> Any:
    section, _, name = key.rpartition(".")
    return (data[section] if section else data).get(name)


def put(data: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    """``data`` with ``key`` (``quantization_config.bits``: in that section) set to ``value``."""
    section, _, name = key.rpartition(".")
    if not section:
        return {**data, name: value}
    body = data.get(section)
    return {**data, section: {**(body if isinstance(body, dict) else {}), name: value}}


def write(tmp_path: Path, data: Any, name: str = "config.json") -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def read_error(path: Path) -> str:
    with pytest.raises(EstimateError) as caught:
        read_config(path)
    return str(caught.value)


def test_every_ranged_key_is_read_from_a_real_config() -> None:
    assert sorted(CASES) == sorted(RANGES) and len(CASES) == sum(len(k) for *_, k in READ_IN)
    for key, (name, changes) in CASES.items():
        assert get(config_with(name, changes), key) is not None, key


@pytest.mark.parametrize("key", sorted(RANGES))
def test_each_number_out_of_its_range_names_key_value_range_and_file(
    key: str, tmp_path: Path
) -> None:
    low, high = RANGES[key]
    name, changes = CASES[key]
    data = config_with(name, changes)
    listed = isinstance(get(data, key), list)  # a list of numbers: its second entry
    for value in (low - 1, high + 1, 10**4000):
        path = write(tmp_path, put(data, key, [low, value] if listed else value))
        message = read_error(path)
        where = f"{key}[1]" if listed else key
        assert f"config key {where}: " in message and str(path) in message
        assert f"plausible range {low:,} to {high:,}" in message
        assert re.search(rf"{str(value)[:8]}\S* is outside", message), message
    for value in (low, high):  # at its bounds a value is read
        read_config(write(tmp_path, put(data, key, [low, value] if listed else value)))


@pytest.mark.parametrize(
    ("name", "change", "key"),
    [
        ("llama-3.1-70b-instruct", {"vocab_size": 10**4000}, "vocab_size"),
        ("llama-3.1-70b-instruct", {"num_hidden_layers": 10**9}, "num_hidden_layers"),
        (
            "deepseek-v3",
            {"quantization_config": {"quant_method": "fp8", "weight_block_size": [0, 0]}},
            "quantization_config.weight_block_size[0]",
        ),
        ("llama-3.1-70b-instruct", {"torch_dtype": []}, "torch_dtype"),
        ("mistral-7b-v0.1", {"layer_types": [["full_attention"]] * 32}, "layer_types[0]"),
        ("llama-3.1-70b-instruct", {"hidden_size": 32}, "head_dim"),
        ("qwen3-coder-480b-a35b-instruct", {"num_experts_per_tok": 161}, "num_experts_per_tok"),
        ("deepseek-v3", {"quantization_config": {"quant_method": "fp8",
                                                 "modules_to_not_convert": 5}},
         "quantization_config.modules_to_not_convert"),
    ],
)  # fmt: skip
def test_the_probes_configs_are_clear_errors_through_the_cli(
    name: str, change: dict[str, Any], key: str, tmp_path: Path
) -> None:
    path = write(tmp_path, config_with(name, change))
    done = subprocess.run(
        [sys.executable, "-m", "fxkit", "estimate", "--model", str(path)],
        capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert f"config key {key}" in done.stderr and str(path) in done.stderr


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('{"a": ' + "[" * DEEP + "]" * DEEP + "}", "nested too deeply"),
        ('{"hidden_act": ' + "[" * 100 + "]" * 100 + "}", "nested too deeply"),
        ('{"vocab_size": ' + "9" * 5000 + "}", "more than 4300 digits"),
        ('{"vocab_size": 12', "not JSON"),
    ],
)
def test_json_that_nests_without_end_or_holds_endless_numbers_is_refused(
    text: str, says: str, tmp_path: Path
) -> None:
    path = write(tmp_path, text)
    message = read_error(path)
    assert says in message and str(path) in message
    results = write(tmp_path, text, "results.json")
    with pytest.raises(EstimateError, match=says):
        collect(EXAMPLE, results=(results,))
    done = subprocess.run(
        [sys.executable, "-m", "fxkit", "estimate", str(EXAMPLE), "--model", str(path)],
        capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2 and "Traceback" not in done.stderr and says in done.stderr


@pytest.mark.parametrize(
    "name",
    # MLA, MoE and fp8; layer types and gptq; Qwen's MoE; a multimodal config's text_config
    ["deepseek-v3", "gpt-oss-20b", "qwen3-coder-480b-a35b-instruct",
     "llama-3.2-90b-vision-instruct"],
)  # fmt: skip
def test_any_hostile_value_at_any_key_is_an_estimate_error_or_an_estimate(
    name: str, tmp_path: Path
) -> None:
    """Every key of a real config (and every key the reader reads), each value of HOSTILE: the
    whole estimate runs to finite numbers or stops with an EstimateError, nothing else."""
    base = config_with(name, GPTQ if name == "gpt-oss-20b" else {})
    if name == "llama-3.2-90b-vision-instruct":  # its text config, without cross-attention
        base = {**base, "text_config": put(base["text_config"], "cross_attention_layers", [])}
    keys = set(base) | set(RANGES) | {"text_config", "layer_types", "torch_dtype"}
    keys |= {"quantization_config.quant_method", "quantization_config.modules_to_not_convert"}
    for key in sorted(keys):
        for value in HOSTILE:
            values, _ = collect(EXAMPLE, model=write(tmp_path, put(base, key, value)))
            try:
                result = estimate(values)
            except EstimateError:
                continue
            numbers = [r.value for rows in result.sections.values() for r in rows]
            assert all(math.isfinite(v) for v in numbers if isinstance(v, float)), (key, value)


def numeric_fields() -> list[Field]:
    return [f for f in FIELDS if f.kind not in ("text", "path")]


def test_every_numeric_input_has_a_plausible_range_its_default_lies_in() -> None:
    for spec in FIELDS:
        assert (spec.bounds is None) == (spec.kind in ("text", "path")), spec.key
    assert len(defaults().values) == sum(f.default is not None for f in FIELDS)


@pytest.mark.parametrize("spec", numeric_fields(), ids=lambda f: f.key)
def test_each_input_out_of_its_range_names_key_value_range_and_origin(
    spec: Field, tmp_path: Path
) -> None:
    assert spec.bounds is not None
    low, high = spec.bounds
    above = f"9{high}"  # 1 PiB -> 91 PiB, 100% -> 9100%
    beyond = [above, "9" * 5000, ".inf", ".nan", "-1"]
    if float(re.match(r"[\d.e]+", low)[0]) > 0:  # type: ignore[index]
        beyond.append("0")
    section, key = spec.key.split(".")
    for raw in beyond:
        path = write(tmp_path, f"{section}:\n  {key}: {raw}\n", "inputs.yml")
        with pytest.raises(EstimateError) as caught:
            values, _ = collect(path, model=CONFIGS / "mistral-7b-v0.1.json")
            estimate(values)
        message = str(caught.value)
        assert f"{path}:2" in message, message
        if raw != beyond[1]:  # a number YAML cannot read is an invalid YAML file at its line
            assert spec.key in message, message
        if raw in (above, "0"):
            assert f"plausible range {low} to {high}" in message, message
    with pytest.raises(EstimateError, match=f"plausible range {re.escape(low)} to"):
        collect(EXAMPLE, sets=(f"{spec.key}={above}",))
    for bound in spec.bounds:  # the range's ends are values
        collect(EXAMPLE, sets=(f"{spec.key}={bound}",))


def test_bounds_hold_measured_figures_too(tmp_path: Path) -> None:
    """A gate result whose figure is beyond its input's range is skipped, saying why."""
    result = {
        "schema": "fxkit-gate-result/1", "gate": "g1",
        "hosts": {"n1": {"checks": [
            {"id": "storage_read_bandwidth", "value": 10**400, "unit": "GB/s", "status": "PASS"},
            {"id": "storage_read_latency", "value": 5, "unit": "h", "status": "PASS"},
            {"id": "output_throughput", "value": 10**400, "unit": "tok/s", "status": "PASS"},
        ]}},
    }  # fmt: skip
    values, used = collect(EXAMPLE, results=(write(tmp_path, result, "g1.json"),))
    assert used[0].figures == [] and len(used[0].skipped) == 3
    assert any("plausible range 0 s to 1 min" in s for s in used[0].skipped), used[0].skipped
    assert values.origins["store.latency"].startswith(f"{EXAMPLE}:")  # the inputs file's


def test_docs_give_every_range() -> None:
    doc = DOC.read_text()
    for spec in FIELDS:
        shown = f"{spec.bounds[0]} to {spec.bounds[1]}" if spec.bounds else "-"
        default = spec.default if spec.default is not None else "-"
        assert f"| `{spec.key}` | {spec.kind} | {default} | {shown} |" in doc, spec.key
    for key, (low, high) in RANGES.items():
        assert f"| `{key}` | {low:,} to {high:,} |" in doc, key
