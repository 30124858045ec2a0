"""A throwaway OpenPGP signing key made by the real gpg, for apt repository tests."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest


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
        assert done.returncode == 0, done.stderr.decode()
        return done.stdout

    def dearmored(self) -> bytes:
        """What ``gpg --dearmor`` makes of the armored key."""
        return self.gpg("--dearmor", stdin=self.armored.encode())

    def clearsign(self, text: bytes) -> bytes:
        """An InRelease file: ``text`` clear-signed."""
        return self.gpg("--clearsign", "--digest-algo", "SHA256", stdin=text)


@contextmanager
def signing_key(name: str = "fxkit lab") -> Iterator[SigningKey]:
    if shutil.which("gpg") is None:
        pytest.skip("needs gpg on the controller (apt-get install gnupg)")
    home = tempfile.mkdtemp(prefix="fxgpg")  # short: gpg-agent's socket path must fit
    try:
        key = SigningKey(home, "")
        key.gpg("--passphrase", "", "--quick-gen-key", f"{name} <lab@fxkit.invalid>", "ed25519")
        key.armored = key.gpg("--armor", "--export").decode()
        yield key
    finally:
        subprocess.run(["gpgconf", "--kill", "gpg-agent"], env={**os.environ, "GNUPGHOME": home})
        shutil.rmtree(home, ignore_errors=True)
