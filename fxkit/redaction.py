"""Which values are secret, and how they are kept out of everything fxkit prints or logs.

A variable is secret when its name has a part ``password``, ``passwd``, ``pass``, ``secret``,
``token`` or ``passphrase``, or contains ``api_key`` (``ansible_become_password``,
``registry_token``; not ``max_tokens``), or when a play lists it in ``secret_vars``.

Values shorter than :data:`MIN_SECRET_LENGTH` are never masked, anywhere: masking ``1``, ``yes``
or ``MI3`` would corrupt ordinary text and, by the holes it leaves, give the value away.
This module imports nothing from fxkit, so every layer (the connection included) can use it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

SECRET_PARTS = frozenset({"password", "passwd", "pass", "secret", "token", "passphrase"})
REDACTED = "********"
#: Shorter secret values are not masked (they would mask ordinary words such as "root").
MIN_SECRET_LENGTH = 6


def is_secret_name(name: str, extra: Iterable[str] = ()) -> bool:
    """True for variables whose values must never be shown (see the module docstring)."""
    lowered = name.lower()
    parts = set(re.split(r"[^a-z0-9]+", lowered))
    return bool(parts & SECRET_PARTS) or "api_key" in lowered or name in set(extra)


def maskable(values: Iterable[str]) -> list[str]:
    """The values worth masking, longest first (so a secret inside another goes too)."""
    return sorted({v for v in values if len(v) >= MIN_SECRET_LENGTH}, key=len, reverse=True)


def redact(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every secret value of at least :data:`MIN_SECRET_LENGTH` characters
    replaced by ``********`` (give them longest first, as :func:`maskable` does)."""
    for secret in secrets:
        if len(secret) >= MIN_SECRET_LENGTH:
            text = text.replace(secret, REDACTED)
    return text
