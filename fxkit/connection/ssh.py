"""SSH connections: Fabric resolves the host and holds the paramiko client; fxkit runs channels.

Where to connect comes as OpenSSH would work it out, most specific first: the inventory's
``ansible_host``, ``ansible_user``, ``ansible_port`` and ``ansible_ssh_private_key_file``; then
the options in ``ansible_ssh_common_args``/``ansible_ssh_extra_args`` (``-o Key=value``, ``-J``,
``-i``, ``-p``, ``-l``); then the ssh config file: ``-F FILE`` there, else
:attr:`ConnectOptions.ssh_config`, else ``$FXKIT_SSH_CONFIG``, else ``~/.ssh/config`` and
``/etc/ssh/ssh_config``. The config is looked up for ``ansible_host`` (the inventory name when
there is none), as ``ssh`` does: Host aliases, HostName, User, Port, IdentityFile, ProxyJump
(any number of hops), ProxyCommand and UserKnownHostsFile apply. Fabric reads the config and
builds the chain of jump hosts; every client in it verifies host keys fxkit's way
(:mod:`fxkit.connection.hostkeys`), never Fabric's default of accepting any key.

Commands do not go through Fabric's ``run`` (45 ms a command, 3.4 ms here). Most go to the
host-side helper (:mod:`fxkit.connection.helper`), one request each on the session it was
started on; the others each open an exec channel on the one transport, with TCP_NODELAY, and
read stdout and stderr themselves. Either way fxkit knows the PID of the command's shell (the
helper says it; a channel's shell prints it first, :class:`~fxkit.connection.become.Started`):
a command that runs past its timeout, or is still running when :meth:`SSHConnection.cancel` is
called (a second Ctrl-C), is killed with its whole process group, over another channel; closing
the channel alone would leave it running. Files are read by the helper itself (a path's state,
a file's content: one request, no process), else over SFTP, and written atomically
(:mod:`fxkit.connection.atomic`).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import select
import shlex
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from io import StringIO
from pathlib import Path
from typing import TYPE_CHECKING, Any

import fabric
import paramiko

from fxkit.connection.base import (
    TIMEOUT_RC,
    Connection,
    PathStat,
    PathState,
    Running,
    Stdin,
    buffers,
    timed_out,
)
from fxkit.connection.become import Started, Sudo, become_settings, reveal
from fxkit.connection.helper import (
    MISSING,
    HelperClient,
    HelperEnded,
    bulk,
    encoded,
    failure,
    interpreter,
    look_request,
    looked,
    oversized,
    start_command,
)
from fxkit.connection.hostkeys import (
    AcceptNewKey,
    RefuseUnknownKey,
    changed_key_error,
    default_known_hosts,
    load_known_hosts,
)
from fxkit.errors import ConnectionFailed, FxkitError
from fxkit.redaction import maskable
from fxkit.varfiles import truthy

if TYPE_CHECKING:
    from fxkit.connection import ConnectOptions

_CHUNK = 65536
_LINK_ERRORS = (paramiko.SSHException, EOFError, OSError)
#: Shell words of ssh's command line that take a value, and the ssh config keyword each sets.
_FLAGS = {"-J": "ProxyJump", "-i": "IdentityFile", "-p": "Port", "-l": "User"}
#: How long a killed command may take to close its channel (its last output still comes).
_KILL_GRACE = 2.0
#: The messages on one channel, its server's id first (RFC 4254: WINDOW_ADJUST to FAILURE).
_CHANNEL_MESSAGES = range(
    paramiko.common.MSG_CHANNEL_WINDOW_ADJUST, paramiko.common.MSG_CHANNEL_FAILURE + 1
)

# paramiko logs each error of its transport thread (with its traceback) as well as raising it
# to the caller, which fxkit reports once per host; with no handler anywhere, Python's
# lastResort handler printed them all on stderr (a host that closed before its banner: two
# tracebacks per attempt). An application that configures logging still gets them.
logging.getLogger("paramiko").addHandler(logging.NullHandler())


@dataclass
class SSHArgs:
    """What fxkit understands of ``ansible_ssh_common_args`` / ``ansible_ssh_extra_args``: the
    config file (``-F``) and options as ssh config lines (``-o``, ``-J``, ``-i``, ``-p``,
    ``-l``); other words are ssh's own business and ignored."""

    config_file: str | None = None
    options: list[str] = field(default_factory=list)

    @classmethod
    def parse(cls, text: str, where: str = "") -> SSHArgs:
        try:
            words = shlex.split(text)
        except ValueError as exc:
            raise ConnectionFailed(
                f"cannot parse the ssh arguments {text!r}: {exc}",
                where=where,
                hint="check the quotes in ansible_ssh_common_args / ansible_ssh_extra_args",
            ) from None
        args, i = cls(), 0
        while i < len(words):
            flag, value = words[i][:2], words[i][2:]
            if flag in ("-o", "-F", *_FLAGS) and not value and i + 1 < len(words):
                i, value = i + 1, words[i + 1]
            if flag == "-o" and value:
                key, _, val = value.replace("=", " ", 1).partition(" ")
                args.options.append(f"{key} {val.strip()}")
            elif flag == "-F" and value:
                args.config_file = value
            elif flag in _FLAGS and value:
                args.options.append(f"{_FLAGS[flag]} {value}")
            i += 1
        return args


