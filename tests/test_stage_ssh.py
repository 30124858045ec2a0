"""``fxkit stage host:/path DEST``: a model read from a real lab host over SFTP (fxkit's SSH
connection, host keys verified) into a folder here. Lab hosts cannot reach this machine, so the
copy runs from the lab host to here. Names no OpenSSH server can list (``../../x``) come from a
hostile SFTP server of our own (paramiko's server side, on this machine's loopback)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import stat
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar, cast

import paramiko
import pytest

from fxkit.connection import ConnectOptions
from fxkit.connection.ssh import SSHConnection
from fxkit.lab import Fleet
from fxkit.staging import SSHSource
from fxkit.staging import stage as stage_source
from tests.test_stage import FXKIT, digests, finish, skipped, start

pytestmark = pytest.mark.lab

#: A Hugging Face cache's snapshot: its second shard a link into the cache's blobs.
REPO = "/srv/stage-src/models--org--llama"
MODEL = f"{REPO}/snapshots/0123abcd"


@pytest.fixture(scope="module")
def fleet(lab_fleet) -> Fleet:
    fleet = lab_fleet(1)
    with fleet.connect("lab01") as conn:
        result = conn.run(
            f"rm -rf {REPO} && mkdir -p {MODEL}/original {REPO}/blobs && cd {MODEL} && "
            "head -c 25165824 /dev/urandom > model-00001.safetensors && "
            f"head -c 3000000 /dev/urandom > {REPO}/blobs/b2 && "
            "ln -s ../../blobs/b2 model-00002.safetensors && "
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


def test_streams_are_spread_over_several_connections(fleet: Fleet, tmp_path: Path) -> None:
    """Streams open at once go over connections of their own (one paramiko connection moves
    its packets on one thread), up to the limit; a staged copy over them is whole."""
    made: list[SSHConnection] = []

    def more() -> SSHConnection:
        made.append(cast(SSHConnection, fleet.connect("lab01")))
        return made[-1]

    first = cast(SSHConnection, fleet.connect("lab01"))
    source = SSHSource(first, MODEL, more=more, connections=2)
    with source:
        shard = f"{MODEL}/model-00001.safetensors"
        with source.streams.stream(f"cat {shard}") as a, source.streams.stream("echo b") as b:
            with source.streams.stream("echo c") as c:  # a third: on the less busy of the two
                assert source.streams.connections == 2 and len(made) == 1
                assert b.get_transport() is not a.get_transport()
                assert c.get_transport() in (a.get_transport(), b.get_transport())
                assert c.makefile("rb").read() == b"c\n" and b.makefile("rb").read() == b"b\n"
            assert len(a.makefile("rb").read()) == 25165824
            transports = [a.get_transport(), b.get_transport()]
        summary = stage_source(source, tmp_path / "dest", jobs=4)
    assert summary.copied == 4 and digests(tmp_path / "dest") == remote_digests(fleet)
    assert not any(t.is_active() for t in transports)  # both closed with the source


def test_a_further_connection_the_host_refuses_is_given_up(fleet: Fleet, tmp_path: Path) -> None:
    """A second connection that cannot be opened (here: nothing listens on its port) costs no
    file: its stream goes over the first connection, and no further one is tried."""
    tried: list[SSHConnection] = []

    def refused() -> SSHConnection:
        options = ConnectOptions(known_hosts=str(fleet.known_hosts), connect_retries=0)
        tried.append(cast(SSHConnection, fleet.connect("lab01", options, ansible_port=1)))
        return tried[-1]

    source = SSHSource(cast(SSHConnection, fleet.connect("lab01")), MODEL, refused, 4)
    with source:
        with source.streams.stream("echo a") as a, source.streams.stream("echo b") as b:
            assert b.get_transport() is a.get_transport() and len(tried) == 1
            assert b.makefile("rb").read() == b"b\n" and a.makefile("rb").read() == b"a\n"
        summary = stage_source(source, tmp_path / "dest", jobs=4)
    assert summary.copied == 4 and digests(tmp_path / "dest") == remote_digests(fleet)
    assert source.streams.connections == 1 and len(tried) == 1


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


# -- hostile sources ---------------------------------------------------------------------------


def on_host(fleet: Fleet, command: str) -> None:
    with fleet.connect("lab01") as conn:
        result = conn.run(command)
        assert result.ok, result.stderr


def make_folder(fleet: Fleet, folder: str, commands: str) -> None:
    on_host(fleet, f"rm -rf {folder} && mkdir -p {folder} && cd {folder} && {commands}")


def test_links_on_a_lab_host_are_followed_only_inside_the_model(
    fleet: Fleet, tmp_path: Path
) -> None:
    folder = "/srv/stage-links"
    make_folder(
        fleet,
        folder,
        "echo '{}' > config.json && head -c 100000 /dev/urandom > model.safetensors && "
        "ln -s config.json inside.json && ln -s /etc/shadow shadow && ln -s / root && "
        "ln -s . loop && ln -s self self && ln -s /nothing dangling && mkfifo pipe && "
        "echo hunter2 > /srv/secret && ln -s ../secret secret.json",
    )
    config, dest = ssh_config(fleet, tmp_path / "ssh_config"), tmp_path / "dest"
    proc = stage(tmp_path, f"lab01:{folder}", dest, "--ssh-config", config, "--json")
    assert proc.returncode == 0, proc.stderr
    assert sorted(digests(dest)) == ["config.json", "inside.json", "model.safetensors"]
    said = skipped(f"lab01:{folder}", proc)
    assert said.pop("shadow") == "a link to /etc/shadow, outside the model folder: skipped"
    assert said.pop("root") == "a link to /, outside the model folder: skipped"
    assert said.pop("secret.json") == "a link to /srv/secret, outside the model folder: skipped"
    assert said.pop("loop") == f"a link to a folder ({folder}), not followed: skipped"
    assert said.pop("pipe") == "a FIFO, not a regular file: skipped"
    for name, target in (("self", "self"), ("dangling", "/nothing")):
        assert said.pop(name) == f"a dangling link or a link loop (to {target}): skipped"
    assert not said


def test_a_name_that_is_not_utf8_is_one_clear_error(fleet: Fleet, tmp_path: Path) -> None:
    folder = "/srv/stage-badname"
    make_folder(fleet, folder, "echo '{}' > config.json && echo x > \"$(printf 'a\\377.json')\"")
    config, dest = ssh_config(fleet, tmp_path / "ssh_config"), tmp_path / "dest"
    proc = stage(tmp_path, f"lab01:{folder}", dest, "--ssh-config", config)
    assert proc.returncode == 2, proc.stderr
    assert f"lab01:{folder}: the listing of . has a file named b'a\\xff.json' (not UTF-8)" in (
        proc.stderr
    )
    assert "Traceback" not in proc.stderr and not dest.exists()


def test_a_file_swapped_for_a_link_after_the_listing_is_refused_on_the_host(
    fleet: Fleet, tmp_path: Path
) -> None:
    folder = "/srv/stage-swap"
    make_folder(
        fleet,
        folder,
        "head -c 67108864 /dev/urandom > model.safetensors && echo hunter2 > /srv/secret2 && "
        "echo '{}     ' > leak.json && touch -r /srv/secret2 leak.json",
    )
    config, dest = ssh_config(fleet, tmp_path / "ssh_config"), tmp_path / "dest"
    proc = start(f"lab01:{folder}", dest, "--ssh-config", config)  # stopped at 40 MiB
    on_host(fleet, f"ln -sf /srv/secret2 {folder}/leak.json")
    code, err = finish(proc)
    assert code == 2, err
    assert "leak.json: opened as /srv/secret2, outside the model folder" in err
    assert not (dest / "leak.json").exists()
    assert not any(b"hunter2" in p.read_bytes() for p in dest.rglob("*") if p.is_file())


class _HostileSFTP(paramiko.SFTPServerInterface):
    """An SFTP server whose folder ``/m`` lists the names in :attr:`names`, each a 5-byte file."""

    names: ClassVar[list[str]] = []

    def stat(self, path: str) -> paramiko.SFTPAttributes:
        attr = paramiko.SFTPAttributes()
        attr.st_mode = (stat.S_IFDIR | 0o755) if path.rstrip("/") == "/m" else stat.S_IFREG | 0o644
        attr.st_size, attr.st_mtime = 5, 1700000000
        return attr

    lstat = stat

    def canonicalize(self, path: str) -> str:
        return path

    def list_folder(self, path: str) -> list[paramiko.SFTPAttributes]:
        entries = []
        for name in [*self.names, "config.json"]:
            attr = self.stat(f"/m/{name}")
            attr.filename = name
            entries.append(attr)
        return entries


class _Server(paramiko.ServerInterface):
    """Our client's key let in; an exec channel (``cat``) answered with five bytes."""

    def __init__(self, client: paramiko.PKey):
        self.client = client

    def get_allowed_auths(self, username: str) -> str:
        return "publickey"

    def check_auth_publickey(self, username: str, key: paramiko.PKey) -> int:
        return paramiko.AUTH_SUCCESSFUL if key == self.client else paramiko.AUTH_FAILED

    def check_channel_request(self, kind: str, chanid: int) -> int:
        return paramiko.OPEN_SUCCEEDED

    def check_channel_exec_request(self, channel: paramiko.Channel, command: bytes) -> bool:
        def answer() -> None:
            channel.sendall(b"pwned")
            channel.send_exit_status(0)
            channel.close()

        threading.Thread(target=answer, daemon=True).start()
        return True


