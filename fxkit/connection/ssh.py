"""SSH connections (paramiko): one transport per host, a new exec channel per command.

The transport is opened once and reused for every command and file of a run; files move over
one SFTP session on the same transport, opened on first use. Host keys are verified (see
:mod:`fxkit.connection.hostkeys`). ``become`` runs the command through ``sudo``; its password
goes to sudo's stdin only when sudo asks for it, and is never part of a command line, a result
or an error message.
"""

from __future__ import annotations

import getpass
import os
import select
import shlex
import socket
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import paramiko

from fxkit.connection.base import Connection, RunResult
from fxkit.connection.become import Sudo
from fxkit.connection.hostkeys import (
    AcceptNewKey,
    RefuseUnknownKey,
    changed_key_error,
    default_known_hosts,
    known_host_name,
    load_known_hosts,
)
from fxkit.errors import ConnectionFailed, FxkitError
from fxkit.redaction import maskable, redact

if TYPE_CHECKING:
    from fxkit.connection import ConnectOptions

_CHUNK = 65536
_MISSING = 107  # exit status of the `get` command when the file does not exist
_LINK_ERRORS = (paramiko.SSHException, EOFError, OSError)


@dataclass
class SSHArgs:
    """What fxkit understands of ``ansible_ssh_common_args`` / ``ansible_ssh_extra_args``."""

    known_hosts_files: list[str] = field(default_factory=list)
    proxy_jump: str | None = None

    @classmethod
    def parse(cls, text: str) -> SSHArgs:
        args, words = cls(), shlex.split(text)
        for i, word in enumerate(words):
            value = words[i + 1] if i + 1 < len(words) else ""
            if word == "-J":
                args.proxy_jump = value
            elif word.startswith("-o"):
                option = word[2:] or value
                key, _, val = option.replace("=", " ", 1).partition(" ")
                if key.lower() == "userknownhostsfile":
                    args.known_hosts_files += val.split()
                elif key.lower() == "proxyjump":
                    args.proxy_jump = val.strip()
        return args


@dataclass(frozen=True)
class JumpHost:
    """A bastion given as ``[user@]host[:port]``."""

    host: str
    port: int
    user: str | None

    @classmethod
    def parse(cls, spec: str, where: str) -> JumpHost:
        if "," in spec:
            raise ConnectionFailed(
                f"only one jump host is supported, got {spec!r}",
                where=where,
                hint="use one bastion",
            )
        user, _, hostport = spec.rpartition("@")
        host, _, port = hostport.partition(":")
        if not host or (port and not port.isdigit()):
            raise ConnectionFailed(
                f"bad jump host {spec!r}", where=where, hint="use [user@]host[:port]"
            )
        return cls(host, int(port or 22), user or None)


def _reveal(value: Any) -> str | None:
    """A secret's text, whether it is a plain string or wrapped (pydantic SecretStr and kin)."""
    if value is None or value == "":
        return None
    reveal = getattr(value, "get_secret_value", None)
    return str(reveal() if reveal else value)


