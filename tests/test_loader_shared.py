"""Node-shared loading (``share=True``): real processes, real files, real locks in /dev/shm.

The state files go to a directory of the test's own (``FXKIT_SHM_DIR``) on the machine's
/dev/shm, so nothing here meets another run's. Bytes read from storage are each process's own
``read_bytes`` (/proc/self/io: what it caused to be fetched from the storage layer, page cache
readahead and O_DIRECT alike).
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from fxkit.loader import cache, iter_tensors, load, make_checkpoint
from fxkit.loader.errors import LoaderError
from fxkit.loader.files import model_files
from safetensors.torch import load_file

CHUNK = 1 << 20
RANK = """
import hashlib, sys
import torch
from fxkit.loader import load
model, share = sys.argv[1], sys.argv[2] == "share"
# "private": each process reads every byte itself (O_DIRECT, no page cache to meet in)
options = {"share": True} if share else {"direct_io": "on"}
def read_bytes():
    return int(open("/proc/self/io").read().split("read_bytes: ")[1].split()[0])
sys.stdout.write("ready\\n"); sys.stdout.flush(); sys.stdin.readline()
before = read_bytes()
tensors = load(model, chunk_size=1 << 20, **options)
read = read_bytes() - before
digest = hashlib.sha256()
for name in sorted(tensors):
    digest.update(name.encode() + tensors[name].reshape(-1).view(torch.uint8).numpy().tobytes())
def anonymous():  # this process's private memory (what a copy of the tensors would be)
    rollup = open("/proc/self/smaps_rollup").read()
    return int(rollup.split("Anonymous:")[1].split()[0]) * 1024
print(read, digest.hexdigest(), anonymous())
"""


def digest(tensors: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for name in sorted(tensors):
        h.update(name.encode() + tensors[name].reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


@pytest.fixture()
def shm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The test's own share root on /dev/shm (removed afterwards)."""
    root = Path("/dev/shm") / f"fxkit-test-{os.getpid()}-{tmp_path.name}"
    root.mkdir()
    monkeypatch.setenv("FXKIT_SHM_DIR", str(root))
    yield root / f"fxkit-{os.getuid()}"
    subprocess.run(["rm", "-rf", str(root)], check=True)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("shared") / "model"
    make_checkpoint(path, 24_000_000, shards=3)
    return path


def reference(model: Path) -> str:
    tensors: dict[str, torch.Tensor] = {}
    for f in model_files(model).files:
        tensors.update(load_file(f))
    return digest(tensors)


def shares(where: Path) -> list[str]:
    return sorted(p.name for p in where.iterdir() if p.name != ".lock")


def cold(model: Path) -> None:
    assert not cache.evict_all(model_files(model).files)


def test_one_process_loads_exactly_and_leaves_nothing(model: Path, shm: Path) -> None:
    cold(model)
    assert digest(load(model, share=True, chunk_size=CHUNK)) == reference(model)
    assert shares(shm) == []
    assert shm.stat().st_mode & 0o777 == 0o700


def test_staged_path_copies_from_the_page_cache(model: Path, shm: Path) -> None:
    cold(model)
    tensors = dict(iter_tensors(model, share=True, chunk_size=CHUNK, _staged=True))
    assert digest(tensors) == reference(model)