def parse_port(value: Any, where: str) -> int | None:
    """``ansible_port`` as a TCP port (None when not given); anything else is a clear error."""
    if value is None or value == "":
        return None
    try:
        port = int(str(value))
    except ValueError:
        port = 0
    if not 0 < port < 65536:
        raise ConnectionFailed(
            f"bad port {value!r}", where=where, hint="ansible_port must be a number, 1-65535"
        )
    return port


class SSHConnection(Connection):
    """A host reached over SSH with the Ansible connection variables of its inventory entry."""

    run_lock = True

    def __init__(self, name: str, hostvars: Mapping[str, Any], options: ConnectOptions):
        self.name = name
        self.options = options
        self.target = str(hostvars.get("ansible_host") or name)
        where = f"host {name}"
        self._port = parse_port(hostvars.get("ansible_port"), f"{where}, variable ansible_port")
        self._user = str(hostvars["ansible_user"]) if hostvars.get("ansible_user") else None
        key_file = hostvars.get("ansible_ssh_private_key_file")
        self.key_file = os.path.expanduser(str(key_file)) if key_file else None
        self.password = reveal(hostvars.get("ansible_password") or hostvars.get("ansible_ssh_pass"))
        self.become_user, self.become_password = become_settings(
            name, hostvars, options.become_password
        )
        args = SSHArgs.parse(
            f"{hostvars.get('ansible_ssh_common_args') or ''} "
            f"{hostvars.get('ansible_ssh_extra_args') or ''}",
            f"{where}, variable ansible_ssh_common_args",
        )
        jump = hostvars.get("ansible_ssh_proxy_jump") or hostvars.get("proxy_jump")
        if jump:
            args.options.append(f"ProxyJump {jump}")
        self._args = args
        self.own_known_hosts = Path(options.known_hosts or default_known_hosts()).expanduser()
        self.secrets = maskable(s for s in (self.password, self.become_password) if s)
        self._lock = threading.Lock()
        #: How to kill each command running, for cancel().
        self._running: Running[Callable[[], object]] = Running(lambda kill: kill())
        #: The host-side helpers (:mod:`fxkit.connection.helper`): the login user's, and the
        #: become user's through sudo (by whether a command needs sudo).
        wanted = truthy(hostvars.get("fxkit_host_helper", True))
        self._helpers = {False: _HelperSlot(False, wanted), True: _HelperSlot(True, wanted)}
        self.python = interpreter(hostvars.get("ansible_python_interpreter"))
        # Resolved now, so that a mistake in the config shows before any host is contacted.
        self._fabric = self._resolve()
        self.user = self._fabric.user
        self.address, self.port = self._fabric.host, self._fabric.port
        self.known_hosts_files = self._known_hosts_files(self._fabric)
        self._connected: fabric.Connection | None = None

    @property
    def _where(self) -> str:
        return f"host {self.name} ({self.user}@{self.address}:{self.port})"

    # -- resolving: inventory, ssh arguments, ssh config ------------------------------------

    def _config(self) -> fabric.Config:
        """Fabric's config with the ssh config loaded: the ssh arguments' options first (the
        first value found wins, as in ``ssh``), then the file(s)."""
        path = self._args.config_file or self.options.ssh_config
        path = path or os.environ.get("FXKIT_SSH_CONFIG") or None
        config = fabric.Config(
            lazy=True, runtime_ssh_path=os.path.expanduser(path) if path else None
        )
        where = f"host {self.name}"
        try:
            if self._args.options:
                block = "".join(f"    {line}\n" for line in self._args.options)
                config.base_ssh_config.parse(StringIO(f"Host {self.target}\n{block}"))
            config.load_ssh_config()
        except FileNotFoundError:
            raise ConnectionFailed(f"ssh config file {path} does not exist", where=where) from None
        except (OSError, paramiko.ssh_exception.ConfigParseError) as exc:
            raise ConnectionFailed(
                f"cannot read the ssh config {path or '~/.ssh/config'}: {exc}", where=where
            ) from None
        config.connect_kwargs = self._auth()
        return config

    def _auth(self) -> dict[str, Any]:
        """paramiko's connect() arguments for every hop: the inventory's key and password."""
        timeout = self.options.connect_timeout
        return {
            "password": self.password,
            "key_filename": [self.key_file] if self.key_file else [],
            "look_for_keys": self.key_file is None and self.password is None,
            "allow_agent": self.key_file is None,
            "banner_timeout": timeout,
            "auth_timeout": timeout,
            "channel_timeout": timeout,
            "transport_factory": _Transport,
        }

    def _resolve(self) -> fabric.Connection:
        """A Fabric connection (unopened) with its chain of jump hosts, checked and secured."""
        if self.key_file and not os.path.isfile(self.key_file):
            raise ConnectionFailed(
                f"the private key file {self.key_file} does not exist",
                where=f"host {self.name}, variable ansible_ssh_private_key_file",
            )
        try:
            conn = fabric.Connection(
                self.target, user=self._user, port=self._port, config=self._config()
            )
        except ValueError as exc:  # a Port in the ssh config that is not a number, user@host...
            raise ConnectionFailed(
                f"cannot resolve the host from its variables and ssh config: {exc}",
                where=f"host {self.name}",
                hint="check ansible_host/ansible_port and the ssh config's Port and ProxyJump",
            ) from None
        for hop in _chain(conn):
            parse_port(hop.port, f"host {self.name}: ssh config for {hop.original_host}, Port")
            hop.connect_timeout = self.options.connect_timeout
            kwargs = dict(hop.connect_kwargs.items())
            keys = map(os.path.expanduser, kwargs.get("key_filename") or [])
            # As ssh does, IdentityFile lines of the config that name no file are skipped.
            kwargs["key_filename"] = [k for k in dict.fromkeys(keys) if os.path.isfile(k)]
            hop.connect_kwargs = kwargs
            load_known_hosts(hop.client, self._known_hosts_files(hop))
            policy = AcceptNewKey if self.options.accept_new_host_keys else RefuseUnknownKey
            hop.client.set_missing_host_key_policy(policy(self.own_known_hosts))
        return conn

    def _known_hosts_files(self, hop: fabric.Connection) -> list[str]:
        configured = hop.ssh_config.get("userknownhostsfile", "")
        return [*(os.path.expanduser(f) for f in configured.split()), str(self.own_known_hosts)]

    # -- connecting ------------------------------------------------------------------------

    def open(self) -> None:
        with self._lock:
            if self._connected is not None:
                return
            self._running.refuse(self._where)  # cancelled: never connected again
            attempts = 1 + max(0, self.options.connect_retries)
            for attempt in range(attempts):
                conn = self._fabric if attempt == 0 else self._resolve()
                try:
                    conn.open()
                    self._tune(conn)
                    self._connected = conn
                    return
                except paramiko.BadHostKeyException as exc:
                    _close(conn)
                    raise changed_key_error(exc.hostname, exc, self.known_hosts_files) from None
                except paramiko.AuthenticationException as exc:
                    _close(conn)
                    raise ConnectionFailed(
                        f"login refused: {self.redact(str(exc))}",
                        where=self._where,
                        hint="check ansible_user, ansible_ssh_private_key_file or ansible_password",
                    ) from None
                except _LINK_ERRORS as exc:
                    _close(conn)
                    if attempt + 1 == attempts:
                        raise self._unreachable(exc, attempts) from None
                    time.sleep(min(0.5 * 2**attempt, 5.0))
                except BaseException:
                    _close(conn)
                    raise

    @staticmethod
    def _tune(conn: fabric.Connection) -> None:
        conn.transport.set_keepalive(30)
        for hop in _chain(conn):
            sock = hop.transport.sock if hop.transport else None
            if isinstance(sock, socket.socket):
                # Small packets go out at once: without this each command waits ~40 ms (Nagle).
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def _opened(self) -> fabric.Connection:
        """The open connection (opened now if need be) whose transport is alive."""
        self.open()
        conn = self._connected
        if conn is None or conn.transport is None or not conn.transport.is_active():
            raise self._lost("the connection was closed")
        return conn

    def _transport(self) -> paramiko.Transport:
        return self._opened().transport

    def close(self) -> None:
        for slot in self._helpers.values():
            slot.stop()
        with self._lock:
            if self._connected is not None:
                _close(self._connected)
                self._connected = None

    def cancel(self) -> None:
        try:
            self._running.cancel()
        finally:
            self.close()

    # -- commands --------------------------------------------------------------------------

    def execute(
        self, command: str, *, become: bool, timeout: float | None, stdin: Stdin
    ) -> tuple[int, bytes, bytes]:
        slot = self._helpers[self.needs_sudo(become)]
        stdin, bulky = bulk(stdin)
        if slot.wanted and not bulky and slot.lock.acquire(blocking=False):  # busy: not this
            try:
                helper = self._started_helper(slot)
                if helper is not None:
                    return self._helper_exec(slot, helper, command, timeout, stdin)
            finally:
                slot.lock.release()
        return self._exec(command, become=become, timeout=timeout, stdin=stdin)

    # -- the host-side helpers -----------------------------------------------------------

    def _started_helper(self, slot: _HelperSlot) -> HelperClient | None:
        """The slot's helper (started now on first use, through sudo for the become user's);
        None where it cannot run (no interpreter, sudo refused): plain commands then."""
        if slot.client is not None:
            return slot.client
        self._running.refuse(self._where)
        transport = self._transport()
        starter: Started = Sudo(self.become_user, self.become_password) if slot.sudo else Started()
        try:
            chan = transport.open_session(timeout=self.options.connect_timeout)
            session = _Session(chan, transport, time.monotonic() + self.options.connect_timeout)
            chan.exec_command(starter.command(start_command(self.python)))
            if starter.start(session) is not None:
                raise HelperEnded("it did not start")
            helper = HelperClient(session)
        except (HelperEnded, _Timeout):
            chan.close()
            slot.wanted = False
            return None
        except _LINK_ERRORS as exc:
            raise self._lost(_describe(exc)) from None
        session.deadline = None
        slot.client, slot.session = helper, session
        return helper

    def _ask(self, become: bool, kind: bytes, payload: bytes) -> tuple[bytes, bytes] | None:
        """A request the host-side helper answers itself (:meth:`HelperClient.ask`); None
        where no helper can: not wanted, unable to start, busy with another thread's command,
        or ended during it (the read is then made another way)."""
        slot = self._helpers[self.needs_sudo(become)]
        if not slot.wanted or not slot.lock.acquire(blocking=False):
            return None
        try:
            helper, session = self._started_helper(slot), slot.session
            if helper is None or session is None:
                return None
            session.deadline = None  # as an SFTP read: no timeout
            with self._running.recorded(functools.partial(slot.stop, True)):
                return helper.ask(kind, payload)
        except HelperEnded:
            slot.stop(for_good=True)
            self._running.refuse(self._where)
            self._transport()  # ConnectionFailed when the link went with it
            return None
        except _LINK_ERRORS as exc:
            raise self._lost(_describe(exc)) from None
        except BaseException:  # a Ctrl-C mid-request: its answer must not be the next one's
            slot.stop()
            raise
        finally:
            slot.lock.release()

    def _helper_exec(
        self,
        slot: _HelperSlot,
        helper: HelperClient,
        command: str,
        timeout: float | None,
        stdin: Stdin,
    ) -> tuple[int, bytes, bytes]:
        """Run ``command`` through the helper; past ``timeout`` it is killed as
        :meth:`_helped_timeout` says."""
        timeout = timeout if timeout is not None else self.options.command_timeout
        session = slot.session
        assert session is not None
        session.deadline = time.monotonic() + timeout if timeout else None
        try:
            with self._running.recorded(functools.partial(self._cancel_helped, slot, helper)):
                helper.send(command, stdin)
                answer = helper.answer()
                assert answer is not None
                return answer
        except _Timeout:
            return self._helped_timeout(slot, helper, session, timeout or 0)
        except HelperEnded as exc:
            slot.stop(for_good=True)
            self._running.refuse(self._where)
            if not session.transport.is_active():
                raise self._lost("the SSH transport closed") from None
            reason = self.redact(str(exc)) or "no reason given"
            err = f"fxkit: the host-side helper ended during the command: {reason}\n"
            return 255, b"", err.encode()
        except _LINK_ERRORS as exc:
            raise self._lost(_describe(exc)) from None
        except BaseException:  # a Ctrl-C: the helper hangs the command up as its session ends
            slot.stop()
            raise

    def _helped_timeout(
        self, slot: _HelperSlot, helper: HelperClient, session: _Session, timeout: float
    ) -> tuple[int, bytes, bytes]:
        """A command of the helper's past its timeout: its process group is killed over another
        session (the helper may be busy feeding it its stdin) and what it wrote comes back. A
        helper that does not answer then, or whose frames were cut, is stopped."""
        answer, killed = None, False
        with contextlib.suppress(_Timeout, HelperEnded, *_LINK_ERRORS):
            while (answer := helper.answer(wait=False)) is None and session.pump():
                pass  # what has arrived (past the deadline nothing is waited for)
        if answer is None and helper.child is not None:
            killed = self._kill_helped(slot, helper.pid, helper.child)
            session.deadline = time.monotonic() + _KILL_GRACE
            with contextlib.suppress(_Timeout, HelperEnded, *_LINK_ERRORS):
                answer = helper.answer()
        if answer is None or not helper.sent:
            slot.stop()
        if answer is None:
            return TIMEOUT_RC, b"", timed_out(timeout, killed)
        _, out, err = answer
        return (TIMEOUT_RC, out, err + timed_out(timeout, True)) if killed else answer

    def _cancel_helped(self, slot: _HelperSlot, helper: HelperClient) -> None:
        """A cancel: kill the command the helper runs, and stop the helper."""
        if helper.child is not None:
            self._kill_helped(slot, helper.pid, helper.child)
        slot.stop(for_good=True)

    def _kill_helped(self, slot: _HelperSlot, helper: int, pid: int) -> bool:
        """Kill the process group of ``pid``, the shell the helper ``helper`` started for a
        command, if it still is (a PID can be reused: its parent is the helper until the helper
        ends); True once the command no longer runs."""
        return self._kill_script(
            f"read -r s < /proc/{pid}/stat || exit 0; "
            f'set -- ${{s##*") "}}; [ "$2" = {helper} ] && kill -s KILL -- -{pid}',
            become=slot.sudo,
        )

    def _exec(
        self,
        command: str,
        *,
        become: bool,
        timeout: float | None,
        stdin: Stdin,
        kill: bool = True,
    ) -> tuple[int, bytes, bytes]:
        timeout = timeout if timeout is not None else self.options.command_timeout
        deadline = time.monotonic() + timeout if timeout else None
        if kill:  # not the kill of another command
            self._running.refuse(self._where)
        transport = self._transport()
        try:
            chan = transport.open_session(timeout=self.options.connect_timeout)
        except _LINK_ERRORS as exc:
            raise self._lost(_describe(exc)) from None
        session = _Session(chan, transport, deadline)
        # Its shell's PID, to kill it on a timeout or cancel().
        starter: Started = (
            Sudo(self.become_user, self.become_password) if self.needs_sudo(become) else Started()
        )
        try:
            chan.exec_command(starter.command(command))
            rc = starter.start(session)
            if rc is not None:
                return rc, bytes(session.out), bytes(session.err)
            assert starter.pid is not None
            stop = functools.partial(self._kill, starter.pid, starter.marker, become)
            with self._running.recorded(stop) if kill else contextlib.nullcontext():
                session.send_stdin(stdin)
                session.drain()
                return session.exit_status(), bytes(session.out), bytes(session.err)
        except _Timeout:
            pid = starter.pid
            killed = kill and pid is not None and self._kill(pid, starter.marker, become)
            if killed:
                session.deadline = time.monotonic() + _KILL_GRACE
                try:
                    session.drain()  # the output it wrote before it was killed
                except (_Timeout, *_LINK_ERRORS):
                    pass
            return (
                TIMEOUT_RC,
                bytes(session.out),
                bytes(session.err) + timed_out(timeout or 0, killed),
            )
        except _LINK_ERRORS as exc:
            raise self._lost(_describe(exc)) from None
        finally:
            chan.close()

    def hold(self, command: str, *, become: bool) -> _Held:
        transport = self._transport()
        try:
            chan = transport.open_session(timeout=self.options.connect_timeout)
            session = _Session(chan, transport, None)
            if self.needs_sudo(become):
                sudo = Sudo(self.become_user, self.become_password)
                chan.exec_command(sudo.command(command))
                sudo.start(session)  # an exit status: it ended, its output says why
            else:
                chan.exec_command(f"sh -c {shlex.quote(command)}")
        except _LINK_ERRORS as exc:
            raise self._lost(_describe(exc)) from None
        return _Held(self, session)

    def _kill(self, pid: int, marker: str, become: bool) -> bool:
        """Kill the process group of the command's shell ``pid`` (over another channel), if that
        process is still the command's (its command line holds ``marker``: a PID can be
        reused); True once the command no longer runs."""
        return self._kill_script(
            f"read -r s < /proc/{pid}/stat || exit 0; grep -qF {marker} /proc/{pid}/cmdline || "
            'exit 0; set -- ${s##*") "}; [ "$3" -gt 1 ] && kill -s KILL -- "-$3"',
            become,
        )

    def _kill_script(self, script: str, become: bool) -> bool:
        """Run a kill ``script`` in a session of its own; True when it succeeded."""
        try:
            rc, _, _ = self._exec(
                script, become=become, timeout=_KILL_GRACE, stdin=None, kill=False
            )
        except ConnectionFailed:
            return False
        return rc == 0

    # -- files -----------------------------------------------------------------------------

    def get(self, path: str, *, become: bool = False) -> bytes | None:
        """Read by the host-side helper where it runs (up to 64 MiB), else over SFTP (through
        sudo: ``cat``)."""
        answer = self._ask(become, b"g", encoded(path))
        if answer is not None and not oversized(answer):
            return self._answered("read", path, answer)
        if self.needs_sudo(become):
            return self.read_as_root(path)
        conn = self._opened()
        try:
            with conn.sftp().open(path, "rb") as f:
                f.prefetch()
                return f.read()
        except FileNotFoundError:
            return None
        except _LINK_ERRORS as exc:
            raise self._sftp_error(conn, "read", path, exc) from None

    def stat(self, path: str, *, become: bool = False, follow: bool = False) -> PathStat | None:
        """By the host-side helper where it runs, else over the SFTP session :meth:`get` reads
        through: no process on the host either way."""
        answer = self._ask(become, b"l", look_request(path, follow, -1, names=False))
        if answer is not None:
            found = self._answered("stat", path, answer)
            return None if found is None else looked(found).stat
        if self.needs_sudo(become):
            raise NotImplementedError("SFTP runs as the login user, not the become user")
        conn = self._opened()
        try:
            sftp = conn.sftp()
            attrs = sftp.stat(path) if follow else sftp.lstat(path)
        except FileNotFoundError:
            return None
        except _LINK_ERRORS as exc:
            raise self._sftp_error(conn, "stat", path, exc) from None
        return PathStat(
            attrs.st_mode or 0,
            attrs.st_uid or 0,
            attrs.st_gid or 0,
            attrs.st_size or 0,
            attrs.st_mtime or 0,
        )

    def inspect(self, path: str, *, become: bool = False, hash_limit: int) -> PathState | None:
        """One request to the host-side helper; NotImplementedError where none runs."""
        answer = self._ask(become, b"l", look_request(path, False, hash_limit))
        if answer is None:
            raise NotImplementedError("no host-side helper runs on this host")
        found = self._answered("stat", path, answer)
        return None if found is None else looked(found)

    def _answered(self, verb: str, path: str, answer: tuple[bytes, bytes]) -> bytes | None:
        """The payload of the helper's answer about ``path``: None when the path does not
        exist; a file error when it cannot be read."""
        kind, payload = answer
        if kind != b"o":
            return payload
        number, reason = failure(payload)
        if number in MISSING:
            return None
        raise self.file_error(verb, path, reason)

    def sftp(self) -> paramiko.SFTPClient:
        """A new SFTP session on the connection (one per thread: each has its own channel)."""
        try:
            client = paramiko.SFTPClient.from_transport(self._transport())
        except _LINK_ERRORS as exc:
            raise self._lost(_describe(exc)) from None
        if client is None:
            raise self._lost("the SFTP subsystem did not start")
        return client

    def stream(self, command: str, window: int = 16 << 20) -> paramiko.Channel:
        """An exec channel running ``command`` (values quoted by the caller), its output read
        as it comes with ``recv`` (a file streamed with ``cat``: three times the rate of SFTP
        reads through paramiko here); the caller closes it."""
        try:
            chan = self._transport().open_session(
                window_size=window, timeout=self.options.connect_timeout
            )
            chan.exec_command(f"sh -c {shlex.quote(command)}")
        except _LINK_ERRORS as exc:
            raise self._lost(_describe(exc)) from None
        return chan

    # -- errors ----------------------------------------------------------------------------

    def _unreachable(self, exc: BaseException, attempts: int) -> ConnectionFailed:
        tried = f"(connect timeout {self.options.connect_timeout:g} s, {attempts} attempts)"
        if _closed_before_banner(exc):
            return ConnectionFailed(
                "closed the connection before the SSH banner",
                where=self._where,
                hint="is it sshd that listens on that port (ansible_port)? sshd drops "
                "connections it will not serve (MaxStartups, TCP wrappers, fail2ban): "
                f"see the host's sshd log {tried}",
            )
        return ConnectionFailed(
            f"cannot connect: {self.redact(_describe(exc))}",
            where=self._where,
            hint=f"is the host up and sshd listening? {tried}",
        )

    def _sftp_error(self, conn: Any, verb: str, path: str, exc: Exception) -> FxkitError:
        """An SFTP call's failure: the link lost, or the file's own error."""
        if not conn.transport.is_active():
            return self._lost(_describe(exc))
        return self.file_error(verb, path, getattr(exc, "strerror", None) or _describe(exc))

    def _lost(self, reason: str) -> ConnectionFailed:
        return ConnectionFailed(
            f"connection lost: {self.redact(reason)}",
            where=self._where,
            hint="the host went away in the middle of the run (sshd stopped, host down, network)",
        )