class SSHConnection(Connection):
    """A host reached over SSH with the Ansible connection variables of its inventory entry."""

    def __init__(self, name: str, hostvars: Mapping[str, Any], options: ConnectOptions):
        self.name = name
        self.options = options
        self.address = str(hostvars.get("ansible_host") or name)
        self.port = int(hostvars.get("ansible_port") or 22)
        self.user = str(hostvars.get("ansible_user") or getpass.getuser())
        key_file = hostvars.get("ansible_ssh_private_key_file")
        self.key_file = os.path.expanduser(str(key_file)) if key_file else None
        self.password = _reveal(
            hostvars.get("ansible_password") or hostvars.get("ansible_ssh_pass")
        )
        self.become_user = str(hostvars.get("ansible_become_user") or "root")
        method = hostvars.get("ansible_become_method") or "sudo"
        if method != "sudo":
            raise ConnectionFailed(
                f"become method {method!r} is not supported",
                where=f"host {name}, variable ansible_become_method",
                hint="fxkit becomes root with sudo: remove the variable or set it to sudo",
            )
        self.become_password = _reveal(
            hostvars.get("ansible_become_password")
            or hostvars.get("ansible_become_pass")
            or options.become_password
        )
        ssh_args = SSHArgs.parse(
            f"{hostvars.get('ansible_ssh_common_args') or ''} "
            f"{hostvars.get('ansible_ssh_extra_args') or ''}"
        )
        self.own_known_hosts = Path(options.known_hosts or default_known_hosts()).expanduser()
        self.known_hosts_files = [*ssh_args.known_hosts_files, str(self.own_known_hosts)]
        jump = (
            hostvars.get("ansible_ssh_proxy_jump")
            or hostvars.get("proxy_jump")
            or ssh_args.proxy_jump
        )
        self.jump = JumpHost.parse(str(jump), self._where) if jump else None
        self._secrets = maskable(s for s in (self.password, self.become_password) if s)
        self._client: paramiko.SSHClient | None = None
        self._jump_client: paramiko.SSHClient | None = None
        self._sftp: paramiko.SFTPClient | None = None
        self._lock = threading.Lock()

    @property
    def _where(self) -> str:
        return f"host {self.name} ({self.user}@{self.address}:{self.port})"

    # -- connecting ------------------------------------------------------------------------

    def open(self) -> None:
        with self._lock:
            if self._client is not None:
                return
            attempts = 1 + max(0, self.options.connect_retries)
            for attempt in range(attempts):
                try:
                    self._client = self._connect()
                    return
                except paramiko.AuthenticationException as exc:
                    raise ConnectionFailed(
                        f"login refused: {self._redact(str(exc))}",
                        where=self._where,
                        hint="check ansible_user, ansible_ssh_private_key_file or ansible_password",
                    ) from None
                except _LINK_ERRORS as exc:
                    if attempt + 1 == attempts:
                        raise ConnectionFailed(
                            f"cannot connect: {self._redact(_describe(exc))}",
                            where=self._where,
                            hint="is the host up and sshd listening? (connect timeout "
                            f"{self.options.connect_timeout:g} s, {attempts} attempts)",
                        ) from None
                    time.sleep(min(0.5 * 2**attempt, 5.0))

    def _connect(self) -> paramiko.SSHClient:
        sock = self._jump_channel() if self.jump else None
        try:
            return self._login(self.address, self.port, self.user, sock)
        except BaseException:
            self._close_jump()
            raise

    def _login(self, host: str, port: int, user: str, sock: Any = None) -> paramiko.SSHClient:
        client = paramiko.SSHClient()
        load_known_hosts(client, self.known_hosts_files)
        policy = AcceptNewKey if self.options.accept_new_host_keys else RefuseUnknownKey
        client.set_missing_host_key_policy(policy(self.own_known_hosts))
        timeout = self.options.connect_timeout
        try:
            client.connect(
                host,
                port,
                username=user,
                password=self.password,
                key_filename=self.key_file,
                look_for_keys=self.key_file is None and self.password is None,
                allow_agent=self.key_file is None,
                timeout=timeout,
                banner_timeout=timeout,
                auth_timeout=timeout,
                channel_timeout=timeout,
                sock=sock,
            )
        except paramiko.BadHostKeyException as exc:
            client.close()
            raise changed_key_error(
                known_host_name(host, port), exc, self.known_hosts_files
            ) from None
        except BaseException:
            client.close()
            raise
        transport = client.get_transport()
        transport.set_keepalive(30)
        if isinstance(transport.sock, socket.socket):
            # Small packets go out at once: without this each command waits ~40 ms (Nagle).
            transport.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return client

    def _jump_channel(self) -> paramiko.Channel:
        jump = self.jump
        self._jump_client = self._login(jump.host, jump.port, jump.user or self.user)
        return self._jump_client.get_transport().open_channel(
            "direct-tcpip",
            (self.address, self.port),
            ("127.0.0.1", 0),
            timeout=self.options.connect_timeout,
        )

    def _transport(self) -> paramiko.Transport:
        self.open()
        transport = self._client.get_transport()
        if transport is None or not transport.is_active():
            raise self._lost("the connection was closed")
        return transport

    def close(self) -> None:
        with self._lock:
            for closable in (self._sftp, self._client):
                if closable is not None:
                    closable.close()
            self._sftp = self._client = None
            self._close_jump()

    def _close_jump(self) -> None:
        if self._jump_client is not None:
            self._jump_client.close()
            self._jump_client = None

    # -- commands --------------------------------------------------------------------------

    def run(
        self,
        command: str,
        *,
        become: bool = False,
        timeout: float | None = None,
        stdin: bytes | None = None,
    ) -> RunResult:
        rc, out, err = self._exec(command, become=become, timeout=timeout, stdin=stdin)
        return RunResult(
            self._redact(command),
            rc,
            self._redact(out.decode(errors="replace")),
            self._redact(err.decode(errors="replace")),
        )

    def _needs_sudo(self, become: bool) -> bool:
        return become and self.user != self.become_user

    def _exec(
        self, command: str, *, become: bool, timeout: float | None, stdin: bytes | None
    ) -> tuple[int, bytes, bytes]:
        timeout = timeout if timeout is not None else self.options.command_timeout
        deadline = time.monotonic() + timeout if timeout else None
        transport = self._transport()
        try:
            chan = transport.open_session(timeout=self.options.connect_timeout)
        except _LINK_ERRORS as exc:
            raise self._lost(_describe(exc)) from None
        session = _Session(chan, transport, deadline)
        try:
            if self._needs_sudo(become):
                sudo = Sudo(self.become_user, self.become_password)
                chan.exec_command(sudo.command(command))
                rc = sudo.start(session)
                if rc is not None:
                    return rc, bytes(session.out), bytes(session.err)
            else:
                chan.exec_command(f"sh -c {shlex.quote(command)}")
            session.send_stdin(stdin)
            session.drain()
            return session.exit_status(), bytes(session.out), bytes(session.err)
        except _Timeout:
            message = (
                f"\nfxkit: timed out after {timeout:g} s (the command may still run on the host)"
            )
            return 124, bytes(session.out), bytes(session.err) + message.encode()
        except _LINK_ERRORS as exc:
            raise self._lost(_describe(exc)) from None
        finally:
            chan.close()

    # -- files -----------------------------------------------------------------------------

    def get(self, path: str, *, become: bool = False) -> bytes | None:
        if self._needs_sudo(become):
            quoted = shlex.quote(path)
            rc, out, err = self._exec(
                f"[ -e {quoted} ] || exit {_MISSING}; exec cat -- {quoted}",
                become=True,
                timeout=None,
                stdin=None,
            )
            if rc == _MISSING:
                return None
            if rc != 0:
                raise self._file_error("read", path, err.decode(errors="replace").strip())
            return out
        try:
            with self._sftp_client().open(path, "rb") as f:
                f.prefetch()
                return f.read()
        except FileNotFoundError:
            return None
        except _LINK_ERRORS as exc:
            raise self._sftp_error("read", path, exc) from None

    def put(self, path: str, data: bytes, *, become: bool = False) -> None:
        if self._needs_sudo(become):
            rc, _, err = self._exec(
                f"cat > {shlex.quote(path)}", become=True, timeout=None, stdin=data
            )
            if rc != 0:
                raise self._file_error("write", path, err.decode(errors="replace").strip())
            return
        try:
            with self._sftp_client().open(path, "wb") as f:
                f.set_pipelined(True)
                f.write(data)
        except _LINK_ERRORS as exc:
            raise self._sftp_error("write", path, exc) from None

    def _sftp_client(self) -> paramiko.SFTPClient:
        transport = self._transport()
        with self._lock:
            if self._sftp is None:
                try:
                    self._sftp = paramiko.SFTPClient.from_transport(transport)
                except _LINK_ERRORS as exc:
                    raise self._lost(f"cannot start SFTP: {_describe(exc)}") from None
            return self._sftp

    def _sftp_error(self, verb: str, path: str, exc: BaseException) -> FxkitError:
        transport = self._client.get_transport() if self._client else None
        if transport is None or not transport.is_active():
            return self._lost(_describe(exc))
        return self._file_error(verb, path, getattr(exc, "strerror", None) or _describe(exc))

    def _file_error(self, verb: str, path: str, reason: str) -> FxkitError:
        return FxkitError(f"cannot {verb} {path}: {self._redact(reason)}", where=self._where)

    # -- errors ----------------------------------------------------------------------------

    def _lost(self, reason: str) -> ConnectionFailed:
        return ConnectionFailed(
            f"connection lost: {self._redact(reason)}",
            where=self._where,
            hint="the host went away in the middle of the run (sshd stopped, host down, network)",
        )

    def _redact(self, text: str) -> str:
        return redact(text, self._secrets)


