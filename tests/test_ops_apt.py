"""apt sources, pins and holds: the rendering and the key dearmoring, against the real tools'
formats (sources.list(5), apt_preferences(5), gpg --dearmor). On real apt: test_ops_lab_apt.py."""

from __future__ import annotations

import pytest

from fxkit.connection.local import LocalConnection
from fxkit.facts.base import FactCache
from fxkit.ops.apt import (
    apt_pin,
    apt_repository,
    crc24,
    dearmor,
    package_hold,
    render_pin,
    render_source,
)
from fxkit.ops.base import OpContext, OpError
from tests.gpg_helpers import signing_key


def ctx() -> OpContext:
    conn = LocalConnection("localhost")
    return OpContext(conn, FactCache(conn), check=True)


def test_dearmor_writes_what_gpg_dearmor_writes() -> None:
    with signing_key() as key:
        assert dearmor(key.armored) == key.dearmored()
        assert dearmor(key.armored.encode()) == key.dearmored()
        assert dearmor(key.dearmored()) == key.dearmored()  # already binary: as it is
        # Armor headers (Comment:, Version:) before the empty line are not key data.
        with_header = key.armored.replace("\n\n", "\nComment: fxkit lab\n\n", 1)
        assert dearmor(with_header) == key.dearmored()


def test_dearmor_refuses_a_damaged_or_wrong_block() -> None:
    with signing_key() as key:
        lines = key.armored.splitlines()
        crc_at = next(i for i, line in enumerate(lines) if line.startswith("="))
        body = lines[crc_at - 1]
        flipped = ("B" if body[0] != "B" else "C") + body[1:]
        damaged = [*lines[: crc_at - 1], flipped, *lines[crc_at:]]
        with pytest.raises(OpError, match="checksum does not match"):
            dearmor("\n".join(damaged) + "\n")
        secret = key.gpg(
            "--armor", "--pinentry-mode", "loopback", "--passphrase", "", "--export-secret-keys"
        ).decode()
    with pytest.raises(OpError, match="private key block, not a public key") as exc:
        dearmor(secret)
    assert "never ship a private key" in (exc.value.hint or "")
    with pytest.raises(OpError, match="no armored block"):
        dearmor("not a key")
    with pytest.raises(OpError, match="2 armored blocks"):
        dearmor(key.armored + key.armored)


def test_crc24_of_rfc4880() -> None:
    assert crc24(b"") == 0xB704CE  # the initial value: nothing to fold in
    # The check value of CRC-24/OPENPGP in Greg Cook's catalogue of parametrised CRCs (reveng).
    assert crc24(b"123456789") == 0x21CF02


ROCM = "https://repo.radeon.com/rocm/apt/7.2.2"


def test_sources_for_the_rocm_repository_in_both_styles() -> None:
    options = {"Architectures": ["amd64"], "Signed-By": ["/etc/apt/keyrings/rocm.gpg"]}
    args = (["deb"], [ROCM], ["noble"], ["main"], options)
    assert render_source("deb822", *args) == (
        "Types: deb\n"
        f"URIs: {ROCM}\n"
        "Suites: noble\n"
        "Components: main\n"
        "Architectures: amd64\n"
        "Signed-By: /etc/apt/keyrings/rocm.gpg\n"
    )
    # The line of ROCm's install guide (FACTS.md: ROCm 7.2 hosts).
    assert render_source("one-line", *args) == (
        f"deb [arch=amd64 signed-by=/etc/apt/keyrings/rocm.gpg] {ROCM} noble main\n"
    )
    two = render_source(
        "one-line",
        ["deb", "deb-src"],
        [ROCM],
        ["noble", "jammy"],
        ["main"],
        {"Architectures": ["amd64", "i386"], "Trusted": ["yes"]},
    )
    assert two.splitlines() == [
        f"deb [arch=amd64,i386 trusted=yes] {ROCM} noble main",
        f"deb [arch=amd64,i386 trusted=yes] {ROCM} jammy main",
        f"deb-src [arch=amd64,i386 trusted=yes] {ROCM} noble main",
        f"deb-src [arch=amd64,i386 trusted=yes] {ROCM} jammy main",
    ]
    assert render_source("deb822", ["deb"], ["file:/srv/repo"], ["./"], [], {}) == (
        "Types: deb\nURIs: file:/srv/repo\nSuites: ./\n"
    )


def test_the_rocm_pin_of_facts_md() -> None:
    assert render_pin(["*"], "release o=repo.radeon.com", 600, None) == (
        "Package: *\nPin: release o=repo.radeon.com\nPin-Priority: 600\n"
    )
    assert render_pin(["rocm", "hipcc"], "version 7.2*", -1, "not 7.2") == (
        "Explanation: not 7.2\nPackage: rocm hipcc\nPin: version 7.2*\nPin-Priority: -1\n"
    )


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"name": "rocm list"}, "bad apt source name"),
        ({"uris": "https://x/[y]"}, "bad URI"),
        ({"suites": "./", "components": "main"}, "exact path suite"),
        ({"components": None}, "exact path suite"),
        ({"types": "rpm"}, "bad apt source types"),
        ({"options": {"URIs": "x"}}, "bad apt source option"),
        ({"options": {"Trusted": "yes no#"}}, "bad value of Trusted"),
        ({"style": "yaml"}, "unknown state 'yaml'"),
        ({"key": "-----BEGIN PGP MESSAGE-----\nx\n-----END PGP MESSAGE-----\n"}, "message"),
    ],
)
def test_apt_repository_refuses_bad_arguments(kwargs: dict, match: str) -> None:
    args = {"name": "rocm", "uris": ROCM, "suites": "noble", "components": "main", **kwargs}
    with pytest.raises(OpError, match=match):
        apt_repository(ctx(), **args)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (("rocm.conf", "release o=x", 600), "without an extension or ending in .pref"),
        (("rocm", "o=repo.radeon.com", 600), "bad pin"),
        (("rocm", "release o=x", "600"), "bad pin priority"),
        (("rocm", "release o=x", True), "bad pin priority"),
    ],
)
def test_apt_pin_refuses_bad_arguments(args: tuple, match: str) -> None:
    with pytest.raises(OpError, match=match):
        apt_pin(ctx(), *args)


def test_package_hold_takes_names_only() -> None:
    with pytest.raises(OpError, match="give the package name only"):
        package_hold(ctx(), ["rocm=7.2.2"])
    with pytest.raises(OpError, match="unknown state"):
        package_hold(ctx(), "rocm", state="frozen")
