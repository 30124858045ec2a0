"""The SSH transport against real sshd (lab hosts): commands, files, host keys, become, failures."""

from __future__ import annotations

import hashlib
import re
import shlex
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import paramiko
import pytest
from sync_helpers import SAFETY, Meeting, run_past_timeout, when

from fxkit.connection import ConnectOptions, connect
from fxkit.connection.base import TIMEOUT_RC
from fxkit.connection.ssh import SSHArgs, SSHConnection
from fxkit.errors import ConnectionFailed, FxkitError, HostKeyError
from fxkit.lab import SUDO_USER
from fxkit.redaction import REDACTED

pytestmark = pytest.mark.lab


@pytest.fixture(autouse=True)
def no_personal_known_hosts(tmp_path, monkeypatch):
    """Keep the user's own ~/.ssh/known_hosts and fxkit's default file out of these tests."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("FXKIT_KNOWN_HOSTS", str(tmp_path / "fxkit_known_hosts"))
    monkeypatch.delenv("FXKIT_SSH_CONFIG", raising=False)


def _logins(fleet, name: str) -> int:
    return fleet.sshd_log(name).count("Accepted publickey")


def test_run_get_put_over_one_transport(lab_fleet):
    fleet = lab_fleet(1)
    before = _logins(fleet, "lab01")
    with connect("lab01", fleet.hostvars("lab01"), ConnectOptions()) as conn:
        assert isinstance(conn, SSHConnection)
        result = conn.run("echo out; echo err >&2; exit 3")
        assert (result.rc, result.stdout, result.stderr) == (3, "out\n", "err\n")
        assert conn.run("cat", stdin=b"through stdin").stdout == "through stdin"
        payload = bytes(range(256)) * 8192  # 2 MiB, every byte value
        conn.put("/srv/blob", payload)
        assert conn.get("/srv/blob") == payload
        assert (
            conn.run("sha256sum /srv/blob").stdout.split()[0] == hashlib.sha256(payload).hexdigest()
        )
        assert conn.get("/srv/missing") is None
        for i in range(20):
            assert conn.run(f"echo {i}").stdout == f"{i}\n"
        with pytest.raises(FxkitError, match="cannot write /nonexistent/dir/file"):
            conn.put("/nonexistent/dir/file", b"x")
    assert _logins(fleet, "lab01") == before + 1  # one SSH connection for all of the above


def test_command_overhead_is_small(lab_fleet):
    fleet = lab_fleet(1)
    with fleet.connect("lab01") as conn:
        conn.run("true")
        fastest = min(_timed(conn.run, "true") for _ in range(50))
    # ~3 ms here; 40+ ms would mean Nagle's algorithm holds small packets back (TCP_NODELAY):
    # every command, the fastest of 50 too (a loaded machine slows some of them, not all).
    assert fastest < 0.03, f"{fastest * 1000:.1f} ms for the fastest command"


def _timed(call, *args) -> float:
    started = time.perf_counter()
    call(*args)
    return time.perf_counter() - started


def test_command_timeout(lab_fleet):
    fleet = lab_fleet(1)
    with fleet.connect("lab01") as conn:
        meeting = Meeting(conn)
        result = run_past_timeout(conn, f"echo started; {meeting.reach}; sleep 300", meeting, 0.5)
        assert result.rc == 124 and result.stdout == "started\n"
        assert "timed out after 0.5 s" in result.stderr
        assert conn.run("echo still usable").ok


def test_an_eof_made_as_the_command_ends_never_follows_the_channels_close(lab_fleet, monkeypatch):
    """paramiko makes a message under the channel's lock and sends it after: the EOF of a
    command's stdin, made as the command ends, could go out after the channel's CLOSE, and OpenSSH
    then drops the whole connection ("ieof packet referred to nonexistent channel"). Here every
    EOF waits until its channel has closed (the worst order), at a fixed point."""
    send = paramiko.Transport._send_user_message

    def eof_after_close(transport, data):
        raw = data.asbytes()
        if (
            raw[0] == paramiko.common.MSG_CHANNEL_EOF
            and threading.current_thread() is not transport  # not its own, with its CLOSE
        ):
            remote = int.from_bytes(raw[1:5], "big")
            [chan] = [c for c in transport._channels.values() if c.remote_chanid == remote]
            when(lambda: chan.closed, "the command ended and its channel closed")
        send(transport, data)

    fleet = lab_fleet(1)
    with fleet.connect("lab01") as conn:
        monkeypatch.setattr(paramiko.Transport, "_send_user_message", eof_after_close)
        for _ in range(3):
            assert conn.run("echo done").stdout == "done\n"  # ends without reading its stdin


# -- host keys --------------------------------------------------------------------------------


def _without_lab_known_hosts(fleet, name: str) -> dict:
    hostvars = fleet.hostvars(name)
    del hostvars["ansible_ssh_common_args"]  # the lab's known_hosts file
    return hostvars


def test_unknown_host_key_is_refused(lab_fleet, tmp_path):
    fleet = lab_fleet(1)
    own = tmp_path / "own_known_hosts"
    conn = SSHConnection(
        "lab01", _without_lab_known_hosts(fleet, "lab01"), ConnectOptions(known_hosts=str(own))
    )
    with pytest.raises(HostKeyError, match="unknown ssh-ed25519 host key SHA256:") as info:
        conn.open()
    assert "ssh-keyscan" in info.value.hint and "--accept-new-host-keys" in info.value.hint
    assert not own.exists()


def test_new_host_keys_are_accepted_with_the_option_and_recorded(lab_fleet, tmp_path):
    fleet = lab_fleet(4)
    own = tmp_path / "own_known_hosts"
    accept = ConnectOptions(known_hosts=str(own), accept_new_host_keys=True)
    names = ["lab01", "lab02", "lab03", "lab04"]
    errors = []

    def first_contact(name: str) -> None:
        try:
            with SSHConnection(name, _without_lab_known_hosts(fleet, name), accept) as conn:
                conn.run("true")
        except Exception as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=first_contact, args=(n,)) for n in names]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    recorded = sorted(own.read_text().splitlines())
    expected = sorted(line.strip() for line in fleet.known_hosts.read_text().splitlines())
    assert recorded == expected  # every host's real key, one whole line each
    # Known now: the next run connects without the option.
    strict = ConnectOptions(known_hosts=str(own))
    with SSHConnection("lab02", _without_lab_known_hosts(fleet, "lab02"), strict) as conn:
        assert conn.run("hostname").stdout.strip() == "lab02"


@pytest.mark.parametrize("accept_new", [False, True])
def test_a_changed_host_key_is_always_refused(lab_fleet, tmp_path, accept_new):
    fleet = lab_fleet(2)
    # lab01's address recorded with lab02's key: what a man in the middle looks like.
    lab02_key = fleet.known_hosts.read_text().splitlines()[1].split(" ", 1)[1]
    own = tmp_path / "own_known_hosts"
    own.write_text(f"{fleet.address('lab01')} {lab02_key}\n")
    options = ConnectOptions(known_hosts=str(own), accept_new_host_keys=accept_new)
    conn = SSHConnection("lab01", _without_lab_known_hosts(fleet, "lab01"), options)
    with pytest.raises(HostKeyError, match="CHANGED") as info:
        conn.open()
    assert str(own) in info.value.hint
    assert own.read_text() == f"{fleet.address('lab01')} {lab02_key}\n"  # nothing recorded


def test_known_hosts_files_are_parsed_once_while_unchanged(lab_fleet, tmp_path, monkeypatch):
    """A fleet's connections share the parsed known_hosts (parsed per connection, a file with a
    line per host costs N² lines); a file that changes is read again."""
    fleet = lab_fleet(2)
    own = tmp_path / "own_known_hosts"
    own.write_text(fleet.known_hosts.read_text())
    loads = []
    real_load = paramiko.HostKeys.load
    monkeypatch.setattr(
        paramiko.HostKeys, "load", lambda keys, path: (loads.append(path), real_load(keys, path))
    )
    options = ConnectOptions(known_hosts=str(own))
    for name in ("lab01", "lab02", "lab01"):
        with SSHConnection(name, _without_lab_known_hosts(fleet, name), options) as conn:
            assert conn.run("hostname").stdout.strip() == name
    assert loads.count(str(own)) == 1, loads
    # lab02's line removed: the file is read again, and lab02 is unknown now.
    own.write_text(fleet.known_hosts.read_text().splitlines()[0] + "\n")
    with pytest.raises(HostKeyError, match="unknown ssh-ed25519 host key"):
        SSHConnection("lab02", _without_lab_known_hosts(fleet, "lab02"), options).open()
    assert loads.count(str(own)) == 2, loads


# -- unreachable hosts ------------------------------------------------------------------------


def test_a_stopped_host_fails_quickly(lab_fleet):
    fleet = lab_fleet(2, name="stoppable")
    fleet.stop("lab02")
    options = ConnectOptions(
        known_hosts=str(fleet.known_hosts), connect_timeout=2, connect_retries=1
    )
    started = time.monotonic()
    with pytest.raises(ConnectionFailed, match="cannot connect") as info:
        fleet.connect("lab02", options).open()
    # Refused at once; at worst two connect timeouts and the pause between them (4.5 s): far
    # from the default's 3 x 10 s.
    assert time.monotonic() - started < 15
    assert "lab02" in info.value.where
    fleet.up(2)  # restarted for later tests


def test_connection_setup_is_retried_with_backoff_but_commands_are_not(lab_fleet):
    fleet = lab_fleet(2, name="stoppable")
    with fleet.connect("lab01") as conn:
        result = conn.run("echo ran >> /tmp/runs; exit 1")
        assert result.rc == 1
        assert conn.run("cat /tmp/runs").stdout == "ran\n"  # a failed command ran once
    fleet.stop("lab02")
    options = ConnectOptions(known_hosts=str(fleet.known_hosts), connect_retries=2)
    started = time.monotonic()
    with pytest.raises(ConnectionFailed, match="3 attempts"):
        fleet.connect("lab02", options).open()
    assert time.monotonic() - started >= 0.5 + 1.0  # waited between the attempts
    fleet.up(2)


def test_a_host_lost_in_the_middle_raises_connection_failed(lab_fleet):
    fleet = lab_fleet(2, name="stoppable")
    conn = fleet.connect("lab02")
    conn.open()
    meeting = Meeting(conn)
    outcome: list[BaseException] = []

    def long_command() -> None:
        try:
            conn.run(f"{meeting.reach}; sleep 300")
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=long_command)
    thread.start()
    meeting.wait()  # the command runs on the host
    fleet.stop("lab02")
    thread.join(SAFETY)
    assert not thread.is_alive()
    assert outcome and isinstance(outcome[0], ConnectionFailed), outcome
    with pytest.raises(ConnectionFailed):
        conn.run("true")
    conn.close()
    fleet.up(2)


def test_a_jump_host_carries_the_connection(lab_fleet, tmp_path):
    # A lab host reaches nothing but its own network namespace (docs/lab.md): lab01 is the jump
    # host (an alias of the ssh config) and the target, two logins on it, the second through a
    # channel of the first.
    fleet = lab_fleet(1)
    before = _logins(fleet, "lab01")
    config = tmp_path / "config"
    config.write_text(_host_block(fleet, "bastion", "lab01"))
    args = f"-F {config} -o UserKnownHostsFile={fleet.known_hosts} -o ProxyJump=bastion"
    with fleet.connect("lab01", ansible_ssh_common_args=args) as conn:
        assert conn.run("hostname").stdout.strip() == "lab01"
        conn.put("/tmp/via-bastion", b"ok")
        assert conn.get("/tmp/via-bastion") == b"ok"
    assert _logins(fleet, "lab01") == before + 2


# -- become and secrets -----------------------------------------------------------------------


@pytest.fixture
def sudo_fleet(lab_fleet):
    fleet = lab_fleet(1)
    if fleet.become_password() is None:
        pytest.skip("sudo is not installed: lab hosts have no non-root user (apt-get install sudo)")
    return fleet


def test_become_with_a_password_that_never_shows(sudo_fleet):
    fleet, password = sudo_fleet, sudo_fleet.become_password()
    with fleet.connect("lab01", ansible_user=SUDO_USER, ansible_become_password=password) as conn:
        seen = []
        assert conn.run("id -un").stdout == f"{SUDO_USER}\n"
        # One-letter files would match an unquoted sudo prompt "[fxkit-sudo-...]" as a glob.
        assert conn.run("touch f x k i t s u d o").ok
        seen.append(conn.run("id -un", become=True))
        assert seen[-1].stdout == "root\n", seen[-1]
        # The password went to sudo, not to the command's stdin.
        seen.append(conn.run("cat", become=True, stdin=b"only this"))
        assert seen[-1].stdout == "only this"
        seen.append(conn.run("cat", become=True))
        assert seen[-1].stdout == ""
        conn.put("/root/secret-file", b"root's\n", become=True)
        assert conn.get("/root/secret-file", become=True) == b"root's\n"
        assert conn.get("/root/missing", become=True) is None
        assert conn.run("cat /root/secret-file").rc != 0  # really root's
        # Not on the host's process list either (sudo -S reads it from stdin).
        seen.append(conn.run("ps -eo args", become=True))
        # Whatever echoes the password comes back redacted.
        seen.append(conn.run(f"echo {shlex.quote(password)}; echo {shlex.quote(password)} >&2"))
        assert seen[-1].stdout == f"{REDACTED}\n" and seen[-1].stderr == f"{REDACTED}\n"
    for result in seen:
        assert password not in f"{result.command} {result.stdout} {result.stderr}"


def test_a_wrong_become_password_fails_without_showing_it(sudo_fleet):
    fleet, wrong = sudo_fleet, "not-the-password-4711"
    with fleet.connect("lab01", ansible_user=SUDO_USER, ansible_become_password=wrong) as conn:
        result = conn.run("id -u", become=True, timeout=30)
        assert result.rc != 0 and "become password was refused" in result.stderr
        assert wrong not in result.stdout + result.stderr
        with pytest.raises(FxkitError) as info:
            conn.put("/root/x", b"x", become=True)
        assert wrong not in str(info.value)


def test_become_without_a_password_says_sudo_needs_one(sudo_fleet):
    with sudo_fleet.connect("lab01", ansible_user=SUDO_USER) as conn:
        result = conn.run("id -u", become=True, timeout=30)
        assert result.rc != 0 and "password is required" in result.stderr


# -- quoting ----------------------------------------------------------------------------------

NASTY = [
    "; rm -rf /tmp/x",
    "'; touch /tmp/pwned; '",
    '"; touch /tmp/pwned; "',
    "$(touch /tmp/pwned)",
    "`touch /tmp/pwned`",
    "line\nrm -rf /tmp/x\n",
    "a\\'b\"c $HOME && touch /tmp/pwned || touch /tmp/pwned",
    "-n",
]


@pytest.mark.parametrize("become", [False, True])
def test_shell_metacharacters_execute_nothing(sudo_fleet, become):
    fleet = sudo_fleet
    with fleet.connect(
        "lab01", ansible_user=SUDO_USER, ansible_become_password=fleet.become_password()
    ) as conn:
        assert conn.run(
            "rm -rf /tmp/x /tmp/pwned /tmp/q && mkdir -p /tmp/x && mkdir -m 1777 /tmp/q",
            become=True,
        ).ok
        for i, value in enumerate(NASTY):
            result = conn.run(f"printf '%s' {shlex.quote(value)}", become=become)
            assert result.stdout == value
            path = f"/tmp/q/{i}{value.replace('/', '_')}"
            conn.put(path, value.encode(), become=become)
            assert conn.get(path, become=become) == value.encode()
        assert conn.run("test -d /tmp/x && test ! -e /tmp/pwned").ok
        assert len(conn.run("ls -A /tmp/q", become=True).stdout.splitlines()) >= len(NASTY) - 1


# -- parsing connection variables ---------------------------------------------------------------


def test_ssh_args_parsing():
    args = SSHArgs.parse(
        "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/a/kh "
        "-o 'UserKnownHostsFile /b/kh /c/kh' -oProxyJump=bob@jump:2222 -C -F ~/my_config "
        "-i /k -p 2200 -lalice -J j1,j2"
    )
    assert args.config_file == "~/my_config"
    assert args.options == [
        "StrictHostKeyChecking no",
        "UserKnownHostsFile /a/kh",
        "UserKnownHostsFile /b/kh /c/kh",
        "ProxyJump bob@jump:2222",
        "IdentityFile /k",
        "Port 2200",
        "User alice",
        "ProxyJump j1,j2",
    ]
    with pytest.raises(ConnectionFailed, match="cannot parse the ssh arguments"):
        SSHArgs.parse("-o 'unbalanced", "host x")


def test_known_hosts_lines_are_well_formed(lab_fleet):
    fleet = lab_fleet(1)
    for line in fleet.known_hosts.read_text().splitlines():
        assert re.fullmatch(r"127\.\d+\.\d+\.\d+ ssh-ed25519 [A-Za-z0-9+/=]+", line)


def test_a_host_that_never_answers_times_out(tmp_path):
    """A TCP listener that never speaks SSH (a hung host): the connect timeout ends the wait."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        hostvars = {"ansible_host": "127.0.0.1", "ansible_port": port, "ansible_user": "root"}
        options = ConnectOptions(
            known_hosts=str(tmp_path / "kh"), connect_timeout=1, connect_retries=0
        )
        started = time.monotonic()
        with pytest.raises(ConnectionFailed, match="cannot connect") as info:
            SSHConnection("hung", hostvars, options).open()
        # The connect timeout (1 s) ended the wait, not paramiko's 15 s banner timeout.
        assert time.monotonic() - started < 10
        assert "connect timeout 1 s" in info.value.hint


