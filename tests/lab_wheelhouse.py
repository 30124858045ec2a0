"""A wheelhouse for lab hosts: fxkit's wheel built from this checkout, and every wheel a lab
virtualenv needs (fxkit's dependencies, torch CPU, the serve-probe's server libraries).

Lab hosts have no network and see neither this machine's /opt nor the working tree, so roles
that make virtualenvs there install from a controller folder of wheels, copied over
(``vllm_lmcache_wheelhouse``). The dependencies are collected once with ``pip wheel`` into
``.cache/lab-wheels/<digest of the requirements>/`` (or ``$FXKIT_LAB_WHEEL_CACHE``): pip fetches
them from PyPI or this machine's indexes (torch CPU from /opt/wheels) and checks their hashes
where the index gives them. fxkit's own wheel is built anew for each test session.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("FXKIT_LAB_WHEEL_CACHE", ROOT / ".cache/lab-wheels"))
#: torch CPU for the lab's Python (3.11, Debian 12): the build on this machine's disk.
TORCH = "torch==2.13.0+cpu"
#: fxkit's loader, and what serve-probe serves with (the probe's extra).
EXTRA = ("safetensors", "numpy", "uvicorn", "starlette", "prometheus_client")


def _pip(*args: str, timeout: int = 900) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pip", *args, "-q", "--disable-pip-version-check"],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot collect the lab's wheels (pip {args[0]}): {done.stderr[-600:]}")


def dependencies() -> Path:
    """The folder of dependency wheels, collected when missing (skips without an index)."""
    requirements = sorted([TORCH, *EXTRA, *_fxkit_requirements()])
    digest = hashlib.sha256("\n".join(requirements).encode()).hexdigest()[:16]
    folder = CACHE / digest
    if not (folder / ".complete").exists():
        partial = CACHE / f"{digest}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        _pip("wheel", "--wheel-dir", str(partial), *requirements)
        (partial / ".complete").write_text("\n".join(requirements) + "\n")
        shutil.rmtree(folder, ignore_errors=True)
        partial.rename(folder)  # never a half-filled folder under the final name
    return folder


def _fxkit_requirements() -> list[str]:
    """fxkit's runtime dependencies, as pyproject.toml lists them."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return list(project["dependencies"])


def build(into: Path) -> Path:
    """``into``: fxkit's wheel from this checkout beside (links to) every dependency wheel."""
    into.mkdir(parents=True, exist_ok=True)
    build_dir = into.parent / f"{into.name}-build"
    _pip("wheel", "--no-deps", "--no-build-isolation", "--wheel-dir", str(build_dir), str(ROOT))
    (wheel,) = build_dir.glob("fxkit-*.whl")
    shutil.move(wheel, into / wheel.name)
    for dep in dependencies().glob("*.whl"):
        if not dep.name.startswith("fxkit-"):
            (into / dep.name).symlink_to(dep)
    return into
