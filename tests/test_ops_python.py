"""virtualenv (offline: a wheel built here, pip --no-index) and git (local repositories)."""

from __future__ import annotations

import base64
import hashlib
import subprocess
import zipfile
from pathlib import Path

import pytest

from fxkit.connection.local import LocalConnection
from fxkit.facts import FactCache
from fxkit.ops.base import OpContext, OpError, Result, Status
from fxkit.ops.python import git, virtualenv


def make_ctx(check: bool = False, diff: bool = False) -> OpContext:
    conn = LocalConnection("localhost")
    return OpContext(conn, FactCache(conn), check=check, diff=diff)


def build_wheel(folder: Path, name: str, version: str) -> None:
    """A minimal pure-Python wheel (PEP 427), so pip installs without an index."""
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": f"VERSION = {version!r}\n".encode(),
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: fxkit-test\nRoot-Is-Purelib: true\n"
        b"Tag: py3-none-any\n",
    }
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{dist}/RECORD,,")
    files[f"{dist}/RECORD"] = ("\n".join(record) + "\n").encode()
    with zipfile.ZipFile(folder / f"{name}-{version}-py3-none-any.whl", "w") as wheel:
        for path, data in files.items():
            wheel.writestr(path, data)


@pytest.mark.timeout(120)
def commits(result: Result) -> tuple[str | None, str | None]:
    """The commits a git result reports, before and after."""
    return result.data["before"], result.data["after"]


def test_virtualenv_pins(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    build_wheel(wheels, "fxkit_probe", "1.0")
    build_wheel(wheels, "fxkit_probe", "2.0")
    venv = tmp_path / "venv"
    offline = ["--no-index", "--find-links", str(wheels)]
    result = virtualenv(make_ctx(check=True, diff=True), str(venv), {"fxkit-probe": "1.0"})
    assert result.changed and not venv.exists()
    assert result.diff == f"virtualenv: absent -> {venv}\nfxkit-probe: absent -> 1.0\n"
    result = virtualenv(make_ctx(), str(venv), ["fxkit_probe==1.0"], pip_args=offline)
    assert result.changed and result.data["installed"] == ["fxkit_probe"]
    assert virtualenv(make_ctx(), str(venv), {"fxkit.probe": "1.0"}).status is Status.OK
    result = virtualenv(make_ctx(diff=True), str(venv), ["fxkit-probe==2.0"], pip_args=offline)
    assert result.diff == "fxkit-probe: 1.0 -> 2.0\n"
    version = subprocess.run(
        [venv / "bin/python", "-c", "import fxkit_probe; print(fxkit_probe.VERSION)"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    assert version == "2.0"
    assert virtualenv(make_ctx(), str(venv), ["fxkit-probe"]).status is Status.OK
    failed = virtualenv(make_ctx(), str(venv), ["fxkit-probe==3.0"], pip_args=offline)
    assert failed.failed and "3.0" in failed.msg
    with pytest.raises(OpError, match="bad package pin"):
        virtualenv(make_ctx(), str(venv), ["x; rm -rf /"])


def sh(cwd: Path, *args: str) -> str:
    env = {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
        "HOME": str(cwd),
        "PATH": "/usr/bin:/bin",
    }
    return subprocess.run(args, cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout


@pytest.fixture
def origin(tmp_path: Path) -> tuple[Path, list[str]]:
    repo = tmp_path / "origin"
    repo.mkdir()
    sh(repo, "git", "init", "-q", "-b", "main")
    commits = []
    for n in range(2):
        (repo / "f").write_text(f"{n}\n")
        sh(repo, "git", "add", "f")
        sh(repo, "git", "commit", "-q", "-m", f"c{n}")
        commits.append(sh(repo, "git", "rev-parse", "HEAD").strip())
    sh(repo, "git", "tag", "v0", commits[0])
    return repo, commits


def test_git_clone_pin_and_move(tmp_path: Path, origin: tuple[Path, list[str]]) -> None:
    repo, (c0, c1) = origin
    dest = tmp_path / "checkout"
    result = git(make_ctx(check=True), str(repo), str(dest), "v0")
    assert result.changed and result.msg == f"would check out v0 in {dest}" and not dest.exists()
    result = git(make_ctx(), str(repo), str(dest), "v0")
    assert result.changed and commits(result) == (None, c0)
    assert (dest / "f").read_text() == "0\n"
    again = git(make_ctx(), str(repo), str(dest), "v0")
    assert again.status is Status.OK and commits(again) == (c0, c0)
    result = git(make_ctx(diff=True), str(repo), str(dest), c1)
    assert commits(result) == (c0, c1) and result.diff == f"commit: {c0} -> {c1}\n"
    assert git(make_ctx(), str(repo), str(dest), c1[:10]).status is Status.OK


def test_git_branch_follows_origin(tmp_path: Path, origin: tuple[Path, list[str]]) -> None:
    repo, (_, c1) = origin
    dest = tmp_path / "checkout"
    assert git(make_ctx(), str(repo), str(dest), "main").data["after"] == c1
    assert git(make_ctx(), str(repo), str(dest), "main").status is Status.OK
    (repo / "f").write_text("2\n")
    sh(repo, "git", "commit", "-q", "-am", "c2")
    c2 = sh(repo, "git", "rev-parse", "HEAD").strip()
    assert git(make_ctx(check=True), str(repo), str(dest), "main").changed
    assert commits(git(make_ctx(), str(repo), str(dest), "main")) == (c1, c2)


def test_git_unknown_version_fails_clearly(tmp_path: Path, origin: tuple[Path, list[str]]) -> None:
    repo, _ = origin
    result = git(make_ctx(), str(repo), str(tmp_path / "c"), "no-such-tag")
    assert result.failed and "no-such-tag: no such commit, tag or branch" in result.msg
