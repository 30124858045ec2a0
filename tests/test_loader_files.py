"""Which files a model is made of, and the rule every file meets before it is opened: regular
files only (a FIFO named ``*.safetensors`` must not hang a load), symlinks followed to regular
files (Hugging Face caches), index names kept inside the model directory, each file once. The
same rule through ``load``, ``fxkit load``, ``fxkit bench load`` and the vLLM plugin's file list.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from fxkit.loader import LoaderError, load, open_checkpoint
from fxkit.loader.files import INDEX_NAME, model_files
from loader_helpers import make_fifo, returns_at_once
from safetensors.torch import save_file

from fxkit.loadbench import bench


def tensors(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        f"w{seed}.a": torch.randn(17, 5, generator=g).to(torch.bfloat16),
        f"w{seed}.b": torch.randint(0, 99, (7,), generator=g),
    }


def shard(path: Path, seed: int) -> dict[str, torch.Tensor]:
    path.parent.mkdir(parents=True, exist_ok=True)
    content = tensors(seed)
    save_file(content, path)
    return content


def write_index(directory: Path, weight_map: dict[str, str]) -> Path:
    index = directory / INDEX_NAME
    index.write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return index


def assert_loads(model: Any, want: dict[str, torch.Tensor]) -> None:
    got = load(model, threads=2, direct_io="off")
    assert sorted(got) == sorted(want)
    for name, tensor in want.items():
        assert got[name].dtype == tensor.dtype and torch.equal(got[name], tensor), name


# --- not a regular file: refused at once, before anything opens it --------------------------------


def make_socket(path: Path) -> Path:
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(path))
    sock.close()  # the socket file stays
    return path


def make_device(path: Path) -> Path:
    """A character device node like /dev/null (1, 3): needs CAP_MKNOD."""
    try:
        os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("creating a device node needs CAP_MKNOD (root)")
    return path


def make_directory(path: Path) -> Path:
    path.mkdir()
    return path


def make_link_to_fifo(path: Path) -> Path:
    path.symlink_to(make_fifo(path.parent / "elsewhere.pipe"))
    return path


KINDS = {
    "fifo": (make_fifo, "a FIFO"),
    "socket": (make_socket, "a socket"),
    "device": (make_device, "a character device"),
    "directory": (make_directory, "a directory"),
    "link-to-fifo": (make_link_to_fifo, "a FIFO"),
}


@pytest.fixture(params=list(KINDS))
def odd_file(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Path, Path, str]:
    """A model directory holding one good shard and one ``*.safetensors`` that is no file."""
    make, words = KINDS[request.param]
    shard(tmp_path / "a.safetensors", 1)
    return tmp_path, make(tmp_path / "b.safetensors"), words


def fifo_of(odd: Path) -> Path | None:
    target = odd.resolve()
    return target if stat.S_ISFIFO(os.stat(target).st_mode) else None


@pytest.mark.parametrize("given", ["file", "list", "directory", "index"])
def test_a_non_regular_file_is_refused_at_once(
    odd_file: tuple[Path, Path, str], given: str
) -> None:
    model, odd, words = odd_file
    if given == "index":
        write_index(model, {"w1.a": "a.safetensors", "w1.b": "a.safetensors", "x": odd.name})
    path = {"file": odd, "list": [model / "a.safetensors", odd]}.get(given, model)
    if given == "file" and odd.is_dir():  # given as the model, a directory is a model directory
        with pytest.raises(LoaderError, match=rf"^{odd}: no \*\.safetensors files"):
            open_checkpoint(odd)
        return
    with pytest.raises(LoaderError, match=f"is {words}, not a regular file") as caught:
        returns_at_once(lambda: open_checkpoint(path), fifo_of(odd))
    message = str(caught.value)
    if given == "index":  # named as the index names it, after the index
        assert message.startswith(f"{model / INDEX_NAME}: names {odd.name!r}, which is "), message
    else:
        assert message.startswith(f"{odd}: is "), message
    assert "hint:" in message


@pytest.mark.parametrize("direct_io", ["auto", "off", "on"])
def test_a_file_swapped_for_a_fifo_after_opening_is_refused_at_once(
    tmp_path: Path, direct_io: str
) -> None:
    """The readers check again on the file they opened (without waiting on a FIFO)."""
    shard(tmp_path / "a.safetensors", 1)
    checkpoint = open_checkpoint(tmp_path)
    fifo = make_fifo(tmp_path / "swap.pipe")
    fifo.rename(tmp_path / "a.safetensors")
    fifo = tmp_path / "a.safetensors"
    with pytest.raises(LoaderError, match=f"{fifo}: is a FIFO, not a regular file"):
        returns_at_once(lambda: load(checkpoint, direct_io=direct_io), fifo)


def test_cli_load_refuses_a_fifo_without_hanging(tmp_path: Path) -> None:
    """``fxkit load`` on a directory with a FIFO named like a shard: exit 2, one clear line."""
    shard(tmp_path / "a.safetensors", 1)
    fifo = make_fifo(tmp_path / "b.safetensors")
    fxkit = str(Path(sys.executable).parent / "fxkit")
    try:
        done = subprocess.run([fxkit, "load", str(tmp_path)], capture_output=True, text=True,
                              timeout=120)  # fmt: skip
    except subprocess.TimeoutExpired:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail("fxkit load hung on the FIFO")
    assert done.returncode == 2, done.stderr
    assert f"{fifo}: is a FIFO" in done.stderr and "Traceback" not in done.stderr


# --- symlinks: followed wherever they point, to regular files only ------------------------------


@pytest.fixture
def hf_cache(tmp_path: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    """A Hugging Face hub cache entry as huggingface_hub lays it out (docs: "Understand caching",
    huggingface.co/docs/huggingface_hub/guides/manage-cache): ``blobs/<hash>`` holds the bytes,
    ``snapshots/<revision>/<file>`` are relative symlinks to ``../../blobs/<hash>``."""
    repo = tmp_path / "models--acme--tiny"
    blobs = repo / "blobs"
    snapshot = repo / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    want: dict[str, torch.Tensor] = {}
    weight_map = {}
    for seed, name in enumerate(["model-00001-of-00002.safetensors",
                                 "model-00002-of-00002.safetensors"], start=1):  # fmt: skip
        content = shard(blobs / f"blob{seed}", seed)
        (snapshot / name).symlink_to(f"../../blobs/blob{seed}")
        want.update(content)
        weight_map.update(dict.fromkeys(content, name))
    write_index(blobs, weight_map).rename(blobs / "blob-index")
    (snapshot / INDEX_NAME).symlink_to("../../blobs/blob-index")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123abcd")
    return snapshot, want


def test_hugging_face_cache_symlinks_into_blobs_are_followed(
    hf_cache: tuple[Path, dict[str, torch.Tensor]],
) -> None:
    snapshot, want = hf_cache
    assert_loads(snapshot, want)
    files = open_checkpoint(snapshot).files
    assert [h.path.parent for h in files] == [snapshot, snapshot], "paths as named, not resolved"
    assert model_files(snapshot).files == [h.path for h in files]


def test_a_dangling_symlink_is_refused_naming_the_link(
    hf_cache: tuple[Path, dict[str, torch.Tensor]],
) -> None:
    """A blob removed from the cache (an interrupted download, a pruned cache)."""
    snapshot, _ = hf_cache
    (snapshot.parent.parent / "blobs" / "blob2").unlink()
    link = snapshot / "model-00002-of-00002.safetensors"
    for model in (snapshot, link, [link]):
        with pytest.raises(LoaderError, match="dangling symlink") as caught:
            open_checkpoint(model)
        assert link.name in str(caught.value) and "blobs/blob2" in str(caught.value)


def test_a_symlink_loop_is_refused(tmp_path: Path) -> None:
    shard(tmp_path / "a.safetensors", 1)
    (tmp_path / "b.safetensors").symlink_to("c.safetensors")
    (tmp_path / "c.safetensors").symlink_to("b.safetensors")
    with pytest.raises(LoaderError, match=r"b\.safetensors: is a symlink loop"):
        open_checkpoint(tmp_path)


def test_a_symlink_to_a_device_is_refused(tmp_path: Path) -> None:
    (tmp_path / "zero.safetensors").symlink_to("/dev/zero")
    with pytest.raises(LoaderError, match="a symlink to /dev/zero, which is a character device"):
        open_checkpoint(tmp_path)


def test_an_index_that_is_not_a_file_is_refused_not_skipped(tmp_path: Path) -> None:
    shard(tmp_path / "a.safetensors", 1)
    index = make_fifo(tmp_path / INDEX_NAME)
    with pytest.raises(LoaderError, match=f"{index}: is a FIFO"):
        returns_at_once(lambda: open_checkpoint(tmp_path), index)
    index.unlink()
    index.symlink_to("gone.json")
    with pytest.raises(LoaderError, match=f"{index}: is a dangling symlink"):
        open_checkpoint(tmp_path)


# --- the index's weight_map: subfolders, names that leave the directory ---------------------------


def test_index_entries_in_subfolders_resolve(tmp_path: Path) -> None:
    want = shard(tmp_path / "shards" / "part.safetensors", 1) | shard(
        tmp_path / "top.safetensors", 2
    )
    write_index(tmp_path, {"w1.a": "shards/part.safetensors", "w1.b": "./shards//part.safetensors",
                           "w2.a": "top.safetensors", "w2.b": "top.safetensors"})  # fmt: skip
    assert_loads(tmp_path, want)
    files = [h.path for h in open_checkpoint(tmp_path).files]
    assert files == [tmp_path / "shards" / "part.safetensors", tmp_path / "top.safetensors"]
    assert list(model_files(tmp_path).files) == files


def test_index_errors_name_the_index_in_the_model_directory(tmp_path: Path) -> None:
    shard(tmp_path / "shards" / "part.safetensors", 1)
    shard(tmp_path / "top.safetensors", 2)
    files = ["shards/part.safetensors", "top.safetensors", "top.safetensors", "top.safetensors"]
    index = write_index(tmp_path, dict(zip(["w1.a", "w1.b", "w2.a", "w2.b"], files, strict=True)))
    with pytest.raises(LoaderError) as caught:
        open_checkpoint(tmp_path)
    assert str(caught.value).startswith(f"{index}: lists 'w1.b' in 'top.safetensors', but it is "
                                        "in 'shards/part.safetensors'")  # fmt: skip
    write_index(tmp_path, {"w1.a": "shards/gone.safetensors"})
    with pytest.raises(LoaderError, match=f"^{index}: names 'shards/gone.safetensors', which"):
        open_checkpoint(tmp_path)


@pytest.mark.parametrize(
    "name",
    [
        "../outside.safetensors",
        "shards/../../outside.safetensors",
        "../../etc/passwd",
        "/etc/passwd",
        "",
        ".",
        "shards",
        "a\0b.safetensors",
    ],
)
def test_index_names_outside_the_directory_are_refused(tmp_path: Path, name: str) -> None:
    model = tmp_path / "model"
    shard(model / "shards" / "a.safetensors", 1)
    shard(tmp_path / "outside.safetensors", 1)
    index = write_index(model, {"w1.a": name, "w1.b": name})
    with pytest.raises(LoaderError) as caught:
        open_checkpoint(model)
    message = str(caught.value)
    assert message.startswith(f"{index}: "), message
    assert repr(name) in message or name in ("shards",), message
    assert "hint:" in message


def test_a_symlink_inside_the_directory_may_point_outside(tmp_path: Path) -> None:
    """The index's names stay inside; the filesystem's links may leave (the symlink policy)."""
    model = tmp_path / "model"
    model.mkdir()
    want = shard(tmp_path / "store" / "real.safetensors", 1)
    (model / "shards").symlink_to(tmp_path / "store")
    write_index(model, dict.fromkeys(want, "shards/real.safetensors"))
    assert_loads(model, want)


# --- each file once -------------------------------------------------------------------------------


def test_the_same_file_twice_is_refused_naming_both(tmp_path: Path) -> None:
    a = tmp_path / "a.safetensors"
    shard(a, 1)
    (tmp_path / "b.safetensors").symlink_to("a.safetensors")
    os.link(a, tmp_path / "c.safetensors")
    for model in ([a, a], [a, tmp_path / "c.safetensors"], tmp_path):
        with pytest.raises(LoaderError, match=r"is the same file as .*a\.safetensors") as caught:
            open_checkpoint(model)
        assert "hint:" in str(caught.value)
    write_index(tmp_path, {"w1.a": "a.safetensors", "w1.b": "b.safetensors"})
    with pytest.raises(LoaderError, match=f"^{tmp_path / INDEX_NAME}: .*b.safetensors.* same file"):
        open_checkpoint(tmp_path)


# --- one discovery for every way in ---------------------------------------------------------------


def test_bench_finds_files_with_the_loaders_rule(odd_file: tuple[Path, Path, str]) -> None:
    model, odd, words = odd_file
    with pytest.raises(LoaderError, match=f"{odd}: is .*{words}"):
        returns_at_once(lambda: bench.bench(model, methods=["baseline"], runs=1), fifo_of(odd))


def test_model_files_stats_each_file_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Discovery costs one stat per file, whatever the number of tensors the index lists."""
    for n in range(3):
        shard(tmp_path / f"s{n}.safetensors", n)
    write_index(tmp_path, {f"t{i}": f"s{i % 3}.safetensors" for i in range(3000)})
    calls: list[str] = []
    real_stat = os.stat

    def counting_stat(path: Any, *args: Any, **kwargs: Any) -> os.stat_result:
        calls.append(str(path))
        return real_stat(path, *args, **kwargs)

    monkeypatch.setattr(os, "stat", counting_stat)
    found = model_files(tmp_path)
    assert len(found.files) == 3 and len(found.weight_map or {}) == 3000
    assert sorted(calls) == sorted([str(tmp_path), str(tmp_path / INDEX_NAME),
                                    *(str(f) for f in found.files)])  # fmt: skip


def test_a_nul_byte_in_a_given_name_is_a_loader_error(tmp_path: Path) -> None:
    with pytest.raises(LoaderError, match="NUL byte"):
        open_checkpoint(f"{tmp_path}/a\0b.safetensors")
