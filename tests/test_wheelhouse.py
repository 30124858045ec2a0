"""fxkit/lab/wheelhouse.py: wheels made from this environment's installed distributions, that
pip installs into a fresh virtualenv with no index (what a lab host does, without network)."""

from __future__ import annotations

import base64
import hashlib
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

from fxkit.lab import wheelhouse
from fxkit.lab.wheelhouse import WheelhouseError


def names(roots: list[str]) -> set[str]:
    return {d.metadata["Name"].lower() for d in wheelhouse.closure(roots)}


def test_closure_follows_requirements_markers_and_extras() -> None:
    # rich needs markdown-it-py (which needs mdurl) and pygments (rich's own metadata).
    assert {"rich", "markdown-it-py", "mdurl", "pygments"} <= names(["rich"])
    plain, probe = names(["fxkit"]), names(["fxkit[probe]"])
    assert "uvicorn" not in plain and "fabric" in plain and "paramiko" in plain
    assert {"uvicorn", "starlette", "prometheus_client"} <= probe  # the extra's requirements
    assert "pytest" not in probe  # the dev extra was not asked for


def test_what_is_missing_or_of_another_version_is_named_with_who_needs_it() -> None:
    with pytest.raises(WheelhouseError, match="no-such-package-fxkit is not installed here"):
        wheelhouse.closure(["no-such-package-fxkit"])
    version = metadata.version("mdurl")
    with pytest.raises(WheelhouseError, match=f"mdurl {version} is installed, but mdurl<0.0.1"):
        wheelhouse.closure(["mdurl<0.0.1"])
    with pytest.raises(WheelhouseError, match="is not a requirement"):
        wheelhouse.closure(["mdurl >>= 1"])


def test_a_packed_wheel_carries_the_installed_files_and_a_true_record(tmp_path: Path) -> None:
    dist = next(d for d in wheelhouse.closure(["markdown-it-py"]) if d.name == "markdown-it-py")
    path = wheelhouse.wheel(dist, tmp_path)
    assert path.name == f"markdown_it_py-{dist.version}-py3-none-any.whl"  # its WHEEL's tag
    with zipfile.ZipFile(path) as whl:
        members = set(whl.namelist())
        record = whl.read(next(m for m in members if m.endswith(".dist-info/RECORD"))).decode()
        for line in record.splitlines():
            name, digest, size = line.rsplit(",", 2)
            if not digest:
                continue
            data = whl.read(name)
            want = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert digest == f"sha256={want}" and int(size) == len(data)
    installed = {f.as_posix() for f in dist.files or [] if f.parts[0] != ".."}
    assert "markdown_it/main.py" in members and "markdown_it/main.py" in installed
    assert not any("__pycache__" in m or m.endswith(("/INSTALLER", "/direct_url.json"))
                   for m in members)  # fmt: skip
    again = wheelhouse.wheel(dist, tmp_path / "again")
    assert again.read_bytes() == path.read_bytes()  # the same files give the same wheel


def test_pip_installs_the_house_with_no_index(tmp_path: Path) -> None:
    house = wheelhouse.make(["rich"], tmp_path / "house", tmp_path / "cache")
    assert {p.name.split("-")[0] for p in house} >= {"rich", "pygments", "mdurl"}
    assert all(p.is_symlink() and p.resolve().parent == tmp_path / "cache" for p in house)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    done = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(venv / "bin/python"), "install", "-q",
         "--no-index", "--find-links", str(tmp_path / "house"), "rich"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    shown = subprocess.run(
        [str(venv / "bin/python"), "-c", "import rich, sys; rich.print('[bold]packed[/]')"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert shown.stdout.strip() == "packed"
    # A second house reuses the packed wheels and holds only what is asked for.
    wheelhouse.make(["mdurl"], tmp_path / "house", tmp_path / "cache")
    assert [p.name.split("-")[0] for p in (tmp_path / "house").iterdir()] == ["mdurl"]


def test_fxkit_installed_from_its_checkout_is_built_from_it(tmp_path: Path) -> None:
    dist = next(d for d in wheelhouse.closure(["fxkit"]) if d.name == "fxkit")
    if wheelhouse.source_folder(dist) is None:
        pytest.skip("fxkit is installed from a wheel here, not from its checkout")
    path = wheelhouse.wheel(dist, tmp_path)
    with zipfile.ZipFile(path) as whl:
        assert "fxkit/loader/api.py" in whl.namelist()  # loader/ is shipped as fxkit.loader
    assert wheelhouse.wheel(dist, tmp_path / "again").read_bytes() == path.read_bytes()


def source_install(
    tmp_path: Path, requires: list[str], installed: list[str]
) -> metadata.Distribution:
    """A project in a folder, and the .dist-info that `pip install -e FOLDER` would have left
    (its direct_url.json naming the folder, its METADATA the requirements ``installed``)."""
    source = tmp_path / "src"
    (source / "tinypkg").mkdir(parents=True)
    (source / "tinypkg/__init__.py").write_text("")
    deps = ", ".join(f'"{r}"' for r in requires)
    (source / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=68"]\nbuild-backend = "setuptools.build_meta"\n'
        f'[project]\nname = "tinypkg"\nversion = "1.0"\ndependencies = [{deps}]\n'
    )
    info = tmp_path / "site/tinypkg-1.0.dist-info"
    info.mkdir(parents=True)
    lines = [f"Requires-Dist: {r}" for r in installed]
    (info / "METADATA").write_text("\n".join(["Metadata-Version: 2.1", "Name: tinypkg",
                                              "Version: 1.0", *lines]) + "\n")  # fmt: skip
    (info / "direct_url.json").write_text(
        f'{{"url": "file://{source}", "dir_info": {{"editable": true}}}}'
    )
    return metadata.PathDistribution(info)


def test_a_checkout_whose_requirements_changed_since_install_is_refused(tmp_path: Path) -> None:
    same = source_install(tmp_path / "a", ["mdurl>=0.1"], ["mdurl>=0.1"])
    assert wheelhouse.wheel(same, tmp_path / "cache").name == "tinypkg-1.0-py3-none-any.whl"
    changed = source_install(tmp_path / "b", ["mdurl>=0.1", "rich"], ["mdurl>=0.1"])
    with pytest.raises(WheelhouseError, match=r"requirements in .* are not those installed") as e:
        wheelhouse.wheel(changed, tmp_path / "cache")
    assert e.value.hint == f"install it again: pip install -e {tmp_path / 'b/src'}"