@contextmanager
def closing_server(reply: bytes) -> Iterator[int]:
    """A TCP server on 127.0.0.1 (its port) that answers each connection with ``reply`` (maybe
    nothing) and closes it at once: a host whose sshd drops connections before its banner."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:  # shut down: the test is over
                return
            with conn:
                conn.sendall(reply)

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        server.shutdown(socket.SHUT_RDWR)  # wakes accept()
        thread.join()
        server.close()


def test_hosts_that_close_before_the_banner_are_one_line_each(tmp_path):
    """paramiko logs its transport thread's errors, tracebacks and all; fxkit says it once per
    host, through the real CLI."""
    with closing_server(b"") as closes, closing_server(b"HTTP/1.1 400 Bad Request\r\n\r\n") as web:
        (tmp_path / "hosts.ini").write_text(
            f"closes ansible_host=127.0.0.1 ansible_port={closes} ansible_user=root\n"
            f"web ansible_host=127.0.0.1 ansible_port={web} ansible_user=root\n"
        )
        done = subprocess.run(
            [sys.executable, "-m", "fxkit", "play", "site", "-i", str(tmp_path / "hosts.ini"),
             "-e", f"node_base_root={tmp_path / 'root'}", "--connect-retries", "1"],
            capture_output=True, text=True, check=False, timeout=120,
        )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr and "Exception" not in done.stderr, done.stderr
    said = [line for line in done.stdout.splitlines() if "before the SSH banner" in line]
    assert len(said) == 2, done.stdout
    for host, port in (("closes", closes), ("web", web)):
        [line] = [line for line in said if f"host {host} " in line]
        assert f"root@127.0.0.1:{port}): closed the connection before the SSH banner" in line
    assert done.stdout.count("sshd log") == 2  # the hint, once per host


# -- timeouts ----------------------------------------------------------------------------------


def test_a_kill_spares_a_process_that_is_not_the_command(lab_fleet):
    """The PID of a command that has ended may be reused: a kill (on a timeout or a cancel)
    checks that the process is still the command, by its start marker."""
    fleet = lab_fleet(1)
    with fleet.connect("lab01") as conn:
        pid = int(conn.run("setsid sleep 300 >/dev/null 2>&1 & echo $!").stdout)
        conn._kill(pid, "fxkit-start-0123456789abcdef", become=False)  # not its marker
        assert conn.run(f"kill -0 {pid}").ok
        conn.run(f"kill {pid}")


@pytest.mark.parametrize("become", [False, True])
def test_a_timeout_kills_the_command_and_its_children_on_the_host(sudo_fleet, become):
    fleet = sudo_fleet
    with fleet.connect(
        "lab01", ansible_user=SUDO_USER, ansible_become_password=fleet.become_password()
    ) as conn:
        pids = f"/tmp/timeout-pids-{become}"
        meeting = Meeting(conn)
        result = run_past_timeout(
            conn,
            f"echo $$ > {pids}; sleep 300 & echo $! >> {pids}; (sleep 301; :) & echo $! >> {pids}; "
            f"echo started; {meeting.reach}; wait",
            meeting,
            timeout=1,
            become=become,
        )
        assert result.rc == TIMEOUT_RC and result.stdout == "started\n"
        assert "timed out after 1 s; it was killed" in result.stderr
        listed = conn.run(f"cat {pids}", become=True).stdout.split()
        assert len(listed) == 3
        check = " ".join(f"/proc/{pid}/stat" for pid in listed)
        # Gone (or a zombie an instant before the host's init reaps it), not running on.
        states = conn.run(f"cat {check} 2>/dev/null", become=True).stdout
        assert all(line.split(") ")[1][0] in "ZX" for line in states.splitlines()), states


# -- ~/.ssh/config -----------------------------------------------------------------------------


def _host_block(fleet, alias: str, name: str, **extra: str) -> str:
    """An ssh config block for a lab host, made of its inventory variables."""
    hv = fleet.hostvars(name)
    lines = {
        "HostName": str(hv["ansible_host"]),
        "User": str(hv["ansible_user"]),
        "Port": str(hv["ansible_port"]),
        "IdentityFile": str(hv["ansible_ssh_private_key_file"]),
        **dict(o.split(" ", 1) for o in SSHArgs.parse(str(hv["ansible_ssh_common_args"])).options),
        **extra,
    }
    return f"Host {alias}\n" + "".join(f"    {k} {v}\n" for k, v in lines.items() if v)


def test_the_users_ssh_config_names_the_host(lab_fleet, tmp_path):
    fleet = lab_fleet(2)
    config = tmp_path / "home" / ".ssh" / "config"  # HOME is tmp_path/home here
    config.parent.mkdir(parents=True)
    config.write_text(_host_block(fleet, "web", "lab02"))
    with connect("web", {}, ConnectOptions()) as conn:  # alias, address, user, port, key, keys
        assert conn.run("hostname").stdout.strip() == "lab02"
    # The alias applies to ansible_host too, as with ssh.
    with connect("db", {"ansible_host": "web"}, ConnectOptions()) as conn:
        assert conn.run("hostname").stdout.strip() == "lab02"


def test_inventory_variables_beat_the_ssh_config(lab_fleet, tmp_path):
    fleet = lab_fleet(2)
    config = tmp_path / "config"
    wrong = {"User": "nobody", "Port": "1", "IdentityFile": str(tmp_path / "no-such-key")}
    config.write_text(
        _host_block(fleet, str(fleet.hostvars("lab01")["ansible_host"]), "lab01", **wrong)
    )
    hostvars = {**fleet.hostvars("lab01"), "ansible_ssh_common_args": f"-F {config}"}
    with connect("lab01", hostvars, ConnectOptions(known_hosts=str(fleet.known_hosts))) as conn:
        assert conn.run("id -un; hostname").stdout.split() == ["root", "lab01"]


def test_a_config_file_given_by_option_or_environment_replaces_the_users(
    lab_fleet, tmp_path, monkeypatch
):
    fleet = lab_fleet(2)
    home_config = tmp_path / "home" / ".ssh" / "config"
    home_config.parent.mkdir(parents=True)
    home_config.write_text(_host_block(fleet, "web", "lab01"))
    mine = tmp_path / "mine"
    mine.write_text(_host_block(fleet, "web", "lab02"))
    with connect("web", {}, ConnectOptions(ssh_config=str(mine))) as conn:
        assert conn.run("hostname").stdout.strip() == "lab02"
    monkeypatch.setenv("FXKIT_SSH_CONFIG", str(mine))
    with connect("web", {}, ConnectOptions()) as conn:
        assert conn.run("hostname").stdout.strip() == "lab02"


def test_a_proxy_jump_from_the_ssh_config(lab_fleet, tmp_path):
    # Lab hosts reach only their own network namespace: lab01 is bastion and target (two logins).
    fleet = lab_fleet(1)
    before = _logins(fleet, "lab01")
    config = tmp_path / "config"
    config.write_text(
        _host_block(fleet, "bastion", "lab01")
        + _host_block(fleet, "inner", "lab01", ProxyJump="bastion")
    )
    with connect("inner", {}, ConnectOptions(ssh_config=str(config))) as conn:
        assert conn.run("hostname").stdout.strip() == "lab01"
        conn.put("/tmp/via-config-bastion", b"ok")
        assert conn.get("/tmp/via-config-bastion") == b"ok"
    assert _logins(fleet, "lab01") == before + 2


def test_a_jump_host_with_an_unknown_key_is_refused(lab_fleet, tmp_path):
    """Fabric's own connections accept any host key; every hop fxkit opens verifies it."""
    fleet = lab_fleet(2)
    config = tmp_path / "config"
    config.write_text(
        _host_block(fleet, "bastion", "lab01", UserKnownHostsFile="/dev/null")
        + _host_block(fleet, "inner", "lab02", ProxyJump="bastion")
    )
    with pytest.raises(HostKeyError, match="unknown ssh-ed25519 host key"):
        connect("inner", {}, ConnectOptions(ssh_config=str(config))).open()


