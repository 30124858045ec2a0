"""apt sources, pins and holds: repositories with their signing key, preferences, apt-mark holds.

Formats as apt documents them: sources.list(5) (a deb822 ``.sources`` stanza, or ``.list`` lines
``deb [arch=amd64 signed-by=/etc/apt/keyrings/x.gpg] URI SUITE COMPONENT...``), apt_preferences(5)
(``Package``, ``Pin``, ``Pin-Priority``) and apt-mark(8).

A repository's armored key is dearmored on the controller, in Python (RFC 4880 §6: the base64
body, its CRC24 checked), and written as a binary keyring: the same bytes ``gpg --dearmor``
writes, without needing gnupg on the host, and comparable by sha256 in check mode too.
"""

from __future__ import annotations

import base64
import binascii
import re
from shlex import quote

from fxkit.facts.apt import HeldPackages
from fxkit.facts.system import OsRelease
from fxkit.ops.base import (
    OpContext,
    OpError,
    Result,
    Status,
    check_state,
    combine,
    ok,
    skipped,
)
from fxkit.ops.files import file, in_directory
from fxkit.ops.packages import parse_spec

KEYRINGS = "/etc/apt/keyrings"
SOURCES = "/etc/apt/sources.list.d"
PREFERENCES = "/etc/apt/preferences.d"

#: A file name apt reads in sources.list.d and preferences.d (others are ignored with a notice).
_FILE_NAME = re.compile(r"[A-Za-z0-9_.-]+")
#: One word of a source entry: no space, and nothing the one-line style reads as syntax.
_WORD = re.compile(r"[^\s#\[\]]+")
_FIELD = re.compile(r"[A-Za-z][A-Za-z0-9-]*")
#: deb822 field names whose one-line option name is not just the field name in lower case.
_ONE_LINE_NAMES = {"Architectures": "arch", "Languages": "lang", "Targets": "target"}
_PIN = re.compile(r"(release|origin|version)\s+\S[^\n]*")
_ARMOR = re.compile(
    r"-----BEGIN PGP (?P<kind>[A-Z ]+)-----\r?\n(?P<body>.*?)-----END PGP (?P=kind)-----", re.S
)
#: First byte of an OpenPGP public-key packet (tag 6): old format (four length types) or new.
_PUBLIC_KEY_TAGS = {0x98, 0x99, 0x9A, 0x9B, 0xC6}

Words = str | list[str]


def _words(value: Words | None, what: str) -> list[str]:
    words = value.split() if isinstance(value, str) else list(value or [])
    for word in words:
        if not isinstance(word, str) or not _WORD.fullmatch(word):
            raise OpError(
                f"bad {what} {word!r} for an apt source",
                hint="one word each, without spaces, '#', '[' or ']'",
            )
    return words


def _check_file_name(name: str, what: str) -> None:
    if not _FILE_NAME.fullmatch(name):
        raise OpError(
            f"bad {what} name {name!r}",
            hint="apt ignores files whose names have characters other than A-Z a-z 0-9 _ - .",
        )


def _not_apt(ctx: OpContext, what: str) -> str:
    """Why this host has no apt to configure; empty when it has."""
    os_info = ctx.fact(OsRelease)
    if os_info.family == "debian":
        return ""
    return f"{what}: apt hosts only, and this one is {os_info.pretty_name or os_info.id}"


# -- keys ---------------------------------------------------------------------------------


def crc24(data: bytes) -> int:
    """The CRC-24 of OpenPGP's ASCII armor (RFC 4880 §6.1)."""
    crc = 0xB704CE
    for byte in data:
        crc ^= byte << 16
        for _ in range(8):
            crc <<= 1
            if crc & 0x1000000:
                crc ^= 0x1864CFB
    return crc & 0xFFFFFF


