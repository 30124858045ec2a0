"""``fxkit stage`` on real files: the copy, skip and resume, corruption, a full destination (a
tmpfs of our own), a source that changes, Ctrl-C and a kill mid-copy (the real executable,
signalled while it copies), and the errors of bad input."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fxkit.staging import parse_source

FXKIT = Path(sys.executable).with_name("fxkit")
PAUSED = Path(__file__).with_name("stage_paused.py")
BIG = 64 << 20  # a file the copy is stopped in the middle of (at 40 MiB)
PARTIAL = ".model-00001.safetensors.fxkit-partial"


def make_model(root: Path, big: int = 4 << 20) -> Path:
    """A model folder as Hugging Face lays them out: shards, config, tokenizer, a subfolder."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "model-00001.safetensors").write_bytes(os.urandom(big))
    (root / "model-00002.safetensors").write_bytes(os.urandom(3 << 20))
    (root / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}\n')
    (root / "tokenizer_config.json").write_text("{}\n")
    (root / "original").mkdir()
    (root / "original" / "params.json").write_text('{"dim": 4096}\n')
    return root


def digests(root: Path) -> dict[str, str]:
    """sha256 of every file, fxkit's own files left out."""
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.name.startswith(".")
    }


def stage(*args: str | Path, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [str(FXKIT), "stage", *map(str, args)], capture_output=True, text=True, timeout=120
    )
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def summary(*args: str | Path) -> dict:
    return json.loads(stage(*args, "--json", "-q").stdout)


def start(*args: str | Path, pause_at: int = 40 << 20) -> subprocess.Popen[str]:
    """``fxkit stage`` started in the background, one file at a time, 1 MiB chunks, stopped
    (SIGSTOP, by itself: tests/stage_paused.py) once its partial holds ``pause_at`` bytes; it
    returns when the process is stopped there."""
    argv = [sys.executable, str(PAUSED), str(pause_at), "stage", *map(str, args)]
    proc = subprocess.Popen(
        [*argv, "-j", "1", "--chunk-size", "1MiB", "-q"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    stat, deadline = Path(f"/proc/{proc.pid}/stat"), time.monotonic() + 120
    while stat.read_text().rpartition(")")[2].split()[0] != "T":
        assert proc.poll() is None, f"it ended before it paused: {proc.communicate()}"
        assert time.monotonic() < deadline, "it never paused"
        time.sleep(0.005)
    return proc


def finish(proc: subprocess.Popen[str], sig: int = signal.SIGUSR1) -> tuple[int, str]:
    """Continue a copy paused by :func:`start`: SIGUSR1 lets it go on, a Ctrl-C (SIGINT)
    interrupts it (the paused writer waits for either: tests/stage_paused.py)."""
    os.kill(proc.pid, sig)
    os.kill(proc.pid, signal.SIGCONT)
    _, err = proc.communicate(timeout=60)
    return proc.returncode, err


def flip(path: Path, offset: int, keep_mtime: bool = False) -> None:
    st = path.stat()
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))
    if keep_mtime:
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


@pytest.fixture
def model(tmp_path: Path) -> Path:
    return make_model(tmp_path / "src")


def test_copies_every_file_then_skips_them(model: Path, tmp_path: Path) -> None:
    dest = tmp_path / "fast" / "llama"
    first = summary(model, dest)
    assert digests(dest) == digests(model)
    assert (first["files"], first["copied"], first["skipped"]) == (5, 5, 0)
    assert first["bytes_copied"] == sum(p.stat().st_size for p in model.rglob("*") if p.is_file())
    assert not list(dest.rglob("*.fxkit-partial"))
    inodes = {p: p.stat().st_ino for p in dest.rglob("*") if p.is_file()}

    again = summary(model, dest)
    assert (again["copied"], again["skipped"], again["checked"]) == (0, 5, 0)
    assert {p: p.stat().st_ino for p in dest.rglob("*") if p.is_file()} == inodes

    text = stage(model, dest).stdout
    assert "0 files copied" in text and "5 skipped" in text and "GB/s" in text


