"""The built-in roles, playbooks and inventories are found in a source checkout (and the
editable install that points at it) and in an installed wheel."""

from __future__ import annotations

import importlib.util
import site
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from fxkit import paths

REPO = Path(__file__).resolve().parent.parent


def test_checkout_and_editable_install() -> None:
    assert importlib.util.find_spec("fxkit.roles") is None  # why paths.py does not ask importlib
    assert paths.builtin("roles") == REPO / "roles"
    assert paths.builtin("playbooks") == REPO / "playbooks"
    assert paths.builtin("inventories") == REPO / "inventory"
    assert paths.resolve("site", "playbooks") == REPO / "playbooks" / "site.yml"
    assert paths.resolve("local", "inventories") == REPO / "inventory" / "local.yml"


def test_resolve_prefers_a_path_that_exists(tmp_path: Path) -> None:
    (tmp_path / "site.yml").write_text("[]\n")
    assert paths.resolve(tmp_path / "site.yml", "playbooks") == tmp_path / "site.yml"
    assert paths.resolve("no-such-book", "playbooks") == Path("no-such-book")


@pytest.mark.slow
def test_installed_wheel_finds_its_builtins(tmp_path: Path) -> None:
    """Build the wheel, install it with --no-deps into a fresh venv (its dependencies come from
    this environment through a .pth line), and run the built-in playbook from there."""
    pip = [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check"]
    build = [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp_path), str(REPO)]
    subprocess.run(build, check=True, timeout=300, cwd=tmp_path)
    [wheel] = tmp_path.glob("fxkit-*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    install = [*pip, "--python", str(python), "install", "--no-deps", str(wheel)]
    subprocess.run(install, check=True, timeout=300)
    [venv_site] = venv.glob("lib/python*/site-packages")
    (venv_site / "deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")

    script = textwrap.dedent(
        """
        import fxkit
        from fxkit import paths
        print(fxkit.__file__)
        for kind in ("roles", "playbooks", "inventories"):
            print(paths.builtin(kind))
        """
    )
    out = subprocess.run(
        [str(python), "-c", script], check=True, capture_output=True, text=True, cwd=tmp_path
    ).stdout.split()
    package = Path(out[0]).parent
    assert package == venv_site / "fxkit"
    assert [Path(p) for p in out[1:]] == [
        package / k for k in ("roles", "playbooks", "inventories")
    ]
    assert (package / "roles/node_base/templates/node.yaml.j2").is_file()
    names = zipfile.ZipFile(wheel).namelist()
    assert "fxkit/roles/node_base/role.py" in names and "fxkit/playbooks/site.yml" in names
    assert not [n for n in names if "__pycache__" in n]

    root = tmp_path / "root"
    (root / "etc/security").mkdir(parents=True)
    play = [str(venv / "bin/fxkit"), "play", "site", "-i", "local", "-e", f"node_base_root={root}"]
    proc = subprocess.run([*play, "--check"], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "node_base" in proc.stdout and not (root / "etc/fxkit").exists()