@pytest.mark.parametrize(
    ("hostvars", "config", "message", "where"),
    [
        ({"ansible_port": "22x"}, "", "bad port '22x'", "host h, variable ansible_port"),
        ({"ansible_port": 70000}, "", "bad port 70000", "host h, variable ansible_port"),
        ({}, "Host h\n    Port ssh\n", "cannot resolve the host", "host h"),
        ({}, "Host h\n  = broken\n", "cannot read the ssh config", "host h"),
        ({"ansible_ssh_private_key_file": "/no/key"}, "", "/no/key does not exist", "host h"),
        ({"ansible_ssh_common_args": "-F /no/config"}, "", "/no/config does not exist", "host h"),
    ],
)
def test_bad_connection_settings_are_clear_errors(tmp_path, hostvars, config, message, where):
    path = tmp_path / "config"
    path.write_text(config)
    with pytest.raises(ConnectionFailed, match=re.escape(message)) as info:
        connect("h", hostvars, ConnectOptions(ssh_config=str(path)))
    assert info.value.where.startswith(where)


def test_stdin_goes_out_in_linear_time(lab_fleet, monkeypatch):
    """paramiko's sendall re-slices a bytes object for every 32 KiB packet (quadratic time):
    every packet of the data must be a slice of one memoryview over the caller's data, never a
    copy (the host-side helper's frames add their heads)."""
    fleet = lab_fleet(1)
    sent: list[object] = []
    original = paramiko.Channel.send

    def spy(chan, data):  # type: ignore[no-untyped-def]
        sent.append(data)
        return original(chan, data)

    monkeypatch.setattr(paramiko.Channel, "send", spy)
    payload = bytes(range(256)) * 32768  # 8 MiB
    with fleet.connect("lab01") as conn:
        result = conn.run("sha256sum", stdin=payload)
    assert result.stdout.split()[0] == hashlib.sha256(payload).hexdigest()
    assert all(isinstance(s, memoryview) for s in sent)
    data = [s for s in sent if s.obj is payload]  # type: ignore[attr-defined]
    assert len(data) >= 8 * 2**20 // 32768
    # The rest: the frames' heads and the command's request, a few hundred bytes.
    assert sum(len(s) for s in sent if s.obj is not payload) < 1024  # type: ignore[attr-defined]