def hugging_face_cache(hub: Path) -> tuple[Path, dict[str, bytes]]:
    """A model in a Hugging Face cache: ``models--ORG--NAME/snapshots/REV`` whose files are
    relative links into ``models--ORG--NAME/blobs``, named by their sha256, as the hub lays them
    out. Returns the snapshot and each file's bytes."""
    repo = hub / "models--org--llama"
    snapshot = repo / "snapshots" / "0123abcd"
    (snapshot / "original").mkdir(parents=True)
    (repo / "blobs").mkdir()
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(snapshot.name)
    files = {
        "model-00001.safetensors": os.urandom(2 << 20),
        "config.json": b'{"architectures": ["LlamaForCausalLM"]}\n',
        "original/params.json": b'{"dim": 4096}\n',
    }
    for name, data in files.items():
        blob = hashlib.sha256(data).hexdigest()
        (repo / "blobs" / blob).write_bytes(data)
        up = "../" * (name.count("/") + 2)
        (snapshot / name).symlink_to(f"{up}blobs/{blob}")
    return snapshot, files


def test_follows_symlinks_as_hugging_face_snapshots_have_them(tmp_path: Path) -> None:
    snapshot, files = hugging_face_cache(tmp_path / "hub")
    summary(snapshot, tmp_path / "dest")
    for name, data in files.items():
        dest = tmp_path / "dest" / name
        assert not dest.is_symlink() and dest.read_bytes() == data


