"""The vLLM plugin inside vLLM's real loader: ``default_loader.py``, ``weight_utils.py``,
``ep_weight_filter.py`` and ``LoadConfig`` from the sdists of vLLM 0.18.0 and 0.33.0 (the ends of
VLLM_CHECKED) and 0.20.1 (the field's), run by tests/vllm_source.py with vLLM's heavy imports
stubbed. Each test loads with vLLM's own loader (``--load-format auto``) and with fxkit's
(``--load-format fxkit``) through vLLM's real ``load_weights``, and compares what reaches the
model. The parts the real source cannot run (``EngineArgs``) are in tests/test_loader_vllm.py.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import vllm_source
from fxkit.loader import LoaderError, cache, vllm_plugin
from loader_helpers import make_fifo, returns_at_once
from packaging.version import Version
from safetensors.torch import save_file
from test_loader_vllm_contract import FIELD_VERSION

VERSIONS = sorted({*vllm_plugin.VLLM_CHECKED, FIELD_VERSION}, key=Version)
EXPERTS, LAYERS = 8, 2


@pytest.fixture(scope="module", params=VERSIONS)
def workdir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    return request.param, tmp_path_factory.mktemp("vllm-src")


@pytest.fixture
def vllm(workdir: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """vLLM's loader modules, with fxkit's plugin registered in them."""
    version, root = workdir
    with vllm_source.running(version, root) as source:
        monkeypatch.setattr(vllm_plugin, "_registered", False)
        vllm_plugin.register()
        source.Fxkit = source.registered[vllm_plugin.LOAD_FORMAT]
        yield source


@pytest.fixture
def fxkit_reads(monkeypatch: pytest.MonkeyPatch) -> list[tuple[list[str], Any]]:
    """The files fxkit's iterator is given, with the options, as it is called."""
    calls: list[tuple[list[str], Any]] = []
    real = vllm_plugin.weights_iterator

    def spy(files: list[str], options: dict, keep: Any = None) -> Iterator[tuple[str, Any]]:
        calls.append(([Path(f).name for f in files], options))
        return real(files, options, keep)

    monkeypatch.setattr(vllm_plugin, "weights_iterator", spy)
    return calls


