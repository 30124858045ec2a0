"""What of the vLLM plugin vLLM's real source cannot run here (tests/test_loader_vllm_real.py runs
the rest inside vLLM's own loader): the warning when ``EngineArgs`` switches ``--load-format
fxkit`` to another loader (vLLM's ``vllm/engine/arg_utils.py`` needs all of vLLM), registering
without vLLM, the import cost and the entry point.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.metadata
import logging
import subprocess
import sys
import tarfile
import types
from collections.abc import Iterator

import pytest
from fxkit.loader import vllm_plugin
from test_loader_vllm_contract import FIELD_VERSION
from vllm_source import sdist

ARG_UTILS = "vllm/engine/arg_utils.py"


def _engine_args_source(version: str) -> ast.ClassDef:
    with tarfile.open(sdist(version)) as tar:
        member = tar.extractfile(f"vllm-{version}/{ARG_UTILS}")
        assert member is not None
        module = ast.parse(member.read())
    (cls,) = [n for n in module.body if isinstance(n, ast.ClassDef) and n.name == "EngineArgs"]
    return cls


def _switches(method: ast.FunctionDef) -> set[str]:
    """The load formats ``method`` assigns to ``self.load_format``."""
    return {
        node.value.value
        for node in ast.walk(method)
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
        and "self.load_format" in map(ast.unparse, node.targets)
    }  # fmt: skip


def test_vllm_switches_load_formats_inside_create_engine_config() -> None:
    """vLLM 0.20.1 (the field's) sets ``self.load_format`` to "gguf" and "bitsandbytes" in
    ``create_model_config``, ``create_load_config`` and ``create_engine_config``, all called by
    ``create_engine_config``, which the plugin's warning wraps."""
    cls = _engine_args_source(FIELD_VERSION)
    methods = {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef)}
    switching = {name: _switches(m) for name, m in methods.items() if _switches(m)}
    assert set().union(*switching.values()) == {"gguf", "bitsandbytes"}
    calls = {ast.unparse(n.func) for n in ast.walk(methods["create_engine_config"])
             if isinstance(n, ast.Call)}  # fmt: skip
    assert all(name == "create_engine_config" or f"self.{name}" in calls for name in switching)


@dataclasses.dataclass
class EngineArgs:
    """vLLM 0.20.1's switch, as in the test above: a GGUF file gets the GGUF loader."""

    model: str
    load_format: str = "auto"

    def create_engine_config(self, usage_context: object = None) -> types.SimpleNamespace:
        if self.model.endswith(".gguf"):
            self.load_format = "gguf"
        return types.SimpleNamespace(
            load_config=types.SimpleNamespace(load_format=self.load_format)
        )


@pytest.mark.parametrize(("model", "warned"), [("m.gguf", True), ("m", False)])
def test_a_switched_load_format_is_warned_about(
    model: str, warned: bool, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(EngineArgs, "create_engine_config", EngineArgs.create_engine_config)
    vllm_plugin.warn_when_bypassed(EngineArgs)
    vllm_plugin.warn_when_bypassed(EngineArgs)  # once only
    with caplog.at_level(logging.WARNING, logger=vllm_plugin.__name__):
        config = EngineArgs(model, "fxkit").create_engine_config()
        EngineArgs("m.gguf").create_engine_config()  # asked for no fxkit: nothing to say
    assert config.load_config.load_format == ("gguf" if warned else "fxkit")
    message = "fxkit: vLLM loads m.gguf with load format 'gguf', not 'fxkit': fxkit reads none"
    assert caplog.text.count(message) == warned


def test_no_vllm_logs_and_registers_nothing(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm raises ImportError
    monkeypatch.setattr(vllm_plugin, "_registered", False)
    with caplog.at_level(logging.WARNING, logger=vllm_plugin.__name__):
        vllm_plugin.register()
    assert "vLLM is not importable" in caplog.text
    assert not vllm_plugin._registered


def test_importing_fxkit_loader_imports_neither_vllm_nor_torch() -> None:
    code = (
        "import sys, fxkit.loader, fxkit.loader.vllm_plugin; "
        "print('vllm' in sys.modules, 'torch' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.stdout.split() == ["False", "False"]


def test_entry_point_is_declared() -> None:
    points = importlib.metadata.entry_points(group="vllm.general_plugins")
    assert any(p.value == "fxkit.loader.vllm_plugin:register" for p in points)


def test_an_argument_fxkit_does_not_know_is_left_to_vllm(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A newer vLLM passing its safetensors iterator something new (a filter, say): fxkit cannot
    honour what it does not know, so vLLM's own iterator reads those files."""
    calls = []

    def safetensors_weights_iterator(
        hf_weights_files: list[str], use_tqdm_on_load: bool, *, new_filter: str | None = None
    ) -> Iterator[tuple[str, None]]:
        calls.append((hf_weights_files, new_filter))
        return iter([("vllm's", None)])

    stand_in = vllm_plugin._stand_in(safetensors_weights_iterator, safetensors_weights_iterator)
    loader = types.SimpleNamespace(
        load_config=types.SimpleNamespace(safetensors_load_strategy=None), local_expert_ids=None
    )
    token = vllm_plugin._reading.set(vllm_plugin._Reading(loader, None))
    try:
        with caplog.at_level(logging.WARNING, logger=vllm_plugin.__name__):
            weights = stand_in(["a.safetensors"], False, new_filter="x")
    finally:
        vllm_plugin._reading.reset(token)
    assert list(weights) == [("vllm's", None)] and calls == [(["a.safetensors"], "x")]
    assert "vLLM passes ['new_filter'] to its safetensors iterator, which load format 'fxkit'" \
        in caplog.text  # fmt: skip
    assert list(stand_in(["b.safetensors"], False)) == [("vllm's", None)]  # outside fxkit's loader
