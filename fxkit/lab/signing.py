"""A throwaway OpenPGP signing key, made by the real gpg, for the lab's apt mirror."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from fxkit.errors import FxkitError


class SigningError(FxkitError):
    """gpg is missing or failed."""


@dataclass
class SigningKey:
    home: str
    #: The public key, ASCII-armored as ``gpg --armor --export`` writes it.
    armored: str

    def gpg(self, *args: str, stdin: bytes = b"") -> bytes:
        env = {**os.environ, "GNUPGHOME": self.home}
        done = subprocess.run(
            ["gpg", "--batch", "--quiet", *args], input=stdin, env=env, capture_output=True
        )
        if done.returncode != 0:
            raise SigningError(f"gpg {args[0]} failed: {done.stderr.decode().strip()[-300:]}")
        return done.stdout

    def dearmored(self) -> bytes:
        """What ``gpg --dearmor`` makes of the armored key."""
        return self.gpg("--dearmor", stdin=self.armored.encode())

    def clearsign(self, text: bytes) -> bytes:
        """An InRelease file: ``text`` clear-signed."""
        return self.gpg("--clearsign", "--digest-algo", "SHA256", stdin=text)


@contextmanager
def signing_key(name: str = "fxkit lab") -> Iterator[SigningKey]:
    """A new ed25519 key in a temporary keyring, removed (and its agent stopped) afterwards."""
    if shutil.which("gpg") is None:
        raise SigningError(
            "the lab's apt mirror is signed with gpg, which is not installed",
            hint="apt-get install gnupg (or run scripts/install-system-deps.sh)",
        )
    home = tempfile.mkdtemp(prefix="fxgpg")  # short: gpg-agent's socket path must fit
    try:
        key = SigningKey(home, "")
        key.gpg("--passphrase", "", "--quick-gen-key", f"{name} <lab@fxkit.invalid>", "ed25519")
        key.armored = key.gpg("--armor", "--export").decode()
        yield key
    finally:
        subprocess.run(
            ["gpgconf", "--kill", "gpg-agent"],
            env={**os.environ, "GNUPGHOME": home},
            capture_output=True,
        )
        shutil.rmtree(home, ignore_errors=True)
