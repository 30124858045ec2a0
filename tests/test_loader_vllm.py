"""The vLLM plugin against a small fake ``vllm`` package built in ``sys.modules``.

The fake mirrors the shapes fxkit relies on in vLLM's source (vllm-project/vllm):
``vllm/model_executor/model_loader/__init__.py`` (``register_model_loader(load_format)`` returns a
class decorator that requires a ``BaseModelLoader`` subclass; ``get_model_loader(load_config)``),
``vllm/model_executor/model_loader/default_loader.py`` (``DefaultModelLoader.Source``; ``__init__``
refuses unknown ``model_loader_extra_config`` keys; ``_prepare_weights(model_name_or_path,
subfolder, revision, fall_back_to_pt, allow_patterns_overrides)`` returns ``(folder, files,
use_safetensors, index_file)`` and refuses unknown load formats; ``get_all_weights`` and
``load_weights`` feed ``model.load_weights`` from ``_get_weights_iterator(source)``) and
``vllm/model_executor/model_loader/base_loader.py`` (``BaseModelLoader.__init__(load_config)``).
"""

from __future__ import annotations

import dataclasses
import glob
import importlib.metadata
import logging
import os
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from fxkit.loader import LoaderError, vllm_plugin
from loader_helpers import make_fifo, returns_at_once
from safetensors.torch import load_file, save_file


@dataclasses.dataclass
class LoadConfig:
    load_format: str = "auto"
    model_loader_extra_config: dict = dataclasses.field(default_factory=dict)


class BaseModelLoader:
    def __init__(self, load_config: LoadConfig) -> None:
        self.load_config = load_config


class DefaultModelLoader(BaseModelLoader):
    @dataclasses.dataclass
    class Source:
        model_or_path: str
        revision: str | None
        subfolder: str | None = None
        prefix: str = ""
        fall_back_to_pt: bool = True
        allow_patterns_overrides: list[str] | None = None

    def __init__(self, load_config: LoadConfig) -> None:
        super().__init__(load_config)
        unexpected = set(load_config.model_loader_extra_config) - {
            "enable_multithread_load", "num_threads", "enable_weights_track"
        }  # fmt: skip
        if unexpected:
            raise ValueError(f"Unexpected extra config keys: {unexpected}")

    def _prepare_weights(self, model_name_or_path, subfolder, revision, fall_back_to_pt,
                         allow_patterns_overrides):  # fmt: skip
        if self.load_config.load_format not in ("auto", "hf", "safetensors"):
            raise ValueError(f"Unknown load_format: {self.load_config.load_format}")
        files = sorted(glob.glob(os.path.join(model_name_or_path, "*.safetensors")))
        return model_name_or_path, files, bool(files), "model.safetensors.index.json"

    def _get_weights_iterator(self, source):
        raise AssertionError("the plugin must replace the weights iterator")

    def get_all_weights(self, model_config, model):
        yield from self._get_weights_iterator(self.Source(model_config.model, None, prefix=""))

    def load_weights(self, model, model_config) -> None:
        model.load_weights(self.get_all_weights(model_config, model))