def test_plan_changes_nothing(model: Path, tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    plan = json.loads(stage(model, dest, "--plan", "--json").stdout)
    assert plan["plan"] and sorted(plan["copy"]) == sorted(digests(model))
    assert plan["bytes_to_copy"] > 7 << 20
    assert not dest.exists()
    summary(model, dest)
    plan = json.loads(stage(model, dest, "--plan", "--json").stdout)
    assert (plan["copy"], plan["check"], plan["skip"]) == ([], [], 5)


def test_killed_mid_copy_resumes_and_never_leaves_a_final_name(tmp_path: Path) -> None:
    model, dest = make_model(tmp_path / "src", BIG), tmp_path / "dest"
    proc = start(model, dest)
    proc.kill()
    proc.wait()
    assert not (dest / "model-00001.safetensors").exists()
    assert (dest / PARTIAL).stat().st_size < BIG

    plan = json.loads(stage(model, dest, "--plan", "--json").stdout)
    assert "model-00001.safetensors" in plan["copy"]
    result = summary(model, dest)
    assert result["resumed"] == 1 and result["copied"] == 5
    assert digests(dest) == digests(model)
    assert not (dest / PARTIAL).exists()


def test_a_corrupted_partial_is_rewritten_from_where_it_differs(tmp_path: Path) -> None:
    model, dest = make_model(tmp_path / "src", BIG), tmp_path / "dest"
    proc = start(model, dest)
    proc.kill()
    proc.wait()
    flip(dest / PARTIAL, 20 << 20)  # inside what was written: a torn or rotten write
    result = summary(model, dest)
    assert result["resumed"] == 1
    assert digests(dest) == digests(model)


def test_ctrl_c_keeps_the_partial_under_its_temporary_name(tmp_path: Path) -> None:
    model, dest = make_model(tmp_path / "src", BIG), tmp_path / "dest"
    proc = start(model, dest)
    code, err = finish(proc, signal.SIGINT)
    assert code == 130, err
    assert "Traceback" not in err
    assert not (dest / "model-00001.safetensors").exists()
    assert summary(model, dest)["resumed"] == 1
    assert digests(dest) == digests(model)


def test_a_corrupted_staged_file_is_found_and_copied_again(model: Path, tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    summary(model, dest)
    staged = dest / "model-00002.safetensors"
    flip(staged, 1000)  # its mtime moves: the manifest no longer vouches for it
    plan = json.loads(stage(model, dest, "--plan", "--json").stdout)
    assert plan["check"] == ["model-00002.safetensors"]
    result = summary(model, dest)
    assert (result["copied"], result["copied_files"]) == (1, ["model-00002.safetensors"])
    assert digests(dest) == digests(model)

    # With its mtime put back the manifest is believed, unless --verify hashes it again.
    flip(staged, 1000, keep_mtime=True)
    assert summary(model, dest)["copied"] == 0
    result = summary(model, dest, "--verify")
    assert (result["copied_files"], result["checked"]) == (["model-00002.safetensors"], 4)
    assert digests(dest) == digests(model)


def test_a_file_already_there_without_a_record_is_compared_not_recopied(
    model: Path, tmp_path: Path
) -> None:
    dest = tmp_path / "dest"
    subprocess.run(["cp", "-r", str(model), str(dest)], check=True)  # staged by hand
    result = summary(model, dest)
    assert (result["copied"], result["checked"], result["skipped"]) == (0, 5, 5)
    assert summary(model, dest)["checked"] == 0  # now recorded


@pytest.mark.parametrize("checksum", ["blake3", "sha256"])
def test_verify_catches_a_write_the_store_did_not_keep(tmp_path: Path, checksum: str) -> None:
    model, dest = make_model(tmp_path / "src", BIG), tmp_path / "dest"
    proc = start(model, dest, "--verify", "--checksum", checksum)
    flip(dest / PARTIAL, 10)  # what a faulty store would return for a written block
    code, err = finish(proc)
    assert code == 2, err
    assert f"does not hash as the bytes read from the source ({checksum} differs)" in err
    assert "Traceback" not in err
    assert not (dest / "model-00001.safetensors").exists()
    assert not (dest / PARTIAL).exists()


def test_a_source_that_changes_while_copied_is_refused(tmp_path: Path) -> None:
    model, dest = make_model(tmp_path / "src", BIG), tmp_path / "dest"
    proc = start(model, dest)
    with open(model / "model-00001.safetensors", "ab") as f:
        f.write(b"more")
    code, err = finish(proc)
    assert code == 2, err
    assert "changed while it was copied" in err
    assert not (dest / "model-00001.safetensors").exists()
    assert not (dest / PARTIAL).exists()


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 24 MiB tmpfs of our own (root only), unmounted after the test."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mount = tmp_path / "small"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)


def test_a_full_destination_fails_before_writing(tmp_path: Path, small_fs: Path) -> None:
    model = make_model(tmp_path / "src", 32 << 20)
    proc = stage(model, small_fs / "m", check=False)
    assert proc.returncode == 2
    assert "not enough space" in proc.stderr and "hint:" in proc.stderr
    assert list((small_fs / "m").iterdir()) == []


def test_running_out_of_space_mid_copy_removes_the_partial(tmp_path: Path, small_fs: Path) -> None:
    model, dest = make_model(tmp_path / "src", 16 << 20), small_fs / "m"
    proc = start(model, dest, pause_at=1 << 20)
    # Something else fills the store while the copy waits.
    subprocess.run(
        ["dd", "if=/dev/zero", f"of={small_fs / 'filler'}", "bs=1M"], capture_output=True
    )
    code, err = finish(proc)
    assert code == 2, err
    assert "filled up while copying" in err
    assert not (dest / "model-00001.safetensors").exists()
    assert not (dest / PARTIAL).exists()
    (small_fs / "filler").unlink()
    assert digests(Path(summary(model, dest)["dest"])) == digests(model)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda t: t / "missing", "the source does not exist"),
        (lambda t: make_model(t / "m") / "config.json", "the source is not a directory"),
        (lambda t: (t / "empty" / "sub").mkdir(parents=True) or t / "empty", "has no files"),
    ],
    ids=["missing", "a-file", "empty"],
)
def test_bad_sources_get_one_clear_message(tmp_path: Path, make, message: str) -> None:
    proc = stage(make(tmp_path), tmp_path / "dest", check=False)
    assert proc.returncode == 2
    assert message in proc.stderr and "error:" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not list((tmp_path / "dest").rglob("*")) if (tmp_path / "dest").exists() else True