def dearmor(key: str | bytes) -> bytes:
    """An OpenPGP public key as the binary keyring apt reads (what ``gpg --dearmor`` writes).

    ``key`` is the ASCII-armored text (``-----BEGIN PGP PUBLIC KEY BLOCK-----``), or already
    binary (returned as is). The armor checksum (``=XXXX``), when there is one, must match.
    """
    raw = key.encode() if isinstance(key, str) else key
    if raw[:1] and raw[0] in _PUBLIC_KEY_TAGS:
        return raw
    blocks = list(_ARMOR.finditer(raw.decode("ascii", "replace")))
    if len(blocks) != 1:
        found = f"{len(blocks)} armored blocks" if blocks else "no armored block"
        raise OpError(
            f"the repository key is not one OpenPGP key ({found})",
            hint="give the text of one '-----BEGIN PGP PUBLIC KEY BLOCK-----' file",
        )
    kind, body = blocks[0]["kind"], blocks[0]["body"]
    if kind != "PUBLIC KEY BLOCK":
        raise OpError(
            f"the repository key is a PGP {kind.lower()}, not a public key block",
            hint="apt needs the repository's public key; never ship a private key to hosts",
        )
    lines = [line.strip() for line in body.splitlines()]
    if ":" in lines[0]:  # armor headers (Version:, Comment:) up to the first empty line
        lines = lines[lines.index("") + 1 :] if "" in lines else []
    checksum = next((line for line in lines if line.startswith("=")), None)
    text = "".join(line for line in lines if line and not line.startswith("="))
    try:
        data = base64.b64decode(text, validate=True)
        expected = base64.b64decode(checksum[1:], validate=True) if checksum else None
    except binascii.Error:
        raise OpError("the repository key's armor is not valid base64") from None
    if expected is not None and int.from_bytes(expected, "big") != crc24(data):
        raise OpError(
            "the repository key's armor checksum does not match: the key is damaged",
            hint="fetch the key file again from the vendor",
        )
    if not data or data[0] not in _PUBLIC_KEY_TAGS:
        raise OpError("the repository key does not start with an OpenPGP public-key packet")
    return data


# -- sources ------------------------------------------------------------------------------


def render_source(
    style: str,
    types: list[str],
    uris: list[str],
    suites: list[str],
    components: list[str],
    options: dict[str, list[str]],
) -> str:
    """A source entry in ``deb822`` style (one stanza) or ``one-line`` style (a line per type,
    URI and suite), as sources.list(5) writes them; ``options`` are keyed by deb822 field name."""
    if style == "deb822":
        fields = {"Types": types, "URIs": uris, "Suites": suites, "Components": components}
        fields.update(options)
        return "".join(f"{name}: {' '.join(values)}\n" for name, values in fields.items() if values)
    brackets = " ".join(
        f"{_ONE_LINE_NAMES.get(name, name.lower())}={','.join(values)}"
        for name, values in options.items()
    )
    head = f" [{brackets}]" if brackets else ""
    return "".join(
        f"{' '.join([kind + head, uri, suite, *components])}\n"
        for kind in types
        for uri in uris
        for suite in suites
    )