def tensor(seed: int, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def moe_tensors(layer: int) -> dict[str, torch.Tensor]:
    """One layer of a small MoE, named as vLLM's EP filter expects (``.experts.<id>.``)."""
    prefix = f"model.layers.{layer}."
    tensors = {prefix + "self_attn.qkv_proj.weight": tensor(layer, 24, 16)}
    tensors[prefix + "mlp.gate.weight"] = tensor(layer + 100, EXPERTS, 16)
    for e in range(EXPERTS):
        tensors[prefix + f"mlp.experts.{e}.down_proj.weight"] = tensor(layer * 50 + e, 64, 256)
        tensors[prefix + f"mlp.experts.{e}.down_proj.weight_scale"] = tensor(e, 1)
    return tensors


def write_shards(folder: Path, shards: dict[str, dict[str, torch.Tensor]], index: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    weight_map = {}
    for name, tensors in shards.items():
        save_file(tensors, folder / name)
        weight_map.update(dict.fromkeys(tensors, name))
    (folder / index).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return folder


@pytest.fixture(scope="module")
def moe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two shards and their index, plus a stray full copy the index leaves out (vLLM's index
    filter drops it)."""
    root = tmp_path_factory.mktemp("moe")
    shards = {f"model-{i + 1:05d}-of-00002.safetensors": moe_tensors(i) for i in range(LAYERS)}
    write_shards(root, shards, "model.safetensors.index.json")
    save_file({**moe_tensors(0), **moe_tensors(1)}, root / "model.safetensors")
    (root / "config.json").write_text("{}")
    return root


class Model(torch.nn.Module):
    """A model vLLM's ``load_weights`` feeds: it keeps what it is given, by name."""

    def __init__(self, **attributes: Any) -> None:
        super().__init__()
        self.got: dict[str, torch.Tensor] = {}
        self.__dict__.update(attributes)

    def load_weights(self, weights: Any) -> set[str]:
        for name, weight in weights:
            assert name not in self.got, f"{name} twice"
            self.got[name] = weight.clone()
        return set()


def model_config(path: Path, **changes: Any) -> types.SimpleNamespace:
    fields = {
        "model": str(path),
        "revision": None,
        "quantization": None,
        "is_moe": True,
        "get_num_experts": lambda: EXPERTS,
        "multimodal_config": None,
    }
    return types.SimpleNamespace(**{**fields, **changes})


def load(vllm: Any, fmt: str, path: Path, extra: dict | None = None, **model: Any) -> Any:
    """``(loader, model)`` after vLLM's ``load_weights`` with load format ``fmt``."""
    config = vllm.LoadConfig(load_format=fmt, model_loader_extra_config=extra or {})
    cls = vllm.Fxkit if fmt == vllm_plugin.LOAD_FORMAT else vllm.DefaultModelLoader
    loader = cls(config)
    target = Model(**model)
    loader.load_weights(target, model_config(path))
    return loader, target


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert sorted(a) == sorted(b)
    for name in a:
        assert torch.equal(a[name], b[name]), name


def test_fxkit_reads_what_vllm_reads_in_vllms_order(
    vllm: Any, moe: Path, fxkit_reads: list, caplog: pytest.LogCaptureFixture
) -> None:
    _, theirs = load(vllm, "auto", moe)
    with caplog.at_level(logging.INFO):
        loader, ours = load(vllm, "fxkit", moe)
    same(ours.got, theirs.got)
    assert list(ours.got) == list(theirs.got)  # vLLM's natural file order
    # vLLM's index filter dropped model.safetensors; fxkit read the two shards, sharing.
    assert fxkit_reads == [
        (["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"], {"share": True})
    ]
    # vLLM's own timing log is true: its counter started when fxkit's iterator was made.
    assert 0 < loader.counter_before_loading_weights < loader.counter_after_loading_weights
    assert "Loading weights took" in caplog.text


def test_vllms_own_loaders_keep_vllms_iterator(vllm: Any, moe: Path, fxkit_reads: list) -> None:
    load(vllm, "auto", moe)
    load(vllm, "safetensors", moe)
    assert fxkit_reads == []


@pytest.mark.parametrize("placement", ["linear", "round_robin"])
def test_expert_parallel_ranks_read_only_their_experts(
    vllm: Any, moe: Path, placement: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM's ``_init_ep_weight_filter`` computes each rank's experts; fxkit keeps the same
    tensors as vLLM's filtering iterator, reading only their byte ranges."""
    monkeypatch.setenv("FXKIT_SHM_DIR", str(tmp_path))
    shards = sorted(moe.glob("model-*.safetensors"))
    total = sum(f.stat().st_size for f in shards)
    for rank in (0, 3):
        vllm.parallel.set(ep_size=4, ep_rank=rank, placement=placement)
        loader, theirs = load(vllm, "auto", moe)
        assert loader.local_expert_ids and len(loader.local_expert_ids) == EXPERTS // 4
        assert not cache.evict_all(shards)
        before = vllm_source.rchar()
        ours_loader, ours = load(vllm, "fxkit", moe, {"share": False, "chunk_size": 4096})
        read = vllm_source.rchar() - before
        assert ours_loader.local_expert_ids == loader.local_expert_ids
        same(ours.got, theirs.got)
        skipped = [n for n in moe_tensors(0) if n not in theirs.got]
        assert len(skipped) == EXPERTS - EXPERTS // 4  # the heavy tensors of other experts
        assert all(n.endswith(".weight") for n in skipped)
        assert read < total / 2


def test_a_mistral_layout_reads_the_consolidated_files(
    vllm: Any, tmp_path: Path, fxkit_reads: list
) -> None:
    write_shards(tmp_path, {"model.safetensors": moe_tensors(0)}, "model.safetensors.index.json")
    mistral = {"layers.0.attention.wq.weight": tensor(7, 4, 4)}
    write_shards(
        tmp_path, {"consolidated.safetensors": mistral}, "consolidated.safetensors.index.json"
    )
    _, theirs = load(vllm, "auto", tmp_path)
    _, ours = load(vllm, "fxkit", tmp_path)
    same(ours.got, theirs.got)
    assert list(ours.got) == list(mistral)
    assert fxkit_reads[0][0] == ["consolidated.safetensors"]


def test_a_pt_checkpoint_goes_to_vllms_own_iterator(
    vllm: Any, tmp_path: Path, fxkit_reads: list, caplog: pytest.LogCaptureFixture
) -> None:
    """fairseq2 Llama's shape: the model's patterns pick ``model.pt``."""
    torch.save({"model.embed.weight": tensor(1, 3, 3)}, tmp_path / "model.pt")
    save_file({"unused": tensor(2, 1)}, tmp_path / "other.safetensors")
    patterns = {"allow_patterns_overrides": ["model.pt"]}
    _, theirs = load(vllm, "auto", tmp_path, **patterns)
    with caplog.at_level(logging.WARNING):
        _, ours = load(vllm, "fxkit", tmp_path, **patterns)
    same(ours.got, theirs.got)
    assert fxkit_reads == []
    assert "has no safetensors files here: vLLM reads its weights itself, not load format " \
           "'fxkit'" in caplog.text  # fmt: skip


def test_a_pt_file_among_safetensors_is_not_parsed_as_safetensors(
    vllm: Any, tmp_path: Path, fxkit_reads: list, caplog: pytest.LogCaptureFixture
) -> None:
    """BGE-M3's ``sparse_linear.pt``, a secondary source, in a folder vLLM reads as a Mistral
    layout: vLLM 0.33 hands every file it lists to its safetensors iterator, which fails on it;
    fxkit gives it to vLLM's ``.pt`` iterator. vLLM 0.18 and 0.20 drop it before (it is not in
    the index), and then both fail alike."""
    consolidated = {"layers.0.attention.wq.weight": tensor(7, 4, 4)}
    write_shards(
        tmp_path, {"consolidated.safetensors": consolidated}, "consolidated.safetensors.index.json"
    )
    sparse = {"weight": tensor(3, 1, 4)}
    torch.save(sparse, tmp_path / "sparse_linear.pt")
    source = vllm.DefaultModelLoader.Source(
        str(tmp_path), None, prefix="sparse_linear.", allow_patterns_overrides=["sparse_linear.pt"]
    )
    with pytest.raises(Exception) as vllms:  # whatever vLLM's own path raises
        load(vllm, "auto", tmp_path, secondary_weights=[source])
    if isinstance(vllms.value, RuntimeError):
        assert "Cannot find any model weights" in str(vllms.value)
        with pytest.raises(RuntimeError, match="Cannot find any model weights"):
            load(vllm, "fxkit", tmp_path, secondary_weights=[source])
        return
    assert "deserializing header" in str(vllms.value)  # safe_open on a .pt file
    with caplog.at_level(logging.WARNING):
        _, ours = load(vllm, "fxkit", tmp_path, secondary_weights=[source])
    assert list(ours.got) == [*consolidated, "sparse_linear.weight"]
    assert torch.equal(ours.got["sparse_linear.weight"], sparse["weight"])
    assert f"{tmp_path / 'sparse_linear.pt'} not safetensors: vLLM reads it with its own " \
           f"iterator, not load format 'fxkit'" in caplog.text  # fmt: skip
    assert fxkit_reads[0][0] == ["consolidated.safetensors"]


def test_mixed_files_are_read_in_vllms_order_each_by_its_reader(
    vllm: Any, tmp_path: Path, fxkit_reads: list
) -> None:
    save_file({"a": tensor(1, 2)}, tmp_path / "part-1.safetensors")
    torch.save({"b": tensor(2, 2)}, tmp_path / "part-2.pt")
    save_file({"c": tensor(3, 2)}, tmp_path / "part-10.safetensors")
    loader = vllm.Fxkit(vllm.LoadConfig(load_format="fxkit"))
    files = [str(tmp_path / f) for f in ("part-10.safetensors", "part-2.pt", "part-1.safetensors")]
    token = vllm_plugin._reading.set(vllm_plugin._Reading(loader, None))
    try:
        weights = vllm.default_loader.safetensors_weights_iterator(files, False)
    finally:
        vllm_plugin._reading.reset(token)
    assert [name for name, _ in weights] == ["a", "b", "c"]
    assert [files for files, _ in fxkit_reads] == [["part-1.safetensors"], ["part-10.safetensors"]]


def test_unused_weights_are_not_read(vllm: Any, tmp_path: Path, fxkit_reads: list) -> None:
    """vLLM 0.33's ``is_unused_checkpoint_weight`` (an MTP drafter's): vLLM drops the shards that
    hold only unused weights; fxkit also skips the unused tensors of the shards it reads."""
    if not hasattr(vllm.DefaultModelLoader.Source, "is_unused_weight"):
        pytest.skip(f"vLLM {vllm.version} has no is_unused_weight")
    mixed = {"mtp.fc.weight": tensor(1, 4, 4), "model.layers.0.weight": tensor(2, 256, 256)}
    unused_only = {"model.layers.1.weight": tensor(3, 4, 4)}
    write_shards(
        tmp_path,
        {
            "model-00001-of-00002.safetensors": mixed,
            "model-00002-of-00002.safetensors": unused_only,
        },
        "model.safetensors.index.json",
    )

    def unused(name: str) -> bool:
        return not name.startswith("mtp.")

    _, theirs = load(vllm, "auto", tmp_path, is_unused_checkpoint_weight=unused)
    assert sorted(theirs.got) == sorted(mixed)  # vLLM reads the mixed shard whole
    shard = tmp_path / "model-00001-of-00002.safetensors"
    assert not cache.evict_all([shard])
    before = vllm_source.rchar()
    _, ours = load(
        vllm, "fxkit", tmp_path, {"chunk_size": 4096}, is_unused_checkpoint_weight=unused
    )
    assert vllm_source.rchar() - before < shard.stat().st_size / 4
    assert list(ours.got) == ["mtp.fc.weight"]
    assert fxkit_reads[0][0] == ["model-00001-of-00002.safetensors"]


def test_encoder_only_shards_are_dropped_by_vllm_before_fxkit(
    vllm: Any, tmp_path: Path, fxkit_reads: list
) -> None:
    if not hasattr(vllm.weight_utils, "filter_mm_encoder_only_safetensors_files"):
        pytest.skip(f"vLLM {vllm.version} has no --mm-encoder-only")
    shards = {
        "model-00001-of-00002.safetensors": {"visual.proj.weight": tensor(1, 4)},
        "model-00002-of-00002.safetensors": {"language_model.head.weight": tensor(2, 4)},
    }
    write_shards(tmp_path, shards, "model.safetensors.index.json")
    config = model_config(tmp_path, multimodal_config=types.SimpleNamespace(mm_encoder_only=True))
    for fmt in ("auto", "fxkit"):
        cls = vllm.Fxkit if fmt == "fxkit" else vllm.DefaultModelLoader
        model = Model(_language_model_names=["language_model"])
        cls(vllm.LoadConfig(load_format=fmt)).load_weights(model, config)
        assert list(model.got) == ["visual.proj.weight"]
    assert fxkit_reads[0][0] == ["model-00001-of-00002.safetensors"]


@pytest.mark.parametrize("strategy", ["lazy", "eager", "prefetch"])
def test_read_strategies_give_vllms_tensors(
    vllm: Any, moe: Path, strategy: str, fxkit_reads: list
) -> None:
    theirs, ours = Model(), Model()
    for fmt, model in (("auto", theirs), ("fxkit", ours)):
        cls = vllm.Fxkit if fmt == "fxkit" else vllm.DefaultModelLoader
        config = vllm.LoadConfig(load_format=fmt, safetensors_load_strategy=strategy)
        cls(config).load_weights(model, model_config(moe))
    same(ours.got, theirs.got)
    assert len(fxkit_reads) == 1


def test_torchao_checkpoints_are_left_to_vllms_iterator(
    vllm: Any, moe: Path, fxkit_reads: list, caplog: pytest.LogCaptureFixture
) -> None:
    """``load_weights`` sets strategy ``torchao`` for torchao-serialized checkpoints: vLLM's own
    iterator rebuilds the tensor subclasses (here it refuses: torchao is not installed)."""
    loader = vllm.Fxkit(vllm.LoadConfig(load_format="fxkit"))
    loader.load_config.safetensors_load_strategy = "torchao"
    source = vllm.DefaultModelLoader.Source(str(moe), None)
    with caplog.at_level(logging.WARNING), pytest.raises(ValueError, match="torchao version"):
        list(loader._get_weights_iterator(source))
    assert "load format 'fxkit' does not implement safetensors_load_strategy 'torchao'" in (
        caplog.text
    )
    assert fxkit_reads == []


def test_vllms_errors_name_load_format_fxkit(vllm: Any) -> None:
    config = vllm.LoadConfig(load_format="fxkit", model_loader_extra_config={"thread": 4})
    with pytest.raises(ValueError, match=re.escape("load format fxkit: {'thread'}")):
        vllm.Fxkit(config)


def test_vllms_thread_options_set_fxkits_threads(
    vllm: Any, moe: Path, fxkit_reads: list, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM's multi-thread iterator reads every expert; fxkit's threads keep vLLM's EP filter."""
    monkeypatch.setenv("FXKIT_SHM_DIR", str(tmp_path))
    vllm.parallel.set(ep_size=2, ep_rank=1)
    extra = {"enable_multithread_load": True, "num_threads": 3}
    _, theirs = load(vllm, "auto", moe, extra)
    _, ours = load(vllm, "fxkit", moe, extra)
    assert fxkit_reads[0][1] == {"share": True, "threads": 3}
    assert len(theirs.got) - len(ours.got) == LAYERS * EXPERTS // 2
    _, filtered = load(vllm, "auto", moe)
    same(ours.got, filtered.got)
    with pytest.raises(ValueError, match="num_threads 3 and threads 4; give one of them"):
        vllm.Fxkit(vllm.LoadConfig(model_loader_extra_config={**extra, "threads": 4}))
    # vLLM reads num_threads only with enable_multithread_load; fxkit always has threads
    alone = vllm.LoadConfig(model_loader_extra_config={"num_threads": 5})
    assert vllm.Fxkit(alone).fxkit_options == {"share": True, "threads": 5}


def test_ranks_share_reads_by_default_and_bad_options_are_refused(vllm: Any) -> None:
    config = vllm.LoadConfig(
        load_format="fxkit",
        model_loader_extra_config={
            "threads": 2,
            "chunk_size": 4096,
            "enable_multithread_load": False,
        },
    )
    assert vllm.Fxkit(config).fxkit_options == {"share": True, "threads": 2, "chunk_size": 4096}
    assert config.model_loader_extra_config["threads"] == 2, "the caller's config is left alone"
    off = vllm.LoadConfig(model_loader_extra_config={"share": False})
    assert vllm.Fxkit(off).fxkit_options == {"share": False}
    for bad in ({"share": 2}, {"threads": 0}, {"chunk_size": "32MiB"}, {"drop_cache": "yes"}):
        with pytest.raises(ValueError, match="model_loader_extra_config"):
            vllm.Fxkit(vllm.LoadConfig(model_loader_extra_config=bad))


def test_vllms_file_list_meets_the_loaders_file_rule(vllm: Any, moe: Path, tmp_path: Path) -> None:
    """vLLM globs ``*.safetensors``; a FIFO among them is refused at once, not waited on."""
    for shard in moe.glob("model-0*.safetensors"):
        (tmp_path / shard.name).symlink_to(shard)  # a Hugging Face snapshot: links to blobs
    _, linked = load(vllm, "fxkit", tmp_path)
    _, theirs = load(vllm, "auto", moe)
    same(linked.got, theirs.got)
    fifo = make_fifo(tmp_path / "model-00003-of-00003.safetensors")
    loader = vllm.Fxkit(vllm.LoadConfig(load_format="fxkit"))
    weights = loader.get_all_weights(model_config(tmp_path), Model())
    with pytest.raises(LoaderError, match=f"{fifo}: is a FIFO, not a regular file"):
        returns_at_once(lambda: next(weights), fifo)


@pytest.mark.parametrize("version", ["0.17.1", "0.9.2", "unknown"])
def test_a_vllm_older_than_checked_is_refused_by_name(
    workdir: Any, monkeypatch: pytest.MonkeyPatch, version: str
) -> None:
    """Registered, so that ``--load-format fxkit`` says why it cannot run, not "not supported"."""
    with vllm_source.running(workdir[0], workdir[1]) as source:
        monkeypatch.setattr(sys.modules["vllm"], "__version__", version)
        monkeypatch.setattr(vllm_plugin, "_registered", False)
        vllm_plugin.register()
        oldest, newest = vllm_plugin.VLLM_CHECKED
        with pytest.raises(
            ValueError, match=rf"not support vLLM {version}: .* {oldest} to {newest}"
        ):
            source.registered["fxkit"](source.LoadConfig(load_format="fxkit"))


def test_a_vllm_newer_than_checked_is_used_with_a_warning(
    workdir: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, moe: Path
) -> None:
    with vllm_source.running(workdir[0], workdir[1]) as source:
        monkeypatch.setattr(sys.modules["vllm"], "__version__", "0.99.0")
        monkeypatch.setattr(vllm_plugin, "_registered", False)
        with caplog.at_level(logging.WARNING, logger=vllm_plugin.__name__):
            vllm_plugin.register()
        assert "vLLM 0.99.0 is newer than the newest vLLM checked against" in caplog.text
        source.Fxkit = source.registered["fxkit"]
        _, ours = load(source, "fxkit", moe)
        assert len(ours.got) == len(moe_tensors(0)) * LAYERS


def test_register_is_idempotent(vllm: Any) -> None:
    stood_in = vllm.default_loader.safetensors_weights_iterator
    vllm_plugin.register()
    assert vllm.registered["fxkit"] is vllm.Fxkit
    vllm_plugin.stand_in_for_safetensors(vllm.default_loader)  # a second time: no second layer
    assert vllm.default_loader.safetensors_weights_iterator is stood_in
