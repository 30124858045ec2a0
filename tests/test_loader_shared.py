"""Node-shared loading (``share=True``): real processes, real files, real locks in /dev/shm.

The state files go to a directory of the test's own (``FXKIT_SHM_DIR``) on the machine's
/dev/shm, so nothing here meets another run's. Bytes read from storage are each process's own
``read_bytes`` (/proc/self/io: what it caused to be fetched from the storage layer, page cache
readahead and O_DIRECT alike).
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from fxkit.loader import cache, iter_tensors, load, make_checkpoint, open_checkpoint
from fxkit.loader.errors import LoaderError
from fxkit.loader.files import model_files
from fxkit.loader.shared import _lock
from loader_helpers import returns_at_once
from safetensors.torch import load_file, save_file

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
    """The state files in ``where`` (none where there is no such directory)."""
    return sorted(p.name for p in where.glob("*") if p.name != ".lock")


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


HOLD = """
import sys
from fxkit.loader.format import open_checkpoint
from fxkit.loader.plan import plan_file
from fxkit.loader.shared import open_shares
header = open_checkpoint(sys.argv[1]).files[0]
share = open_shares(claim_timeout=60).share(plan_file(header, 1 << 20, whole_file=True))
class Held:  # claims chunk 0 (the loader's own claim) and holds it until the test says
    def cache(self, offset, length):
        print("holding", flush=True)
        sys.stdin.readline()
share.fetch(0, Held(), wait=True)
share.close()
"""


def hold_first_chunk(model: Path) -> subprocess.Popen:
    """A process that claims the first chunk of ``model``'s first file and holds the claim until
    a line arrives on its stdin (or it is killed)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(model)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    assert holder.stdout is not None and holder.stdout.readline() == "holding\n"
    return holder


def release(holder: subprocess.Popen) -> None:
    """Let the holder of :func:`hold_first_chunk` finish; it lets go of its share and exits."""
    assert holder.stdin is not None
    holder.stdin.write("go\n")
    holder.stdin.close()
    assert holder.wait(30) == 0


def test_a_rank_that_dies_mid_chunk_does_not_block_the_others(model: Path, shm: Path) -> None:
    cold(model)  # (a file in the page cache is mapped from there, not shared through a share)
    stuck = hold_first_chunk(model)
    try:
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


LOW_LIMIT = """
import hashlib, resource, sys
import torch
from fxkit.loader import load
hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[2]), hard))
tensors = load(sys.argv[1], share=sys.argv[3] == "True")
digest = hashlib.sha256()
for name in sorted(tensors):
    digest.update(name.encode() + tensors[name].reshape(-1).view(torch.uint8).numpy().tobytes())
print(len(tensors), digest.hexdigest())
"""


@pytest.mark.parametrize("share", [True, False])
def test_many_files_under_a_low_descriptor_limit(tmp_path: Path, shm: Path, share: bool) -> None:
    """More files than the process may hold descriptors (1000 files, RLIMIT_NOFILE 256): the
    load holds a bounded number open at once (its tensors' mappings hold none), and leaves no
    state file behind."""
    many = tmp_path / "many"
    many.mkdir()
    for i in range(1000):
        save_file({f"t{i}": torch.full((256,), i, dtype=torch.int32)}, many / f"{i:04}.safetensors")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [sys.executable, "-c", LOW_LIMIT, str(many), "256", str(share)],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert done.stdout.split() == ["1000", reference(many)]
    assert shares(shm) == []


def test_a_failed_load_leaves_no_state_files(model: Path, tmp_path: Path, shm: Path) -> None:
    shutil.copytree(model, tmp_path / "m")
    checkpoint = open_checkpoint(tmp_path / "m")
    last = checkpoint.files[-1].path
    os.truncate(last, last.stat().st_size - 4096)  # after its header was read
    with pytest.raises(LoaderError, match="truncated"):
        load(checkpoint, share=True, chunk_size=CHUNK)
    assert shares(shm) == []


