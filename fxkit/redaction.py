"""Which values are secret, and how they are kept out of everything fxkit prints or logs.

A variable is secret when its name has a part ``password``, ``passwd``, ``pass``, ``secret``,
``token`` or ``passphrase``, or contains ``api_key`` (``ansible_become_password``,
``registry_token``; not ``max_tokens``), or when a play lists it in ``secret_vars``. Inside any
variable, the value under such a key is secret too (``creds: {password: ...}``).

A secret value is masked as written and as roles and templates commonly transform it (see
:func:`variants`). Values shorter than :data:`MIN_SECRET_LENGTH` are never masked, anywhere:
masking ``1``, ``yes`` or ``MI3`` would corrupt ordinary text and, by the holes it leaves, give
the value away. This module imports nothing from fxkit, so every layer (the connection
included) can use it.
"""

from __future__ import annotations

import base64
import json
import re
import shlex
from collections.abc import Collection, Iterable, Iterator, Mapping
from functools import lru_cache
from typing import Any
from urllib.parse import quote, quote_plus

SECRET_PARTS = frozenset({"password", "passwd", "pass", "secret", "token", "passphrase"})
REDACTED = "********"
#: Shorter secret values are not masked (they would mask ordinary words such as "root").
MIN_SECRET_LENGTH = 6


def is_secret_name(name: object, extra: Collection[str] = ()) -> bool:
    """True for variables (and keys) whose values must never be shown (see the module doc);
    ``extra``: more such names (a play's ``secret_vars``)."""
    return isinstance(name, str) and (_has_secret_part(name) or name in extra)


@lru_cache(maxsize=65536)  # keys repeat: a large vars file has few distinct ones
def _has_secret_part(name: str) -> bool:
    lowered = name.lower()
    return bool(set(re.split(r"[^a-z0-9]+", lowered)) & SECRET_PARTS) or "api_key" in lowered


def leaves(value: Any) -> Iterator[str]:
    """Every scalar in ``value`` (nested mappings and lists too) as text; not None or bools."""
    if isinstance(value, Mapping):
        for item in value.values():
            yield from leaves(item)
    elif isinstance(value, list | tuple | set | frozenset):
        for item in value:
            yield from leaves(item)
    elif value is not None and not isinstance(value, bool):
        yield str(value)


def secret_leaves(value: Any, extra: Collection[str] = ()) -> Iterator[str]:
    """The scalars in ``value`` that sit under a secret key, at any depth (a loop, not a
    recursion: vars files can be large)."""
    containers = (Mapping, list, tuple)
    stack = [value] if isinstance(value, containers) else []
    while stack:
        item = stack.pop()
        if isinstance(item, Mapping):
            for key, sub in item.items():
                if is_secret_name(key, extra):
                    yield from leaves(sub)
                elif isinstance(sub, containers):
                    stack.append(sub)
        else:
            stack.extend(sub for sub in item if isinstance(sub, containers))


def masked(variables: Mapping[str, Any], extra: Collection[str] = ()) -> dict[str, Any]:
    """``variables`` for display: every secret value (see the module doc) of at least
    :data:`MIN_SECRET_LENGTH` characters replaced by ``********``, nested ones too."""
    extra = frozenset(extra)
    return {
        name: _masked(value, is_secret_name(name, extra), extra)
        for name, value in variables.items()
    }


def _masked(value: Any, secret: bool, extra: frozenset[str]) -> Any:
    if isinstance(value, Mapping):
        return {
            key: _masked(item, secret or is_secret_name(key, extra), extra)
            for key, item in value.items()
        }
    if isinstance(value, list | tuple):
        return [_masked(item, secret, extra) for item in value]
    if secret and any(len(text) >= MIN_SECRET_LENGTH for text in leaves(value)):
        return REDACTED
    return value


def variants(secret: str) -> set[str]:
    """``secret`` as it may appear in output: as written; upper, lower and capitalised (Jinja2's
    ``upper``, ``lower``, ``capitalize``, ``title``); base64 and URL-quoted (``b64encode``,
    ``urlencode``); JSON-, Python- and shell-quoted; and each line of a multi-line value (a
    diff prefixes every line)."""
    found = {
        secret,
        secret.upper(),
        secret.lower(),
        secret.capitalize(),
        secret.title(),
        base64.b64encode(secret.encode()).decode(),
        base64.urlsafe_b64encode(secret.encode()).decode(),
        quote(secret),
        quote(secret, safe=""),
        quote_plus(secret),
        json.dumps(secret)[1:-1],
        json.dumps(secret, ensure_ascii=False)[1:-1],
        repr(secret)[1:-1],
        shlex.quote(secret),
    }
    found.update(line.strip() for line in secret.splitlines())
    return found


def maskable(values: Iterable[str]) -> list[str]:
    """The texts to mask for these secret values: those of at least :data:`MIN_SECRET_LENGTH`
    characters with their :func:`variants` (of that length too), longest first (so a secret
    inside another goes too)."""
    texts = {
        text for value in values if len(value) >= MIN_SECRET_LENGTH for text in variants(value)
    }
    return sorted({t for t in texts if len(t) >= MIN_SECRET_LENGTH}, key=len, reverse=True)


def redact(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every secret text of at least :data:`MIN_SECRET_LENGTH` characters
    replaced by ``********`` (give them as :func:`maskable` returns them)."""
    for secret in secrets:
        if len(secret) >= MIN_SECRET_LENGTH:
            text = text.replace(secret, REDACTED)
    return text
