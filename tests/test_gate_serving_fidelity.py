"""The keys ``vllm_bench`` reads are the keys vLLM's ``vllm bench serve --save-result`` writes.

Read from vLLM's own source, ``vllm/benchmarks/serve.py`` of the sdist on PyPI (cached by
tests/vllm_source.py, sha256-checked), at the release the field runs (0.20.1, the source of
0.20.1+rocm721) and at the latest release, with ``ast``: the result dict literal
(``"completed"``, ``"failed"``, ``"output_throughput"``...), ``result_json["date"]`` and the
other keys set on the saved dict, the keys ``process_one_metric`` adds
(``result[f"mean_{metric_attribute_name}_ms"]``... and ``p{p_word}_..._ms`` for each percentile)
for the metrics it is called with (``ttft``, ``tpot``...), the default of
``--metric-percentiles`` (``99``) and the flags that save the file.
"""

from __future__ import annotations

import ast
import functools
import json
import tarfile
from pathlib import Path
from typing import Any

import pytest
import vllm_source
from test_loader_vllm_contract import latest_version

from fxkit.gate.measures.serving import VLLM_ABOUT, VLLM_KEYS, VLLM_REQUIRED, parse_vllm_result

SERVE = "vllm/benchmarks/serve.py"
PINNED = "0.20.1"


def serve_source(version: str) -> ast.Module:
    with tarfile.open(vllm_source.sdist(version)) as tar:
        for member in tar:
            if member.name.split("/", 1)[-1] == SERVE:
                file = tar.extractfile(member)
                assert file is not None
                return ast.parse(file.read(), filename=SERVE)
    raise AssertionError(f"vLLM {version} has no {SERVE}")


def _template(node: ast.JoinedStr) -> str:
    """``f"mean_{metric_attribute_name}_ms"`` -> ``mean_{}_ms``."""
    return "".join(part.value if isinstance(part, ast.Constant) else "{}" for part in node.values)


def _flag_default(tree: ast.Module, flag: str) -> Any:
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", "") == "add_argument"
            and any(isinstance(a, ast.Constant) and a.value == flag for a in node.args)
        ):
            for keyword in node.keywords:
                if keyword.arg == "default":
                    return ast.literal_eval(keyword.value)
            return None
    raise AssertionError(f"{SERVE} has no {flag}")


@functools.cache
def written_keys(version: str) -> frozenset[str]:
    """Every key a generation benchmark's result file of vLLM ``version`` has at its defaults
    (plus the optional ones of the dict literal)."""
    tree = serve_source(version)
    literal = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            keys = {k.value for k in node.keys if isinstance(k, ast.Constant)}
            if "output_throughput" in keys and "completed" in keys:
                literal |= keys
    templates = {
        _template(node.slice)
        for node in ast.walk(tree)
        if isinstance(node, ast.Subscript)
        and isinstance(node.value, ast.Name)
        and node.value.id == "result"
        and isinstance(node.slice, ast.JoinedStr)
    }
    metrics = {
        node.args[0].value
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and getattr(node.func, "id", "") == "process_one_metric"
        and node.args
        and isinstance(node.args[0], ast.Constant)
    }
    about = {
        node.slice.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Subscript)
        and getattr(node.value, "id", "") == "result_json"
        and isinstance(node.slice, ast.Constant)
        and isinstance(node.ctx, ast.Store)
    }
    percentiles = str(_flag_default(tree, "--metric-percentiles")).split(",")
    assert "p{}_{}_ms" in templates, f"{SERVE} no longer writes p<N>_<metric>_ms"
    keys = literal | about
    for metric in metrics:
        keys |= {t.format(metric) for t in templates if t.count("{}") == 1}
        keys |= {f"p{p}_{metric}_ms" for p in percentiles}
    return frozenset(keys)


def saves_result(version: str) -> bool:
    tree = serve_source(version)
    flags = {
        a.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument"
        for a in node.args
        if isinstance(a, ast.Constant)
    }
    dumps = any(
        isinstance(node, ast.Call)
        and getattr(node.func, "attr", "") == "dump"
        and node.args
        and getattr(node.args[0], "id", "") == "result_json"
        for node in ast.walk(tree)
    )
    return dumps and {"--save-result", "--result-dir", "--result-filename"} <= flags


def vllm_result(version: str = PINNED, **values: float) -> dict[str, Any]:
    """A result file's content with exactly the keys vLLM ``version`` writes (numbers: 1.0, or
    ``values`` by vLLM's key), as a test input for what fxkit reads."""
    result: dict[str, Any] = dict.fromkeys(sorted(written_keys(version)), 1.0)
    result.update({"completed": 100, "failed": 0, **values})
    return result


@pytest.mark.parametrize("which", ["pinned", "latest"])
def test_the_keys_vllm_bench_reads_are_the_keys_vllm_writes(which: str) -> None:
    version = PINNED if which == "pinned" else latest_version()
    keys = written_keys(version)
    # the reading finds what vLLM's docs show of a result file (a sanity check on it)
    assert {"duration", "completed", "request_throughput", "median_itl_ms"} <= keys
    assert sorted(set(VLLM_KEYS.values()) - keys) == [], f"not written by vLLM {version}"
    assert sorted(set(VLLM_ABOUT) - keys) == [], f"not written by vLLM {version}"
    assert saves_result(version), f"vLLM {version}'s serve.py does not save result_json"


def test_a_result_with_vllms_keys_parses_and_one_without_them_is_refused(tmp_path: Path) -> None:
    result = vllm_result(median_ttft_ms=812.5, p99_ttft_ms=1930.0, output_throughput=2210.4)
    data = parse_vllm_result(json.dumps(result), "g2.json")
    assert data["ttft_median_ms"] == 812.5 and data["ttft_p99_ms"] == 1930.0
    assert data["output_throughput"] == 2210.4 and data["completed"] == 100
    assert set(data) >= set(VLLM_KEYS)
    for key in VLLM_REQUIRED:
        broken = {k: v for k, v in result.items() if k != key}
        with pytest.raises(Exception, match=key):
            parse_vllm_result(json.dumps(broken), "g2.json")


def test_the_reading_would_catch_a_renamed_key() -> None:
    keys = set(written_keys(PINNED))
    assert "median_ttft_ms" in keys and "ttft_median_ms" not in keys
    keys.discard("p99_ttft_ms")
    assert set(VLLM_KEYS.values()) - keys == {"p99_ttft_ms"}