def apt_repository(
    ctx: OpContext,
    name: str,
    uris: Words,
    suites: Words,
    components: Words | None = None,
    key: str | bytes | None = None,
    keyring: str | None = None,
    architectures: Words | None = None,
    types: Words = "deb",
    options: dict[str, str | list[str]] | None = None,
    style: str = "deb822",
    state: str = "present",
    update: bool = False,
) -> Result:
    """Ensure the apt source ``/etc/apt/sources.list.d/<name>.sources`` (``style="one-line"``:
    ``<name>.list``) exists, signed by a keyring, or is gone (``state="absent"``).

    ``key``, the repository's armored public key, is dearmored into ``keyring`` (default
    ``/etc/apt/keyrings/<name>.gpg``, mode 0644) and the source gets ``Signed-By`` it; a
    ``keyring`` without ``key`` names one already on the host. ``options`` are further fields by
    their deb822 names (``{"Trusted": "yes"}``). A source of the other style with the same name is
    removed. After a change ``data["apt_update_needed"]`` is true, or with ``update=True`` apt's
    index of this source alone is refreshed (a warning, such as a bad signature, fails it:
    apt-get would keep the old index and exit 0). ``state="absent"`` removes the source file and the
    default keyring (a keyring given by path may be shared, and stays).

    Example::

        host.apt_repository("rocm", "https://repo.radeon.com/rocm/apt/7.2", "noble", "main",
                            key=rocm_gpg_key, architectures="amd64")
    """
    check_state(state, ("present", "absent"))
    check_state(style, ("deb822", "one-line"))
    _check_file_name(name, "apt source")
    kinds = _words(types, "type")
    if not set(kinds) <= {"deb", "deb-src"} or not kinds:
        raise OpError(f"bad apt source types {types!r}", hint="deb, deb-src or both")
    uri_list, suite_list = _words(uris, "URI"), _words(suites, "suite")
    component_list = _words(components, "component")
    if not uri_list or not suite_list:
        raise OpError(f"apt source {name} needs at least one URI and one suite")
    for suite in suite_list:
        if suite.endswith("/") == bool(component_list):
            raise OpError(
                f"apt source {name}: suite {suite!r} and components {component_list}",
                hint="an exact path suite ends with '/' and has no components; any other "
                "suite needs at least one component (sources.list(5))",
            )
    keyring = keyring or (f"{KEYRINGS}/{name}.gpg" if key is not None else None)
    fields: dict[str, list[str]] = {}
    if architectures:
        fields["Architectures"] = _words(architectures, "architecture")
    if keyring:
        fields["Signed-By"] = _words(keyring, "keyring path")
    for field, value in (options or {}).items():
        if not _FIELD.fullmatch(field) or field in ("Types", "URIs", "Suites", "Components"):
            raise OpError(
                f"bad apt source option {field!r}", hint="a deb822 field name, e.g. Trusted"
            )
        fields[field] = _words(value, f"value of {field}")
    keyring_data = dearmor(key) if key is not None else None

    reason = _not_apt(ctx, f"apt source {name}")
    if reason:
        return skipped(reason)
    suffix, other = (".sources", ".list") if style == "deb822" else (".list", ".sources")
    path, other_path = f"{SOURCES}/{name}{suffix}", f"{SOURCES}/{name}{other}"
    if state == "absent":
        steps = [file(ctx, path, state="absent"), file(ctx, other_path, state="absent")]
        if keyring in (None, f"{KEYRINGS}/{name}.gpg"):
            steps.append(file(ctx, f"{KEYRINGS}/{name}.gpg", state="absent"))
        return _summary(steps, f"apt source {name} absent")

    steps = []
    if keyring and keyring_data is not None:
        steps.append(_config_file(ctx, keyring, keyring_data))
    if not (steps and steps[0].failed):  # a source signed by a keyring that is not there: no
        content = render_source(style, kinds, uri_list, suite_list, component_list, fields)
        steps.append(_config_file(ctx, path, content.encode()))
        steps.append(file(ctx, other_path, state="absent"))
    result = _summary(steps, f"apt source {name} as wanted")
    if not result.changed or result.failed:
        result.data["apt_update_needed"] = False
        return result
    if not update:
        result.data["apt_update_needed"] = True
        return result
    refresh = ctx.change(
        f"apt-get update -q -o Dir::Etc::SourceList={quote(path)} -o Dir::Etc::SourceParts=- "
        "-o APT::Get::List-Cleanup=0 -o APT::Update::Error-Mode=any",
        would=f"refresh apt's index of {name}",
        done=f"refreshed apt's index of {name}",
        timeout=600,
    )
    combined = combine(result, refresh)
    combined.data["apt_update_needed"] = refresh.failed
    return combined


def _config_file(ctx: OpContext, path: str, content: bytes) -> Result:
    return in_directory(ctx, path, lambda: file(ctx, path, content, mode="0644"))