def test_a_destination_that_is_a_file_is_refused(model: Path, tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    dest.write_text("x")
    proc = stage(model, dest, check=False)
    assert proc.returncode == 2 and "not a directory" in proc.stderr
    assert dest.read_text() == "x"


@pytest.mark.parametrize(
    ("spec", "parsed"),
    [
        ("/mnt/nfs/llama", (None, None, "/mnt/nfs/llama")),
        ("node1:/models/llama", (None, "node1", "/models/llama")),
        ("ubuntu@node1:/models/llama", ("ubuntu", "node1", "/models/llama")),
        ("./v1:2/llama", (None, None, "./v1:2/llama")),  # a slash before the colon: local
        ("node1:", (None, "node1", ".")),  # as scp: the login's home
    ],
)
def test_sources_are_read_as_scp_and_rsync_read_them(spec: str, parsed: tuple) -> None:
    assert parse_source(spec) == parsed


def test_a_stale_partial_longer_than_the_source_is_restarted(model: Path, tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / PARTIAL).write_bytes(os.urandom(6 << 20))  # left by an older, bigger version
    result = summary(model, dest)
    assert (result["copied"], result["resumed"]) == (5, 0)
    assert digests(dest) == digests(model)
    assert not (dest / PARTIAL).exists()


def manifest_of(dest: Path) -> dict:
    return json.loads((dest / ".fxkit-stage.json").read_text())["files"]


def test_the_manifest_records_blake3_digests_by_default_and_sha256_when_asked(
    model: Path, tmp_path: Path
) -> None:
    import blake3

    dest = tmp_path / "dest"
    assert summary(model, dest)["checksum"] == "blake3"
    shard = (model / "model-00001.safetensors").read_bytes()
    record = manifest_of(dest)["model-00001.safetensors"]
    assert (record["algorithm"], record["digest"]) == ("blake3", blake3.blake3(shard).hexdigest())

    # Another algorithm: nothing is trusted across algorithms; every file is compared with the
    # source and hashed anew (not copied: the bytes are the same).
    plan = json.loads(stage(model, dest, "--plan", "--json", "--checksum", "sha256").stdout)
    assert sorted(plan["check"]) == sorted(digests(model)) and plan["skip"] == 0
    result = summary(model, dest, "--checksum", "sha256")
    assert (result["checksum"], result["copied"], result["checked"]) == ("sha256", 0, 5)
    record = manifest_of(dest)["model-00001.safetensors"]
    assert (record["algorithm"], record["digest"]) == ("sha256", hashlib.sha256(shard).hexdigest())
    assert summary(model, dest, "--checksum", "sha256")["checked"] == 0  # now trusted


def test_a_sha256_manifest_of_version_1_is_read_and_rehashed_for_blake3(
    model: Path, tmp_path: Path
) -> None:
    dest = tmp_path / "dest"
    summary(model, dest, "--checksum", "sha256")
    path = dest / ".fxkit-stage.json"
    files = manifest_of(dest)
    for record in files.values():  # as fxkit wrote it before BLAKE3
        record["sha256"] = record.pop("digest")
        del record["algorithm"]
    path.write_text(json.dumps({"version": 1, "files": files}))
    assert summary(model, dest, "--checksum", "sha256")["skipped"] == 5  # still trusted
    result = summary(model, dest)
    assert (result["copied"], result["checked"]) == (0, 5)
    assert {r["algorithm"] for r in manifest_of(dest).values()} == {"blake3"}


@pytest.mark.parametrize("checksum", ["blake3", "sha256"])
def test_verify_with_each_checksum(model: Path, tmp_path: Path, checksum: str) -> None:
    dest = tmp_path / "dest"
    result = summary(model, dest, "--verify", "--checksum", checksum)
    assert (result["copied"], result["checksum"]) == (5, checksum)
    assert digests(dest) == digests(model)
    staged = dest / "model-00002.safetensors"
    flip(staged, 1000, keep_mtime=True)  # rotten on the store, the manifest still vouches for it
    result = summary(model, dest, "--verify", "--checksum", checksum)
    assert result["copied_files"] == ["model-00002.safetensors"]
    assert digests(dest) == digests(model)


# -- hostile destinations, sources and manifests, and two runs at once --------------------------


def outside_snapshot(outside: Path) -> dict[str, tuple[bytes, int]]:
    """Every file below ``outside`` (links not followed): its bytes and mtime."""
    return {
        p.relative_to(outside).as_posix(): (p.read_bytes(), p.lstat().st_mtime_ns)
        for p in sorted(outside.rglob("*"))
        if p.is_file() and not p.is_symlink()
    }


def dest_listing(dest: Path) -> dict[str, tuple[int, int, int]]:
    """What is in ``dest`` (links not followed): each name's mode, size and mtime."""
    found = {}
    for top, dirs, names in os.walk(dest):
        for name in dirs + names:
            st = os.lstat(Path(top, name))
            found[Path(top, name).relative_to(dest).as_posix()] = (
                st.st_mode,
                st.st_size,
                st.st_mtime_ns,
            )
    return found


Plant = Callable[[Path, Path], object]  # (dest, outside): something planted in dest


def _link_at(name: str, target: str = "victim") -> Plant:
    return lambda dest, outside: (dest / name).symlink_to(outside / target)


def _hard_link_at(name: str) -> Plant:
    return lambda dest, outside: os.link(outside / "victim", dest / name)


def _same_bytes_link_at(name: str) -> Plant:
    """A link to a file outside that holds the source's bytes: a check would find it right."""

    def plant(dest: Path, outside: Path) -> None:
        (outside / "victim").write_bytes((dest.parent / "src" / name).read_bytes())
        (dest / name).symlink_to(outside / "victim")

    return plant


@pytest.mark.parametrize(
    "plant",
    [
        _link_at(PARTIAL),
        _hard_link_at(PARTIAL),
        _link_at(".fxkit-stage.json.tmp"),
        _link_at("original", target=""),
        _same_bytes_link_at("config.json"),
    ],
    ids=["partial-link", "partial-hard-link", "manifest-temp-link", "folder-link", "final-link"],
)
def test_links_planted_in_the_destination_are_never_written_through(
    model: Path, tmp_path: Path, plant: Plant
) -> None:
    """A link (or a hard link) planted at a name fxkit writes is replaced, its target never
    touched; --plan changes nothing either."""
    dest, outside = tmp_path / "dest", tmp_path / "outside"
    dest.mkdir()
    outside.mkdir()
    (outside / "victim").write_bytes(os.urandom(1 << 20))
    plant(dest, outside)
    before, listed = outside_snapshot(outside), dest_listing(dest)

    stage(model, dest, "--plan")
    assert (outside_snapshot(outside), dest_listing(dest)) == (before, listed)

    proc = stage(model, dest, "--json", "-q")
    assert outside_snapshot(outside) == before
    assert digests(dest) == digests(model)
    assert not [p for p in dest.rglob("*") if p.is_symlink()]
    assert json.loads(proc.stdout)["copied"] == 5


def test_a_link_at_the_lock_name_is_refused(model: Path, tmp_path: Path) -> None:
    dest, victim = tmp_path / "dest", tmp_path / "victim"
    dest.mkdir()
    victim.write_text("keep me\n")
    (dest / ".fxkit-stage.lock").symlink_to(victim)
    proc = stage(model, dest, check=False)
    assert proc.returncode == 2, proc.stderr
    assert f"{dest}: .fxkit-stage.lock is a symbolic link" in proc.stderr
    assert "hint:" in proc.stderr and "Traceback" not in proc.stderr
    assert victim.read_text() == "keep me\n"
    assert sorted(p.name for p in dest.iterdir()) == [".fxkit-stage.lock"]


def test_a_second_stage_into_the_same_destination_is_refused_while_the_first_runs(
    tmp_path: Path,
) -> None:
    import blake3

    model, dest = make_model(tmp_path / "src", BIG), tmp_path / "dest"
    first = start(model, dest)  # stopped with 40 MiB of its first shard written
    partial = (dest / PARTIAL).read_bytes()
    second = stage(model, dest, check=False)
    assert second.returncode == 2, second.stderr
    assert f"another fxkit stage (PID {first.pid}) is staging into it" in second.stderr
    assert "Traceback" not in second.stderr
    assert (dest / PARTIAL).read_bytes() == partial
    assert not (dest / "model-00001.safetensors").exists()
    assert stage(model, dest, "--plan").returncode == 0  # a plan only reads: never refused

    code, err = finish(first)
    assert code == 0, err
    assert digests(dest) == digests(model)
    records = manifest_of(dest)
    assert sorted(records) == sorted(digests(model))
    for name, record in records.items():
        data = (dest / name).read_bytes()
        assert (record["size"], record["digest"]) == (len(data), blake3.blake3(data).hexdigest())
    assert not (dest / ".fxkit-stage.lock").exists()


def _bytes(data: bytes) -> Plant:
    return lambda path, tmp_path: path.write_bytes(data)


def _records(change: Callable[[dict], dict]) -> Plant:
    """The manifest's records as ``change`` makes them."""
    return lambda path, tmp_path: path.write_text(
        json.dumps(change(json.loads(path.read_text())["files"]))
    )


def _wrong_types(files: dict) -> dict:
    files["model-00001.safetensors"]["size"] = str(files["model-00001.safetensors"]["size"])
    files["model-00002.safetensors"]["digest"] = 5
    files["config.json"]["source_mtime_ns"] = 1.5
    files["tokenizer_config.json"]["algorithm"] = ["blake3"]
    files["original/params.json"]["size"] = True
    return {"version": 2, "files": files}


def _link_to_a_good_one(path: Path, tmp_path: Path) -> None:
    """The manifest moved out of the destination, and a link to it left in its place."""
    good = tmp_path / "planted.json"
    path.rename(good)
    path.symlink_to(good)


#: Each makes the manifest (path) bad: (path, tmp_path).
BAD_MANIFESTS: dict[str, Plant] = {
    "files-a-list": _bytes(b'{"files": []}'),
    "deep": _bytes(b"[" * 200_000 + b"]" * 200_000),
    "not-utf8": _bytes(b'{"version": 2, "files": {"\xff\xfe": 1}}'),
    "null": _bytes(b"null"),
    "record-not-an-object": _bytes(b'{"files": {"config.json": 5}}'),
    "unknown-field": _records(
        lambda files: {"files": {k: {**v, "x": 1} for k, v in files.items()}}
    ),
    "wrong-types": _records(_wrong_types),
    "fifo": lambda path, tmp_path: path.unlink() or os.mkfifo(path),
    "link": _link_to_a_good_one,
    "huge": lambda path, tmp_path: os.truncate(path, 1 << 30),
}


@pytest.mark.parametrize("bad", BAD_MANIFESTS.values(), ids=BAD_MANIFESTS.keys())
def test_a_bad_manifest_is_a_warning_and_every_file_is_checked_again(
    model: Path, tmp_path: Path, bad: Plant
) -> None:
    dest = tmp_path / "dest"
    summary(model, dest)
    flip(dest / "model-00002.safetensors", 1000, keep_mtime=True)  # what only a check finds
    path = dest / ".fxkit-stage.json"
    bad(path, tmp_path)

    proc = stage(model, dest, "--json", "-q")
    assert "Traceback" not in proc.stderr
    assert f"warning: {path}:" in proc.stderr and "checked against the source" in proc.stderr
    result = json.loads(proc.stdout)
    assert (result["checked"], result["copied_files"]) == (4, ["model-00002.safetensors"])
    assert digests(dest) == digests(model)
    assert path.is_file() and not path.is_symlink()
    assert sorted(manifest_of(dest)) == sorted(digests(model))
    assert summary(model, dest)["skipped"] == 5


def skipped(source: Path | str, proc: subprocess.CompletedProcess[str]) -> dict[str, str]:
    """What a run's JSON summary says it skipped in ``source``, and why; each warning is on
    stderr too."""
    warnings = json.loads(proc.stdout)["warnings"]
    for line in warnings:
        assert f"warning: {line}\n" in proc.stderr
    return dict(w.removeprefix(f"{source}: ").split(": ", 1) for w in warnings)


def test_links_that_leave_the_model_folder_are_skipped_never_copied(tmp_path: Path) -> None:
    model, dest, outside = make_model(tmp_path / "src"), tmp_path / "dest", tmp_path / "outside"
    expected = digests(model)
    outside.mkdir()
    (outside / "secret").write_text("hunter2\n")
    (outside / "secret").chmod(0o600)
    links = {
        "secret.safetensors": outside / "secret",  # a file outside
        "shadow": Path("/etc/shadow"),
        "everything": outside,  # a folder outside
        "root": Path("/"),
        "original/again": Path(".."),  # a loop
        "self": Path("self"),  # a link to itself
        "dangling.json": tmp_path / "nothing",
        "cfg": Path("original"),  # a folder inside: staged under its own name only
    }
    for name, target in links.items():
        (model / name).symlink_to(target)
    (model / "inside.json").symlink_to("config.json")  # a link inside: followed
    expected["inside.json"] = expected["config.json"]
    os.mkfifo(model / "pipe")

    plan = stage(model, dest, "--plan", "--json")
    assert sorted(json.loads(plan.stdout)["copy"]) == sorted(expected)
    proc = stage(model, dest, "--json", "-q")
    assert digests(dest) == expected
    assert not (dest / "secret.safetensors").exists() and "Traceback" not in proc.stderr
    said = skipped(model, proc)
    assert sorted(said) == sorted([*links, "pipe"])
    assert said["secret.safetensors"].startswith(f"a link to {outside / 'secret'}, outside the")
    assert "outside the model folder" in said["root"] and "outside" in said["shadow"]
    assert said["original/again"] == f"a link to a folder ({model}), not followed: skipped"
    assert said["cfg"] == f"a link to a folder ({model / 'original'}), not followed: skipped"
    assert "a link loop" in said["self"] and "a dangling link" in said["dangling.json"]
    assert said["pipe"] == "a FIFO, not a regular file: skipped"


def test_a_hugging_face_snapshot_may_link_into_its_blobs_only(tmp_path: Path) -> None:
    snapshot, files = hugging_face_cache(tmp_path / "hub")
    (tmp_path / "secret").write_text("hunter2\n")
    (snapshot / "leak.json").symlink_to("../../../../secret")
    (snapshot / "refs.json").symlink_to("../../refs")  # in the repo, not in its blobs
    proc = stage(snapshot, tmp_path / "dest", "--json", "-q")
    assert sorted(digests(tmp_path / "dest")) == sorted(files)
    said = skipped(snapshot, proc)
    assert said == {
        "leak.json": f"a link to {tmp_path / 'secret'}, outside the model folder: skipped",
        "refs.json": f"a link to {snapshot.parents[1] / 'refs'}, outside the model folder: skipped",
    }


def test_a_file_swapped_for_a_link_after_the_listing_is_refused(tmp_path: Path) -> None:
    """The check is made on the file opened, not on a name looked at before: a file of the
    listing swapped (while the copy runs) for a link to a file outside with the same size and
    mtime is refused when it is opened."""
    model, dest, secret = make_model(tmp_path / "src", BIG), tmp_path / "dest", tmp_path / "secret"
    secret.write_text("hunter2\n")
    leak = model / "leak.json"
    leak.write_text("{}\n\n\n\n\n\n")
    os.utime(leak, ns=(secret.stat().st_atime_ns, secret.stat().st_mtime_ns))
    proc = start(model, dest)  # listed, and stopped in the middle of its largest file
    leak.unlink()
    leak.symlink_to(secret)
    code, err = finish(proc)
    assert code == 2, err
    assert f"leak.json: opened as {secret}, outside the model folder" in err
    assert "Traceback" not in err
    assert not (dest / "leak.json").exists()
    assert not any(b"hunter2" in p.read_bytes() for p in dest.rglob("*") if p.is_file())


def test_destination_names_must_stay_inside_it(tmp_path: Path) -> None:
    """Defence in depth: whatever a source lists, the destination refuses a name that is not
    a path inside it."""
    from fxkit.staging import Destination, StageError

    with Destination(tmp_path / "dest", create=True) as dest:
        for name in ("../x", "/etc/x", "a/../../x", "", "a//b", "x\0y", "."):
            with pytest.raises(StageError, match="not a name inside"):
                dest.open_partial(name)
    assert sorted(os.listdir(tmp_path)) == ["dest"]
