"""A throwaway signing key for apt repository tests: fxkit.lab.signing's, or a skip where gpg
is missing."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from fxkit.lab.signing import SigningKey
from fxkit.lab.signing import signing_key as new_key

__all__ = ["SigningKey", "signing_key"]


@contextmanager
def signing_key(name: str = "fxkit lab") -> Iterator[SigningKey]:
    if shutil.which("gpg") is None:
        pytest.skip("needs gpg on the controller (apt-get install gnupg)")
    with new_key(name) as key:
        yield key
