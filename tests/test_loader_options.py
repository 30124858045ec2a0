"""One option set: LoadOptions is what load(), fxkit load, fxkit bench load -o and vLLM read."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from click.testing import CliRunner
from fxkit.loader import LoaderError, LoadOptions, load
from fxkit.loader.options import fields, names
from fxkit.loader.plan import DEFAULT_CHUNK
from fxkit.loader.vllm_plugin import split_extra_config
from safetensors.torch import save_file

from fxkit.cli import cli


def test_defaults_and_help_are_declared_once() -> None:
    options = LoadOptions()
    assert (options.threads, options.chunk_size, options.direct_io) == (8, DEFAULT_CHUNK, "auto")
    assert all(f.metadata["help"] for f in fields())
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.threads = 2  # type: ignore[misc]


def test_unknown_option_names_the_key_and_the_known_ones(tmp_path: Path) -> None:
    with pytest.raises(LoaderError, match=r"unknown loader option.*'thread'") as caught:
        load(tmp_path, thread=4)
    assert caught.value.hint == f"the loader's options are {', '.join(names())}"
    with pytest.raises(LoaderError, match="iter_tensors: threads must be a positive integer"):
        LoadOptions.from_mapping({"threads": 0}, where="iter_tensors")


def test_options_and_keywords_combine(tmp_path: Path) -> None:
    import torch

    path = tmp_path / "m.safetensors"
    save_file({"a": torch.arange(10)}, path)
    got = load(path, options=LoadOptions(threads=1, direct_io="off"), chunk_size=4096)
    assert torch.equal(got["a"], torch.arange(10))


def test_cli_options_come_from_load_options() -> None:
    out = " ".join(CliRunner().invoke(cli, ["load", "--help"]).output.split())  # unwrapped
    for option in fields():
        assert "--" + option.name.replace("_", "-") in out
        assert option.metadata["help"] in out
    assert "[default: 8; x>=1]" in out and "32MiB" in out


def test_bench_and_vllm_check_keys_against_load_options(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["bench", "load", str(tmp_path), "-o", "treads=2"])
    assert result.exit_code == 2 and "unknown loader option(s) 'treads'" in result.output
    ours, rest = split_extra_config({"threads": 2, "enable_weights_track": True})
    assert (ours, rest) == ({"threads": 2}, {"enable_weights_track": True})
    with pytest.raises(ValueError, match="model_loader_extra_config: direct_io must be"):
        split_extra_config({"direct_io": "sometimes"})


@pytest.mark.parametrize("value", [0, -1.5, True, "5", float("nan"), float("inf")])
def test_claim_timeout_is_a_positive_number_of_seconds(value: object) -> None:
    with pytest.raises(LoaderError, match="claim_timeout must be a positive number of seconds"):
        LoadOptions(claim_timeout=value)  # type: ignore[arg-type]
    assert LoadOptions.from_mapping({"claim_timeout": 2}).claim_timeout == 2
    result = CliRunner().invoke(cli, ["load", ".", "--claim-timeout", "0"])
    assert result.exit_code == 2 and "--claim-timeout" in result.output
