"""Source distributions from PyPI, for the tests that read or run a real package's code (vLLM,
LMCache): the simple index as JSON (PEP 691), a file of it fetched into a cache (checked against
the sha256 the index gives, written under a temporary name and renamed), and one of its source
files run as the module it is."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import sys
import urllib.request
from pathlib import Path
from types import ModuleType
from typing import Any


def simple_index(url: str) -> dict[str, Any]:
    """A project's simple index (``https://pypi.org/simple/NAME/``); OSError without PyPI."""
    request = urllib.request.Request(url, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.load(response)


def fetch(path: Path, index: dict[str, Any]) -> Path:
    """``path`` (named as the file on the index), downloaded and sha256-checked when missing."""
    if path.exists():
        return path
    (entry,) = (f for f in index["files"] if f["filename"] == path.name)
    with urllib.request.urlopen(entry["url"], timeout=300) as response:
        data = response.read()
    assert hashlib.sha256(data).hexdigest() == entry["hashes"]["sha256"], entry["url"]
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    partial.write_bytes(data)
    os.replace(partial, path)  # never a partial file in the cache
    return path


def run_file(name: str, path: Path) -> ModuleType:
    """Run the source file ``path`` as module ``name``, registered first as an import would."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