def _summary(steps: list[Result], as_wanted: str) -> Result:
    """The steps that did something, combined; ``ok(as_wanted)`` when none did."""
    acted = [step for step in steps if step.status is not Status.OK]
    return combine(*acted) if acted else ok(as_wanted)


# -- pins ---------------------------------------------------------------------------------


def render_pin(packages: list[str], pin: str, priority: int, explanation: str | None) -> str:
    """One apt_preferences(5) record."""
    lines = [f"Explanation: {explanation}"] if explanation else []
    lines += [f"Package: {' '.join(packages)}", f"Pin: {pin}", f"Pin-Priority: {priority}"]
    return "".join(f"{line}\n" for line in lines)


def apt_pin(
    ctx: OpContext,
    name: str,
    pin: str,
    priority: int,
    packages: Words = "*",
    explanation: str | None = None,
    state: str = "present",
) -> Result:
    """Ensure the apt preferences file ``/etc/apt/preferences.d/<name>`` pins ``packages`` (all:
    ``*``) matching ``pin`` (``release o=repo.radeon.com``, ``origin repo.radeon.com``,
    ``version 7.2*``) at ``priority``, or is gone (``state="absent"``).

    Example::

        host.apt_pin("rocm-pin-600", "release o=repo.radeon.com", 600)
    """
    check_state(state, ("present", "absent"))
    _check_file_name(name, "apt preferences file")
    if "." in name and not name.endswith(".pref"):
        raise OpError(
            f"bad apt preferences file name {name!r}",
            hint="apt reads preferences.d files without an extension or ending in .pref",
        )
    if not _PIN.fullmatch(pin):
        raise OpError(
            f"bad pin {pin!r}",
            hint="release a=...,o=..., origin HOST or version 7.2* (apt_preferences(5))",
        )
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise OpError(f"bad pin priority {priority!r}", hint="an integer, e.g. 600 or -1")
    names = packages.split() if isinstance(packages, str) else list(packages)
    if not names or any("\n" in n or not n.strip() for n in names):
        raise OpError(f"bad packages {packages!r} for apt pin {name}", hint="'*', or names")
    if explanation is not None and "\n" in explanation:
        raise OpError(f"apt pin {name}: the explanation must be one line")

    reason = _not_apt(ctx, f"apt pin {name}")
    if reason:
        return skipped(reason)
    path = f"{PREFERENCES}/{name}"
    if state == "absent":
        return file(ctx, path, state="absent")
    return _config_file(ctx, path, render_pin(names, pin, priority, explanation).encode())


# -- holds --------------------------------------------------------------------------------


def package_hold(ctx: OpContext, names: Words, state: str = "held") -> Result:
    """Hold packages at their version (``apt-mark hold``: upgrades leave them alone), or release
    them (``state="unheld"``). apt hosts only; on others the step is skipped with the reason.

    Example::

        host.package_hold(["amdgpu-dkms", "rocm"])
    """
    check_state(state, ("held", "unheld"))
    wanted = names.split() if isinstance(names, str) else list(names)
    for spec in wanted:
        if parse_spec(spec)[1] is not None:
            raise OpError(
                f"hold {spec!r}: give the package name only",
                hint="a hold keeps the installed version",
            )
    reason = _not_apt(ctx, "package holds")
    if reason:
        return skipped(f"{reason} (dnf: use the versionlock plugin)")
    held = ctx.fresh(HeldPackages)
    todo = [n for n in wanted if (n in held) != (state == "held")]
    if not todo:
        return ok(f"packages {state}")
    verb = "hold" if state == "held" else "unhold"
    listed = ", ".join(todo)
    before, after = ("unheld", "held") if state == "held" else ("held", "unheld")
    return ctx.change(
        f"apt-mark {verb} {' '.join(quote(n) for n in todo)}",
        would=f"{verb} {listed}",
        done=f"{'held' if verb == 'hold' else 'unheld'} {listed}",
        diff="".join(f"{n}: {before} -> {after}\n" for n in todo),
    )
