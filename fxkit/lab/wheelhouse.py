"""A wheelhouse for lab hosts made from what this machine has installed: no network.

Lab hosts have no network, so roles that make virtualenvs there (roles/vllm_lmcache) install
from a controller folder of wheels (``vllm_lmcache_wheelhouse``). This folder is made from the
controller's own environment: the requirements given, and everything they need (their
``Requires-Dist``, markers and extras evaluated here), each packed back into a wheel from its
installed files (the RECORD's entries inside site-packages, the ``.dist-info`` whose WHEEL file
keeps the tags it was built for, a fresh RECORD with sha256 digests: the wheel format of
PEP 427 / the binary distribution format specification). A distribution installed from a source
folder (``pip install -e .``: its ``direct_url.json`` names the folder) is built from that folder
with ``pip wheel --no-index``. The lab hosts run this machine's Python, so the wheels fit them.

Wheels are kept in a cache folder under their own names (made under a temporary name and
renamed, so never half-written) and reused; the house is a fresh folder of links to exactly the
wheels wanted.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from fxkit.errors import FxkitError

#: What pip writes into an installed .dist-info and a wheel must not carry.
_INSTALL_ONLY = {"INSTALLER", "REQUESTED", "RECORD", "direct_url.json"}
#: Fixed entry times (the ZIP format's earliest): the same files give the same wheel.
_EPOCH = (1980, 1, 1, 0, 0, 0)


class WheelhouseError(FxkitError):
    """A requirement this environment cannot turn into a wheel."""


def closure(roots: Iterable[str]) -> list[metadata.Distribution]:
    """The installed distributions ``roots`` (requirement strings) need, themselves included,
    sorted by name. A requirement not installed here, or installed at a version it excludes, is
    an error naming who needs it."""
    found: dict[str, metadata.Distribution] = {}
    extras_done: dict[str, set[str]] = {}
    todo: list[tuple[str, str]] = [(root, "") for root in roots]
    while todo:
        text, needed_by = todo.pop()
        req = _requirement(text, needed_by)
        key = canonicalize_name(req.name)
        dist = found.get(key) or _installed(req.name)
        if dist is None:
            raise WheelhouseError(
                f"{req.name} is not installed here{_by(needed_by)}",
                hint=f"install it in this environment ({sys.prefix}): pip install '{text}'",
            )
        if not req.specifier.contains(dist.version, prereleases=True):
            raise WheelhouseError(
                f"{req.name} {dist.version} is installed, but {text} is needed{_by(needed_by)}",
                hint=f"pip install '{text}' in {sys.prefix}",
            )
        extras = {""} | set(req.extras)
        new = extras - extras_done.setdefault(key, set())
        if key in found and not new:
            continue
        found[key] = dist
        extras_done[key] |= new
        for dep in dist.requires or []:
            parsed = _requirement(dep, dist.name)
            if parsed.marker is None or any(_applies(parsed, extra) for extra in new):
                todo.append((dep.split(";")[0].strip(), f"{dist.name} {dist.version}"))
    return [found[k] for k in sorted(found)]


def _installed(name: str) -> metadata.Distribution | None:
    """The distribution ``name`` as pip installed it (one with a RECORD: not a source tree's
    ``.egg-info`` that the current folder puts first on ``sys.path``)."""
    found = list(metadata.distributions(name=name))
    return next((d for d in found if d.read_text("RECORD") is not None), None)


def _requirement(text: str, needed_by: str) -> Requirement:
    try:
        return Requirement(text)
    except InvalidRequirement as exc:
        raise WheelhouseError(f"{text!r}{_by(needed_by)} is not a requirement: {exc}") from None


def _applies(req: Requirement, extra: str) -> bool:
    assert req.marker is not None
    return req.marker.evaluate({"extra": extra})  # (over this interpreter's environment)


def _by(needed_by: str) -> str:
    return f" (needed by {needed_by})" if needed_by else ""


def wheel(dist: metadata.Distribution, cache: Path) -> Path:
    """``dist`` as a wheel in ``cache``: built from its source folder when installed from one,
    else packed from its installed files (reused when packed before)."""
    cache.mkdir(parents=True, exist_ok=True)
    source = source_folder(dist)
    if source is not None:
        return _build(dist, source, cache)
    path = cache / _wheel_name(dist)
    if not path.exists():
        _pack(dist, path)
    return path


def make(roots: Iterable[str], house: Path, cache: Path) -> list[Path]:
    """``house``, made anew: a link to the wheel of every distribution ``roots`` need."""
    wheels = [wheel(dist, cache) for dist in closure(roots)]
    shutil.rmtree(house, ignore_errors=True)
    house.mkdir(parents=True)
    for path in wheels:
        (house / path.name).symlink_to(path.resolve())
    return [house / path.name for path in wheels]


def source_folder(dist: metadata.Distribution) -> Path | None:
    """The local folder ``dist`` was installed from (``pip install [-e] FOLDER``), or None."""
    raw = dist.read_text("direct_url.json")
    if not raw:
        return None
    data = json.loads(raw)
    url = data.get("url", "")
    if "dir_info" not in data or not url.startswith("file://"):
        return None
    folder = Path(url.removeprefix("file://"))
    return folder if folder.is_dir() else None


def _build(dist: metadata.Distribution, source: Path, cache: Path) -> Path:
    """pip's wheel of ``source`` (no index: its build backend must be installed here), with
    fixed times so that the same source gives the same bytes."""
    out = cache / f".build-{canonicalize_name(dist.name)}"
    shutil.rmtree(out, ignore_errors=True)
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-index",
         "--no-build-isolation", "--disable-pip-version-check", "--wheel-dir", str(out),
         str(source)],
        capture_output=True, text=True, env={**os.environ, "SOURCE_DATE_EPOCH": "315532800"},
    )  # fmt: skip
    built = sorted(out.glob("*.whl"))
    if done.returncode != 0 or len(built) != 1:
        raise WheelhouseError(
            f"cannot build {dist.name}'s wheel from {source}: {done.stderr.strip()[-400:]}",
            hint=f"pip wheel --no-deps --no-build-isolation {source} shows why",
        )
    with zipfile.ZipFile(built[0]) as whl:
        info = next(n for n in whl.namelist() if n.endswith(".dist-info/METADATA"))
        meta = whl.read(info).decode()
    needs = sorted(line.split(":", 1)[1].strip() for line in meta.splitlines()
                   if line.startswith("Requires-Dist:"))  # fmt: skip
    if needs != sorted(dist.requires or []):
        raise WheelhouseError(
            f"{dist.name}'s requirements in {source} are not those installed here (its "
            "checkout changed them since it was installed)",
            hint=f"install it again: pip install -e {source}",
        )
    path = cache / built[0].name
    built[0].replace(path)
    out.rmdir()
    return path


def _wheel_name(dist: metadata.Distribution) -> str:
    """name-version-pytags-abitags-platformtags.whl, from the WHEEL file's Tag lines."""
    tags = [line.split(":", 1)[1].strip() for line in _wheel_file(dist).splitlines()
            if line.startswith("Tag:")]  # fmt: skip
    if not tags:
        raise WheelhouseError(f"{dist.name} {dist.version}: its WHEEL file has no Tag")
    parts = zip(*(tag.split("-") for tag in tags), strict=True)
    compressed = "-".join(".".join(dict.fromkeys(values)) for values in parts)
    name = canonicalize_name(dist.name).replace("-", "_")
    return f"{name}-{dist.version}-{compressed}.whl"