class _HelperSlot:
    """One host-side helper of a connection (the login user's, or the become user's through
    sudo): its client and session once started, and the lock its command holds."""

    def __init__(self, sudo: bool, wanted: bool) -> None:
        self.sudo = sudo
        #: False once it cannot run here (no interpreter, sudo refused, it died).
        self.wanted = wanted
        self.client: HelperClient | None = None
        self.session: _Session | None = None
        self.lock = threading.Lock()

    def stop(self, for_good: bool = False) -> None:
        """Close its session: the helper hangs up the command it runs and exits. The next
        command starts another, or, ``for_good``, runs in a session of its own."""
        session, self.session, self.client = self.session, None, None
        if for_good:
            self.wanted = False
        if session is not None:
            session.chan.close()


class _Transport(paramiko.Transport):
    """paramiko's transport with AES-GCM preferred: one pass over each packet instead of AES-CTR
    and then HMAC-SHA256 (0.18 instead of 0.32 CPU seconds per 100 MB sent, measured here); and
    nothing sent on a channel after its CLOSE (:meth:`_send_message`)."""

    _preferred_ciphers = tuple(
        sorted(
            paramiko.Transport._preferred_ciphers,  # type: ignore[attr-defined]  # not in the stubs
            key=lambda name: "-gcm@" not in name,
        )
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: The server's ids of the channels whose CLOSE went out (until it gives one out again).
        self._closed: set[int] = set()

    def _send_message(self, data: paramiko.Message) -> None:
        """Channel messages come here one at a time, in the order they go out, but paramiko makes
        them earlier, under the channel's own lock: one made just before the channel's CLOSE may
        go out after it (the EOF of a command's stdin, made as the command ends; paramiko#1115),
        and OpenSSH then drops the whole connection ("ieof packet referred to nonexistent
        channel"). Such a message is dropped: the channel is closed at both ends."""
        with data.packet.getbuffer() as raw:
            kind, channel = raw[0], int.from_bytes(raw[1:5], "big")
        if kind in _CHANNEL_MESSAGES:
            if channel in self._closed:
                return
            if kind == paramiko.common.MSG_CHANNEL_CLOSE:
                self._closed.add(channel)
        super()._send_message(data)  # type: ignore[misc]  # not in the stubs

    def _parse_channel_open_success(self, m: paramiko.Message) -> None:
        with m.packet.getbuffer() as raw:  # our id, then the server's: in use again
            self._closed.discard(int.from_bytes(raw[4:8], "big"))
        super()._parse_channel_open_success(m)  # type: ignore[misc]  # not in the stubs


def _chain(conn: fabric.Connection) -> Iterator[fabric.Connection]:
    """The connection and its jump hosts, nearest the target first (a ProxyCommand ends it)."""
    hop: Any = conn
    while isinstance(hop, fabric.Connection):
        yield hop
        hop = hop.gateway


def _close(conn: fabric.Connection) -> None:
    for hop in _chain(conn):
        hop.close()


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

    def send_stdin(self, stdin: Stdin) -> None:
        """Send ``stdin`` and close the command's stdin, in linear time: paramiko's sendall
        copies the rest of a bytes object for every 32 KiB packet; a memoryview slices free."""
        for view in buffers(stdin):
            if not self.write(view):
                return  # the command ended before reading it all: its exit status says why
        self.chan.settimeout(None)
        self.chan.shutdown_write()

    def write(self, view: memoryview) -> bool:
        """Send all of ``view``; False when the command ended before reading it."""
        while view:
            left = None if self.deadline is None else self.deadline - time.monotonic()
            if left is not None and left <= 0:
                raise _Timeout
            self.chan.settimeout(left)  # None: the last command's timeout no longer holds
            try:
                view = view[self.chan.send(view) :]  # type: ignore[arg-type]  # any buffer
            except TimeoutError:
                raise _Timeout from None
            except OSError:
                if self.transport.is_active() and self.chan.exit_status_ready():
                    return False
                raise
        return True

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
        if status == -1:
            if not self.transport.is_active():
                raise EOFError("the SSH transport closed before the command ended")
            return 255  # killed by a signal that paramiko does not decode (as ssh reports it)
        return status


class _Held:
    """A command held open on its own channel (:meth:`SSHConnection.hold`)."""

    def __init__(self, conn: SSHConnection, session: _Session):
        self.conn, self.session = conn, session

    def readline(self) -> str | None:
        out = self.session.out
        try:
            while b"\n" not in out:
                if not self.session.pump():
                    return None
        except _LINK_ERRORS as exc:
            raise self.conn._lost(_describe(exc)) from None
        line, _, rest = bytes(out).partition(b"\n")
        out[:] = rest
        return self.conn.redact(line.decode(errors="replace"))

    def stderr(self) -> str:
        return self.conn.redact(self.session.err.decode(errors="replace"))

    def ended(self) -> bool:
        chan = self.session.chan
        return chan.closed or chan.exit_status_ready() or not self.session.transport.is_active()

    def release(self) -> None:
        chan = self.session.chan
        try:
            chan.shutdown_write()
            self.session.deadline = time.monotonic() + _KILL_GRACE
            self.session.drain()
        except (_Timeout, *_LINK_ERRORS):
            pass  # it will see its stdin end when the connection closes
        finally:
            chan.close()


def _closed_before_banner(exc: BaseException) -> bool:
    """Whether ``exc`` is paramiko's failure to read the server's banner because the server
    closed (or reset) the connection: its cause was an end of file, not a timeout."""
    return (
        isinstance(exc, paramiko.SSHException)
        and str(exc).startswith("Error reading SSH protocol banner")
        and isinstance(exc.__context__, EOFError | ConnectionError)
    )


def _describe(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "timed out"
    return str(exc) or type(exc).__name__
