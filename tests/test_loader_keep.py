"""``keep``: a rank loads only the tensors it owns (its experts, say) and reads only their bytes.

Bytes read are what the process fetched from storage (``read_bytes`` in /proc/self/io: O_DIRECT
reads and page cache readahead alike), on cold files.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import torch
from fxkit.loader import cache, iter_tensors, load
from safetensors.torch import load_file, save_file

EXPERTS, EXPERT_BYTES = 16, 1 << 20
CHUNK = 1 << 20
EXPERT = re.compile(r"\.experts\.(\d+)\.")


def read_bytes() -> int:
    return int(Path("/proc/self/io").read_text().split("read_bytes: ")[1].split()[0])


@pytest.fixture(scope="module")
def moe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two shards of a small MoE: per layer a router, and 16 experts of 1 MiB (odd offsets)."""
    root = tmp_path_factory.mktemp("moe")
    g = torch.Generator().manual_seed(3)
    for layer in range(2):
        tensors = {f"layers.{layer}.router.weight": torch.randn(EXPERTS, 33, generator=g)}
        for e in range(EXPERTS):
            tensors[f"layers.{layer}.mlp.experts.{e}.w1.weight"] = torch.randint(
                -100, 100, (EXPERT_BYTES // 2 + 7,), generator=g
            ).to(torch.bfloat16)
        save_file(tensors, root / f"model-{layer + 1:05d}-of-00002.safetensors")
    return root


def owned(rank: int, ranks: int = 8):
    """vLLM's shape of an EP filter: non-expert tensors and this rank's contiguous experts."""
    mine = set(range(rank * EXPERTS // ranks, (rank + 1) * EXPERTS // ranks))

    def keep(name: str) -> bool:
        match = EXPERT.search(name)
        return match is None or int(match.group(1)) in mine

    return keep


def reference(moe: Path) -> dict[str, torch.Tensor]:
    """Every tensor, by safetensors, as copies (no mapping keeps the files' pages cached)."""
    out: dict[str, torch.Tensor] = {}
    for f in sorted(moe.glob("*.safetensors")):
        out.update((k, v.clone()) for k, v in load_file(f).items())
    return out


@pytest.mark.parametrize("share", [False, True])
def test_a_rank_gets_its_tensors_exactly_and_reads_little_more(
    moe: Path, share: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FXKIT_SHM_DIR", str(tmp_path))  # a private directory, not /dev/shm
    files = sorted(moe.glob("*.safetensors"))
    total = sum(f.stat().st_size for f in files)
    want = {k: v for k, v in reference(moe).items() if owned(3)(k)}
    assert not cache.evict_all(files)
    before = read_bytes()
    got = load(moe, keep=owned(3), chunk_size=CHUNK, share=share)
    read = read_bytes() - before
    assert list(got) == list(want)
    for name, tensor in want.items():
        assert torch.equal(got[name], tensor), name
    kept = sum(t.numel() * t.element_size() for t in want.values())
    # Each kept span is read in whole chunks: at most a chunk more at either end of it.
    assert kept <= read <= kept + 2 * 4 * CHUNK + 64 * 1024
    assert read < total / 3  # rank 3 of 8 keeps 1/8 of the experts


def test_keep_nothing_of_a_file_reads_nothing_of_it(moe: Path) -> None:
    assert not cache.evict_all(moe.glob("*.safetensors"))
    before = read_bytes()
    got = dict(iter_tensors(moe, keep=lambda name: name.startswith("layers.1."), chunk_size=CHUNK))
    assert got and all(name.startswith("layers.1.") for name in got)
    second = moe / "model-00002-of-00002.safetensors"
    assert read_bytes() - before <= second.stat().st_size + CHUNK


def test_keep_everything_is_a_plain_load(moe: Path) -> None:
    assert not cache.evict_all(moe.glob("*.safetensors"))
    got = load(moe, keep=lambda name: True, chunk_size=CHUNK)
    want = reference(moe)
    assert list(got) == list(want) and all(torch.equal(got[k], want[k]) for k in want)


def test_eight_ranks_with_share_read_the_file_once_between_them(
    moe: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Eight ranks (here: iterators) each keeping its experts, all holding the shares at once."""
    monkeypatch.setenv("FXKIT_SHM_DIR", str(tmp_path))
    files = sorted(moe.glob("*.safetensors"))
    assert not cache.evict_all(files)
    before = read_bytes()
    held = [iter_tensors(moe, keep=owned(r), chunk_size=CHUNK, share=True) for r in range(8)]
    firsts = [next(it) for it in held]  # every one has started: all hold the shares
    counts = [1 + sum(1 for _ in it) for it in held]
    assert [name for name, _ in firsts] == ["layers.0.router.weight"] * 8
    read = read_bytes() - before
    assert counts == [2 * (1 + EXPERTS // 8)] * 8
    assert read <= 1.05 * sum(f.stat().st_size for f in files)
    assert os.listdir(tmp_path / f"fxkit-{os.getuid()}") == [".lock"]