def _wheel_file(dist: metadata.Distribution) -> str:
    text = dist.read_text("WHEEL")
    if text is None:
        raise WheelhouseError(
            f"{dist.name} {dist.version} was not installed from a wheel (no WHEEL file)",
            hint=f"reinstall it from a wheel: pip install --force-reinstall '{dist.name}'",
        )
    return text


def _pack(dist: metadata.Distribution, path: Path) -> None:
    """Write ``dist``'s installed files as the wheel ``path`` (atomically)."""
    _wheel_file(dist)
    root = Path(str(dist.locate_file("")))
    info_dir = next(
        (f.parts[0] for f in dist.files or [] if f.parts[0].endswith(".dist-info")), None
    )
    if info_dir is None:
        raise WheelhouseError(f"{dist.name} {dist.version}: its RECORD lists no .dist-info")
    members = sorted(
        {
            f.as_posix()
            for f in dist.files or []
            if f.parts[0] != ".."  # scripts and data outside site-packages: pip makes them
            and "__pycache__" not in f.parts
            and not (f.parts[0] == info_dir and f.name in _INSTALL_ONLY)
        }
    )
    partial = path.with_name(f".{path.name}.partial")
    record = []
    with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as whl:
        for name in members:
            file = root / name
            if not file.is_file():
                partial.unlink()
                raise WheelhouseError(
                    f"{dist.name} {dist.version}: {file} is in its RECORD but missing",
                    hint=f"pip install --force-reinstall '{dist.name}=={dist.version}'",
                )
            data = file.read_bytes()
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
            record.append(f"{name},sha256={digest.decode()},{len(data)}")
            entry = zipfile.ZipInfo(name, _EPOCH)
            entry.external_attr = (file.stat().st_mode & 0o777 | 0o100000) << 16
            whl.writestr(entry, data, zipfile.ZIP_DEFLATED, compresslevel=1)
        record.append(f"{info_dir}/RECORD,,")
        whl.writestr(zipfile.ZipInfo(f"{info_dir}/RECORD", _EPOCH), "\n".join(record) + "\n")
    partial.replace(path)