INTERRUPTED = """
import logging, signal, sys
from fxkit.cli import main
signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C, whatever the parent ignores
logging.basicConfig(format="%(message)s")
logging.getLogger("fxkit.loader.shared").setLevel(logging.DEBUG)  # says when it waits
sys.argv = ["fxkit", "load", sys.argv[1], "--share", "--chunk-size", "1MiB"]
main()
"""


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_load_interrupted_while_waiting_leaves_no_state_files(
    model: Path, shm: Path, signum: int
) -> None:
    """``fxkit load --share`` stopped by Ctrl-C or SIGTERM while it waits for a chunk another
    process holds: it exits cleanly, its state files go, the holder's stays."""
    holder = hold_first_chunk(model)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    loader = subprocess.Popen(
        [sys.executable, "-c", INTERRUPTED, str(model)], stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        assert loader.stderr is not None
        assert "waiting" in loader.stderr.readline()  # in its load, all its files open
        assert len(shares(shm)) == len(model_files(model).files)
        loader.send_signal(signum)
        _, err = loader.communicate(timeout=30)
        assert loader.returncode == 128 + signum and "Traceback" not in err, err
        assert len(shares(shm)) == 1  # the holder's
        release(holder)
    finally:
        for process in (loader, holder):
            process.kill()
            process.wait()
    assert shares(shm) == []


def chunk_claimed(where: Path) -> bool:
    """Whether a process holds the claim on chunk 0 of the one state file in ``where``."""
    (state,) = shares(where)
    fd = os.open(where / state, os.O_RDWR)
    try:
        return not _lock(fd, fcntl.F_WRLCK, 1, wait=False)
    finally:
        os.close(fd)


def test_a_claim_held_too_long_is_read_here_with_a_warning(
    model: Path, shm: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A process that claims a chunk and never lets go (stopped, hung) holds up the others for
    ``claim_timeout`` seconds, not forever: then they read the chunk themselves, and say so."""
    holder = hold_first_chunk(model)
    try:
        with caplog.at_level(logging.WARNING, logger="fxkit.loader.shared"):
            tensors = returns_at_once(
                lambda: load(model, share=True, chunk_size=CHUNK, claim_timeout=0.5)
            )
        assert digest(tensors) == reference(model)
        assert holder.poll() is None and chunk_claimed(shm)  # the holder still holds it
        (warning,) = caplog.messages
        first = model_files(model).files[0]
        assert f"{first}: chunk 0" in warning and "0.5 s" in warning
        assert "claim_timeout" in warning
        release(holder)
    finally:
        holder.kill()
        holder.wait()
    assert shares(shm) == []


def plant(kind: str, where: Path, decoy: Path) -> None:
    """Put at ``where`` (this user's state directory's name) what another user could have."""
    if kind == "another user's directory":
        where.mkdir(mode=0o700)
        os.chown(where, 65534, 65534)
    elif kind == "a world-writable directory":
        where.mkdir()
        where.chmod(0o777)
    elif kind == "a symlink to a private directory":
        where.symlink_to(decoy)
    else:
        where.write_bytes(b"")


PLANTED = [
    "another user's directory",
    "a world-writable directory",
    "a symlink to a private directory",
    "a file",
]


@pytest.mark.parametrize("kind", PLANTED)
def test_an_unsafe_directory_is_never_used(
    model: Path,
    shm: Path,
    tmp_path: Path,
    kind: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Another user's directory at the state directory's name blocks no load, and none is
    written to: without a private runtime directory, the load reads without sharing."""
    if kind.startswith("another") and os.geteuid() != 0:
        pytest.skip("chown to another user needs root")
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    decoy = tmp_path / "decoy"
    decoy.mkdir(mode=0o700)
    plant(kind, shm, decoy)
    with caplog.at_level(logging.WARNING, logger="fxkit.loader.shared"):
        tensors = returns_at_once(lambda: load(model, share=True, chunk_size=CHUNK))
    assert digest(tensors) == reference(model)
    (warning,) = caplog.messages
    assert f"{shm}: not a private directory of this user" in warning
    assert "without sharing" in warning and "FXKIT_SHM_DIR" in warning
    assert list(decoy.iterdir()) == []
    assert not shm.is_dir() or shm.is_symlink() or list(shm.iterdir()) == []


def test_an_unsafe_directory_falls_back_to_the_runtime_directory(
    model: Path,
    shm: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """With ``$XDG_RUNTIME_DIR`` (the user's own), the processes share through it instead: a
    loader there meets another's claim."""
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    plant("a world-writable directory", shm, runtime)
    holder = hold_first_chunk(model)
    try:
        assert len(shares(runtime / "fxkit")) == 1 and shares(shm) == []
        with caplog.at_level(logging.WARNING, logger="fxkit.loader.shared"):
            tensors = returns_at_once(
                lambda: load(model, share=True, chunk_size=CHUNK, claim_timeout=0.5)
            )
        assert digest(tensors) == reference(model)
        moved, waited = caplog.messages
        assert f"{shm}: not a private directory" in moved and str(runtime / "fxkit") in moved
        assert "claim_timeout" in waited
        release(holder)
    finally:
        holder.kill()
        holder.wait()
    assert (runtime / "fxkit").stat().st_mode & 0o777 == 0o700
