"""Which values are secret, and how they are kept out of everything fxkit prints or logs.

Which names are secret. A name is read as words (split at ``_``, ``-``, ``.`` and camelCase:
``HF_TOKEN``, ``apiKey``, ``nvme_dhchap_key``). It is secret when

- one of its words is a :data:`SECRET_WORDS` word (``ansible_become_password``,
  ``registry_token``, ``credentials``, ``apikey``; not ``max_tokens``), as Ansible's ``no_log``
  heuristic (``pass`` anywhere) and common secret filters (Rails' ``filter_parameters``,
  Sentry's scrubber) have it, unless its last word says that the value only refers to or
  describes a secret (:data:`REFERENCE_WORDS`: a path, a URL, a length, a digest:
  ``ansible_ssh_private_key_file``, ``vault_password_file``, ``password_min_length``);
- or its last word is ``key`` (the value is a key: ``nvme_dhchap_key``, ``registry_auth_key``,
  ``private_key``), after another word that is not ``public``/``pub``, as the common Rails
  log filter ``/key$/`` has it. ``key`` elsewhere names something about a key
  (``rocm_host_key_sha256``, ``ssh_strict_host_key_checking``, ``num_key_value_heads``), and a
  bare ``key`` is a mapping's key as often as a cryptographic one.

A play's ``secret_vars`` and the variable ``fxkit_secret_vars`` (inventory, group_vars, vars
files, ``-e``) mark more names: names or glob patterns (``bmc_*``). Inside any variable, the
value under a secret key is secret too (``creds: {password: ...}``).

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
import threading
from collections.abc import Collection, Iterable, Iterator, Mapping
from fnmatch import fnmatchcase
from functools import lru_cache
from typing import Any
from urllib.parse import quote, quote_plus

#: Words that make a name secret wherever they stand in it.
SECRET_WORDS = frozenset(
    {
        *("password", "passwords", "passwd", "pass", "passphrase"),
        *("secret", "secrets", "token", "credential", "credentials"),
        *("apikey", "privatekey", "authkey", "secretkey", "psk"),
        *("cookie", "authorization"),
    }
)
#: Last words that make a name refer to or describe a secret, not hold it.
REFERENCE_WORDS = frozenset(
    {
        *("file", "filename", "path", "dir", "directory", "url", "uri", "name", "names", "vars"),
        *("length", "len", "size", "bits", "ttl", "timeout", "expiry", "expires"),
        *("type", "algorithm", "format", "mode", "owner", "group", "enabled", "count"),
        *("digest", "checksum", "fingerprint", "md5", "sha1", "sha224", "sha256", "sha384"),
        "sha512",
    }
)
#: The variable that marks more names (and glob patterns) secret.
SECRET_VARS = "fxkit_secret_vars"
REDACTED = "********"
#: Shorter secret values are not masked (they would mask ordinary words such as "root").
MIN_SECRET_LENGTH = 6
_WORD = re.compile(r"[A-Z]?[a-z0-9]+|[A-Z0-9]+(?![a-z])")


def is_secret_name(name: object, extra: Collection[str] = ()) -> bool:
    """True for variables (and keys) whose values must never be shown (see the module doc);
    ``extra``: more such names or glob patterns (``secret_vars``, ``fxkit_secret_vars``)."""
    if not isinstance(name, str):
        return False
    return _has_secret_word(name) or (bool(extra) and _listed(name, frozenset(extra)))


@lru_cache(maxsize=65536)  # keys repeat: a large vars file has few distinct ones
def _has_secret_word(name: str) -> bool:
    words = [word.lower() for word in _WORD.findall(name)]
    if not words or words[-1] in REFERENCE_WORDS:
        return False
    if any(word in SECRET_WORDS for word in words):
        return True
    return len(words) > 1 and words[-1] == "key" and words[-2] not in ("public", "pub")


@lru_cache(maxsize=65536)
def _listed(name: str, patterns: frozenset[str]) -> bool:
    return name in patterns or any(fnmatchcase(name, pattern) for pattern in patterns)


def listed_names(value: Any) -> list[str] | None:
    """The names and patterns a ``secret_vars`` or ``fxkit_secret_vars`` value lists (a list of
    strings, or one string of comma-separated ones); None when it is neither."""
    if isinstance(value, str):
        value = value.split(",")
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        return None
    return [item.strip() for item in value if item.strip()]


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
    :data:`MIN_SECRET_LENGTH` characters replaced by ``********``, nested ones too; their own
    ``fxkit_secret_vars`` counts."""
    extra = frozenset(extra) | frozenset(listed_names(variables.get(SECRET_VARS)) or ())
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


def redact_data(value: Any, secrets: list[str]) -> Any:
    """``value`` as plain JSON-able data (mappings, lists, scalars), every string in it (keys
    too) :func:`redact`-ed."""
    if isinstance(value, Mapping):
        return {redact(str(k), secrets): redact_data(v, secrets) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [redact_data(v, secrets) for v in value]
    if value is None or isinstance(value, bool | int | float):
        return value
    return redact(value if isinstance(value, str) else str(value), secrets)


class Masker:
    """The secret values met so far, and text and data with them masked (thread-safe): what a
    run prints, logs or writes passes through one."""

    def __init__(self, values: Iterable[str] = ()) -> None:
        self._lock = threading.Lock()
        self._values: frozenset[str] = frozenset()
        self._masks: list[str] = []
        self.add(values)

    def add(self, values: Iterable[str]) -> None:
        """Secret values to mask from now on (with their :func:`variants`)."""
        with self._lock:
            new = set(values) - self._values
            if new:
                self._values |= new
                self._masks = maskable(self._values)

    @property
    def values(self) -> frozenset[str]:
        return self._values

    @property
    def masks(self) -> list[str]:
        """What :func:`maskable` makes of the values: the texts masked."""
        return self._masks

    def text(self, text: str) -> str:
        return redact(text, self._masks)

    def data(self, value: Any) -> Any:
        return redact_data(value, self._masks)