@pytest.fixture
def fake_vllm(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    registry: dict[str, type] = {"auto": DefaultModelLoader, "safetensors": DefaultModelLoader}

    def register_model_loader(load_format: str):
        def wrapper(cls: type) -> type:
            if not issubclass(cls, BaseModelLoader):
                raise ValueError("The model loader must be a subclass of `BaseModelLoader`.")
            registry[load_format] = cls
            return cls

        return wrapper

    def get_model_loader(load_config: LoadConfig) -> BaseModelLoader:
        if load_config.load_format not in registry:
            raise ValueError(f"Load format `{load_config.load_format}` is not supported")
        return registry[load_config.load_format](load_config)

    loader_module = types.ModuleType("vllm.model_executor.model_loader")
    loader_module.__dict__.update(
        BaseModelLoader=BaseModelLoader,
        DefaultModelLoader=DefaultModelLoader,
        register_model_loader=register_model_loader,
        get_model_loader=get_model_loader,
        _LOAD_FORMAT_TO_MODEL_LOADER=registry,
    )
    for name in ("vllm", "vllm.model_executor"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setattr(sys.modules["vllm"], "__version__", "0.20.1+rocm721", raising=False)
    monkeypatch.setitem(sys.modules, "vllm.model_executor.model_loader", loader_module)
    monkeypatch.setattr(vllm_plugin, "_registered", False)
    return loader_module


class FakeModel:
    """Like a vLLM model: ``load_weights`` consumes the iterator and copies into parameters."""

    def __init__(self) -> None:
        self.params: dict[str, torch.Tensor] = {}

    def load_weights(self, weights: Iterator[tuple[str, torch.Tensor]]) -> set[str]:
        for name, tensor in weights:
            self.params[name] = tensor.clone()
        return set(self.params)


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    save_file({"a": torch.arange(10.0), "b": torch.ones(3, 3, dtype=torch.bfloat16)},
              tmp_path / "model-1.safetensors")  # fmt: skip
    save_file({"c": torch.arange(7, dtype=torch.int64)}, tmp_path / "model-2.safetensors")
    return tmp_path


def test_registers_load_format_and_loads_through_vllms_loader(
    fake_vllm: types.ModuleType, model_dir: Path
) -> None:
    vllm_plugin.register()
    config = LoadConfig(
        load_format="fxkit",
        model_loader_extra_config={"threads": 2, "chunk_size": 4096, "enable_weights_track": True},
    )
    loader = fake_vllm.get_model_loader(config)
    assert isinstance(loader, DefaultModelLoader)
    assert loader.fxkit_options == {"share": True, "threads": 2, "chunk_size": 4096}
    assert config.model_loader_extra_config["threads"] == 2, "the caller's config is left alone"
    model = FakeModel()
    loader.load_weights(model, types.SimpleNamespace(model=str(model_dir)))
    want = {
        **load_file(model_dir / "model-1.safetensors"),
        **load_file(model_dir / "model-2.safetensors"),
    }
    assert list(model.params) == ["a", "b", "c"]
    for name, tensor in want.items():
        assert torch.equal(model.params[name], tensor) and model.params[name].dtype == tensor.dtype


def test_ranks_share_reads_by_default_and_can_opt_out(fake_vllm: types.ModuleType) -> None:
    vllm_plugin.register()
    off = LoadConfig("fxkit", model_loader_extra_config={"share": False})
    assert fake_vllm.get_model_loader(off).fxkit_options == {"share": False}
    with pytest.raises(ValueError, match="share must be true or false"):
        fake_vllm.get_model_loader(LoadConfig("fxkit", model_loader_extra_config={"share": 2}))


def test_vllms_file_list_meets_the_loaders_file_rule(
    fake_vllm: types.ModuleType, model_dir: Path
) -> None:
    """vLLM globs ``*.safetensors``; a FIFO among them is refused at once, not waited on."""
    fifo = make_fifo(model_dir / "model-3.safetensors")
    vllm_plugin.register()
    loader = fake_vllm.get_model_loader(LoadConfig("fxkit"))
    weights = loader.get_all_weights(types.SimpleNamespace(model=str(model_dir)), None)
    with pytest.raises(LoaderError, match=f"{fifo}: is a FIFO, not a regular file"):
        returns_at_once(lambda: next(weights), fifo)


def test_hugging_face_style_symlinks_load_through_vllm(
    fake_vllm: types.ModuleType, model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A snapshot of links into a blob store elsewhere (the symlink policy: followed)."""
    snapshot = tmp_path_factory.mktemp("snapshot")
    for shard in model_dir.glob("*.safetensors"):
        (snapshot / shard.name).symlink_to(shard)
    vllm_plugin.register()
    model = FakeModel()
    fake_vllm.get_model_loader(LoadConfig("fxkit")).load_weights(
        model, types.SimpleNamespace(model=str(snapshot))
    )
    assert sorted(model.params) == ["a", "b", "c"]
    assert torch.equal(model.params["c"], load_file(model_dir / "model-2.safetensors")["c"])


@pytest.mark.parametrize("version", ["0.17.1", "0.9.2", "unknown"])
def test_a_vllm_older_than_checked_is_refused_by_name(
    fake_vllm: types.ModuleType, monkeypatch: pytest.MonkeyPatch, version: str
) -> None:
    """Registered, so that ``--load-format fxkit`` says why it cannot run, not "not supported"."""
    monkeypatch.setattr(sys.modules["vllm"], "__version__", version)
    vllm_plugin.register()
    oldest, newest = vllm_plugin.VLLM_CHECKED
    with pytest.raises(
        ValueError, match=rf"does not support vLLM {version}: .* {oldest} to {newest}"
    ):
        fake_vllm.get_model_loader(LoadConfig("fxkit"))


def test_a_vllm_newer_than_checked_is_used_with_a_warning(
    fake_vllm: types.ModuleType, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(sys.modules["vllm"], "__version__", "0.99.0")
    with caplog.at_level(logging.WARNING, logger=vllm_plugin.__name__):
        vllm_plugin.register()
    assert "vLLM 0.99.0 is newer than the newest vLLM checked against" in caplog.text
    assert fake_vllm.get_model_loader(LoadConfig("fxkit")).fxkit_options == {"share": True}


def test_register_is_idempotent(fake_vllm: types.ModuleType) -> None:
    vllm_plugin.register()
    first = fake_vllm._LOAD_FORMAT_TO_MODEL_LOADER["fxkit"]
    vllm_plugin.register()
    assert fake_vllm._LOAD_FORMAT_TO_MODEL_LOADER["fxkit"] is first


def test_bad_extra_config_is_refused(fake_vllm: types.ModuleType) -> None:
    vllm_plugin.register()
    for bad in ({"threads": 0}, {"chunk_size": "32MiB"}, {"drop_cache": "yes"}):
        with pytest.raises(ValueError, match="model_loader_extra_config"):
            fake_vllm.get_model_loader(LoadConfig("fxkit", bad))
    with pytest.raises(ValueError, match="Unexpected extra config keys"):
        fake_vllm.get_model_loader(LoadConfig("fxkit", {"nonsense": 1}))


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
