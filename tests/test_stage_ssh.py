"""``fxkit stage host:/path DEST``: a model read from a real lab host over SFTP (fxkit's SSH
connection, host keys verified) into a folder here. Lab hosts cannot reach this machine, so the
copy runs from the lab host to here."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from fxkit.lab import Fleet
from tests.test_stage import FXKIT, digests

pytestmark = pytest.mark.lab

MODEL = "/srv/stage-src/llama"


@pytest.fixture(scope="module")
def fleet(lab_fleet) -> Fleet:
    fleet = lab_fleet(1)
    with fleet.connect("lab01") as conn:
        result = conn.run(
            f"rm -rf {MODEL} && mkdir -p {MODEL}/original /srv/stage-src/blobs && cd {MODEL} && "
            "head -c 25165824 /dev/urandom > model-00001.safetensors && "
            "head -c 3000000 /dev/urandom > /srv/stage-src/blobs/b2 && "
            "ln -s /srv/stage-src/blobs/b2 model-00002.safetensors && "
            "echo '{\"dim\": 8}' > original/params.json && echo '{}' > config.json"
        )
        assert result.ok, result.stderr
    return fleet


def remote_digests(fleet: Fleet) -> dict[str, str]:
    with fleet.connect("lab01") as conn:
        out = conn.run(f"cd {MODEL} && find -L . -type f | sort | xargs sha256sum").stdout
    return {line.split()[1].removeprefix("./"): line.split()[0] for line in out.splitlines()}


def ssh_config(fleet: Fleet, path: Path, known_hosts: bool = True) -> Path:
    lines = [
        "Host lab01",
        f"    HostName {fleet.address('lab01')}",
        f"    Port {fleet.port}",
        "    User root",
        f"    IdentityFile {fleet.client_key}",
    ]
    if known_hosts:
        lines.append(f"    UserKnownHostsFile {fleet.known_hosts}")
    path.write_text("\n".join(lines) + "\n")
    return path


def stage(tmp_path: Path, *args: str | Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "FXKIT_KNOWN_HOSTS": str(tmp_path / "own_known_hosts")}
    argv = [str(FXKIT), "stage", *map(str, args), "-q"]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)


def test_stages_from_a_lab_host(fleet: Fleet, tmp_path: Path) -> None:
    config, dest = ssh_config(fleet, tmp_path / "ssh_config"), tmp_path / "dest"
    proc = stage(tmp_path, f"lab01:{MODEL}", dest, "--ssh-config", config, "--json")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert (result["copied"], result["source"], result["checksum"]) == (
        4,
        f"lab01:{MODEL}",
        "blake3",
    )
    assert digests(dest) == remote_digests(fleet)

    again = json.loads(stage(tmp_path, f"lab01:{MODEL}", dest, "--ssh-config", config,
                             "--json").stdout)  # fmt: skip
    assert (again["copied"], again["skipped"]) == (0, 4)

    # With sha256 each file is hashed anew (a blake3 digest is no sha256), and the manifest then
    # holds the digests sha256sum prints on the source host.
    sha = json.loads(stage(tmp_path, f"lab01:{MODEL}", dest, "--ssh-config", config, "--json",
                           "--checksum", "sha256").stdout)  # fmt: skip
    assert (sha["checksum"], sha["copied"], sha["checked"]) == ("sha256", 0, 4)
    records = json.loads((dest / ".fxkit-stage.json").read_text())["files"]
    assert {k: r["digest"] for k, r in records.items()} == remote_digests(fleet)
    assert {r["algorithm"] for r in records.values()} == {"sha256"}


def test_resumes_a_partial_from_a_lab_host(fleet: Fleet, tmp_path: Path) -> None:
    config, dest = ssh_config(fleet, tmp_path / "ssh_config"), tmp_path / "dest"
    assert stage(tmp_path, f"lab01:{MODEL}", dest, "--ssh-config", config).returncode == 0
    final = dest / "model-00001.safetensors"
    half = bytearray(final.read_bytes()[: 10 << 20])
    half[5 << 20] ^= 0xFF  # and a byte gone wrong in it
    (dest / ".model-00001.safetensors.fxkit-partial").write_bytes(half)
    final.unlink()
    proc = stage(tmp_path, f"lab01:{MODEL}", dest, "--ssh-config", config, "--json",
                 "--chunk-size", "1MiB")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["resumed"] == 1  # its first 5 MiB kept
    assert digests(dest) == remote_digests(fleet)


def test_an_unknown_host_key_is_refused_unless_accepted(fleet: Fleet, tmp_path: Path) -> None:
    config = ssh_config(fleet, tmp_path / "ssh_config", known_hosts=False)
    proc = stage(tmp_path, f"lab01:{MODEL}", tmp_path / "dest", "--ssh-config", config)
    assert proc.returncode == 2
    assert "unknown ssh-ed25519 host key" in proc.stderr
    assert "--accept-new-host-keys" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "dest").exists()

    args = (f"lab01:{MODEL}", tmp_path / "dest", "--ssh-config", config)
    proc = stage(tmp_path, *args, "--accept-new-host-keys")
    assert proc.returncode == 0, proc.stderr
    assert fleet.address("lab01") in (tmp_path / "own_known_hosts").read_text()


def test_a_missing_remote_source_is_one_clear_error(fleet: Fleet, tmp_path: Path) -> None:
    config = ssh_config(fleet, tmp_path / "ssh_config")
    proc = stage(tmp_path, "lab01:/srv/no-such-model", tmp_path / "dest", "--ssh-config", config)
    assert proc.returncode == 2
    assert "lab01:/srv/no-such-model: the source does not exist" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_remote_file_that_cannot_be_read_is_an_error_not_a_short_file(
    fleet: Fleet, tmp_path: Path
) -> None:
    with fleet.connect("lab01") as conn:
        result = conn.run(
            "rm -rf /srv/stage-locked && mkdir -p /srv/stage-locked && cd /srv/stage-locked && "
            "echo '{}' > config.json && head -c 100000 /dev/urandom > secret.safetensors && "
            "chmod 0 secret.safetensors && chmod 755 /srv/stage-locked"
        )
        assert result.ok, result.stderr
    config = ssh_config(fleet, tmp_path / "ssh_config")
    text = config.read_text().replace("User root", "User fxkit")  # the lab's non-root user
    config.write_text(text)
    dest = tmp_path / "dest"
    proc = stage(tmp_path, "lab01:/srv/stage-locked", dest, "--ssh-config", config, "-j", "1")
    assert proc.returncode == 2, proc.stderr
    assert "secret.safetensors: cannot read" in proc.stderr
    assert "Permission denied" in proc.stderr and "Traceback" not in proc.stderr
    assert not (dest / "secret.safetensors").exists()
    assert not (dest / ".secret.safetensors.fxkit-partial").exists()