def run_ranks(model: Path, n: int, mode: str) -> list[tuple[int, str, int]]:
    """``n`` processes loading ``model`` at once (after a barrier): (bytes read, digest,
    anonymous memory) each."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    argv = [sys.executable, "-c", RANK, str(model), mode]
    pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE}
    procs = [subprocess.Popen(argv, text=True, env=env, **pipes) for _ in range(n)]
    for p in procs:
        assert p.stdout is not None and p.stdout.readline() == "ready\n"
    for p in procs:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    results = []
    for p in procs:
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0
        read, hexdigest, anonymous = out.split()
        results.append((int(read), hexdigest, int(anonymous)))
    return results


def test_ranks_read_the_checkpoint_once_between_them(model: Path, shm: Path) -> None:
    """Bytes the processes read from storage, summed: about the checkpoint's size with
    ``share``, N times it without."""
    size = sum(f.stat().st_size for f in model_files(model).files)
    cold(model)
    shared = run_ranks(model, 3, "share")
    cold(model)
    private = run_ranks(model, 3, "private")
    assert {d for _, d, _ in shared + private} == {reference(model)}
    assert sum(r for r, _, _ in shared) <= 1.1 * size
    assert sum(r for r, _, _ in private) >= 2.9 * size
    # No rank holds a copy of its own: its tensors are the page cache's pages.
    assert all(a < min(p for _, _, p in private) - 0.8 * size for _, _, a in shared)
    assert shares(shm) == []


STUCK = """
import sys, time
from fxkit.loader.format import open_checkpoint
from fxkit.loader.plan import plan_file
from fxkit.loader.shared import open_shares
header = open_checkpoint(sys.argv[1]).files[0]
(share,) = open_shares([plan_file(header, 1 << 20, whole_file=True)])
class Stuck:
    def cache(self, offset, length):
        print("holding", flush=True)
        time.sleep(600)
share.fetch(0, Stuck(), wait=True)
"""


def test_a_rank_that_dies_mid_chunk_does_not_block_the_others(model: Path, shm: Path) -> None:
    cold(model)  # (a file in the page cache is mapped from there, not shared through a share)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    stuck = subprocess.Popen(
        [sys.executable, "-c", STUCK, str(model)], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert stuck.stdout is not None and stuck.stdout.readline() == "holding\n"
        result: dict[str, str] = {}
        loader = threading.Thread(
            target=lambda: result.update(d=digest(load(model, share=True, chunk_size=CHUNK)))
        )
        loader.start()
        time.sleep(1.0)
        assert loader.is_alive(), "the loader did not wait for the chunk another process holds"
        stuck.send_signal(signal.SIGKILL)
        loader.join(30)
        assert not loader.is_alive()
    finally:
        stuck.kill()
        stuck.wait()
    assert result["d"] == reference(model)
    assert shares(shm) == []


def test_state_files_of_dead_processes_are_removed_at_the_next_start(
    model: Path, shm: Path
) -> None:
    shm.mkdir(mode=0o700)
    for leftover in ("0" * 32 + ".state", "1" * 32 + ".state"):
        (shm / leftover).write_bytes(b"\x01" * 64)
    assert digest(load(model, share=True, chunk_size=CHUNK)) == reference(model)
    assert shares(shm) == []


def test_two_versions_of_a_file_never_share(tmp_path: Path, shm: Path) -> None:
    """A new version (written beside, renamed over the old) while a process still loads the
    old one: each gets its own version's bytes, under its own state file."""
    make_checkpoint(tmp_path / "m", 4_000_000, shards=1, seed=1)
    (path,) = model_files(tmp_path / "m").files
    cold(tmp_path / "m")
    held = iter_tensors(path, share=True, chunk_size=CHUNK)
    first_name, first = next(held)  # holds the old version's state, its chunks read
    old = load_file(path)
    new_bytes = bytearray(path.read_bytes())
    new_bytes[-5000:] = os.urandom(5000)  # same size, same header, other data
    (tmp_path / "new").write_bytes(new_bytes)
    os.replace(tmp_path / "new", path)
    cold(tmp_path / "m")
    assert digest(load(path, share=True, chunk_size=CHUNK)) == digest(load_file(path))
    rest = dict(held)
    assert digest({first_name: first, **rest}) == digest(old)
    assert shares(shm) == []


def test_writing_to_a_tensor_changes_no_other_process_view(model: Path, shm: Path) -> None:
    cold(model)
    first = iter_tensors(model, share=True, chunk_size=CHUNK)
    _, tensor = next(first)
    tensor.view(torch.uint8).fill_(0x5A)  # copy on write: this process's page only
    again = load(model, share=True, chunk_size=CHUNK)
    assert digest(again) == reference(model)
    first.close()


def test_an_unsafe_directory_is_refused(model: Path, shm: Path) -> None:
    shm.mkdir(mode=0o700)
    shm.chmod(0o777)
    with pytest.raises(LoaderError, match="not a private directory") as caught:
        load(model, share=True)
    assert "FXKIT_SHM_DIR" in str(caught.value)