@pytest.fixture
def hostile(tmp_path: Path) -> Iterator[Path]:
    """A hostile SFTP server on 127.0.0.1 (host key known): the ssh config naming it."""
    host_key, client_key = paramiko.ECDSAKey.generate(), paramiko.ECDSAKey.generate()
    client_key.write_private_key_file(str(tmp_path / "client_key"))
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    (tmp_path / "known_hosts").write_text(
        f"[127.0.0.1]:{port} {host_key.get_name()} {host_key.get_base64()}\n"
    )
    transports: list[paramiko.Transport] = []

    def serve() -> None:
        with contextlib.suppress(OSError):
            while True:
                sock, _ = listener.accept()
                transport = paramiko.Transport(sock)
                transport.add_server_key(host_key)
                transport.set_subsystem_handler("sftp", paramiko.SFTPServer, _HostileSFTP)
                transport.start_server(server=_Server(client_key))
                transports.append(transport)

    threading.Thread(target=serve, daemon=True).start()
    config = tmp_path / "ssh_config"
    config.write_text(
        f"Host hostile\n    HostName 127.0.0.1\n    Port {port}\n    User x\n"
        f"    IdentityFile {tmp_path / 'client_key'}\n"
        f"    UserKnownHostsFile {tmp_path / 'known_hosts'}\n"
    )
    yield config
    listener.close()
    for transport in transports:
        transport.close()