class _Timeout(Exception):
    """The command ran past its timeout."""


class _Session:
    """The output of one exec channel, read as it comes (stdout and stderr, never blocking
    on one while the other fills the window)."""

    def __init__(
        self, chan: paramiko.Channel, transport: paramiko.Transport, deadline: float | None
    ):
        self.chan, self.transport, self.deadline = chan, transport, deadline
        self.out, self.err = bytearray(), bytearray()

    def send(self, data: bytes) -> None:
        self.chan.sendall(data)

    def send_stdin(self, data: bytes | None) -> None:
        if data:
            self.chan.sendall(data)
        self.chan.shutdown_write()

    def pump(self) -> bool:
        """Wait for output and collect it; False when the command's output has ended."""
        while True:
            eof = self.chan.eof_received or self.chan.closed
            got = False
            if self.chan.recv_ready():
                self.out += self.chan.recv(_CHUNK)
                got = True
            if self.chan.recv_stderr_ready():
                self.err += self.chan.recv_stderr(_CHUNK)
                got = True
            if got:
                return True
            if eof:
                return False
            wait = 1.0
            if self.deadline is not None:
                wait = min(wait, self.deadline - time.monotonic())
                if wait <= 0:
                    raise _Timeout
            select.select([self.chan], [], [], wait)
            if not self.transport.is_active():
                raise EOFError("the SSH transport closed")

    def drain(self) -> None:
        while self.pump():
            pass

    def exit_status(self) -> int:
        status = self.chan.recv_exit_status()
        if status == -1 and not self.transport.is_active():
            raise EOFError("the SSH transport closed before the command ended")
        return status


def _describe(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "timed out"
    return str(exc) or type(exc).__name__