@pytest.mark.parametrize(
    ("name", "said"),
    [
        ("../../x", "'../../x' (a name with a slash)"),
        ("{tmp}/x", "'{tmp}/x' (a name with a slash)"),
        ("a/b", "'a/b' (a name with a slash)"),
        ("x\0y", "'x\\x00y' (a name with a NUL byte)"),
        ("", "'' (no file's name)"),
    ],
    ids=["dot-dot", "absolute", "slash", "nul", "empty"],
)
def test_names_a_hostile_server_lists_are_refused(
    hostile: Path, tmp_path: Path, name: str, said: str
) -> None:
    _HostileSFTP.names = [name.replace("{tmp}", str(tmp_path))]
    said = said.replace("{tmp}", str(tmp_path))
    dest = tmp_path / "a" / "b" / "dest"
    proc = stage(tmp_path, "hostile:/m", dest, "--ssh-config", hostile)
    assert proc.returncode == 2, proc.stderr
    assert f"hostile:/m: the listing of . has a file named {said}: refused" in proc.stderr
    assert "Traceback" not in proc.stderr
    # Nothing written (the destination is made after the listing).
    assert sorted(p.name for p in tmp_path.rglob("*")) == [
        "client_key",
        "known_hosts",
        "ssh_config",
    ]


def test_jobs_bound_the_connections_of_the_command_line(fleet: Fleet, tmp_path: Path) -> None:
    """``fxkit stage --jobs N`` reads a remote source over at most N SSH connections (the host's
    sshd logs each one it accepts): 1 with --jobs 1, more than 1 with --jobs 4 on 4 files."""
    config = ssh_config(fleet, tmp_path / "ssh_config")

    def logins(jobs: int) -> int:
        before = fleet.sshd_log("lab01").count("Accepted publickey")
        dest = tmp_path / f"dest-{jobs}"
        proc = stage(tmp_path, f"lab01:{MODEL}", dest, "--ssh-config", config, "--jobs", jobs)
        assert proc.returncode == 0, proc.stderr
        made = fleet.sshd_log("lab01").count("Accepted publickey") - before
        assert digests(dest) == remote_digests(fleet)  # (a connection of its own)
        return made

    assert logins(1) == 1
    assert 1 < logins(4) <= 4
