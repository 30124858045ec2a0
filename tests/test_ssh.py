"""The SSH transport against real sshd (lab hosts): commands, files, host keys, become, failures."""

from __future__ import annotations

import hashlib
import re
import shlex
import socket
import threading
import time

import pytest

from fxkit.connection import ConnectOptions, connect
from fxkit.connection.ssh import JumpHost, SSHArgs, SSHConnection
from fxkit.errors import ConnectionFailed, FxkitError, HostKeyError
from fxkit.lab import SUDO_USER
from fxkit.redaction import REDACTED

pytestmark = pytest.mark.lab


@pytest.fixture(autouse=True)
def no_personal_known_hosts(tmp_path, monkeypatch):
    """Keep the user's own ~/.ssh/known_hosts and fxkit's default file out of these tests."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("FXKIT_KNOWN_HOSTS", str(tmp_path / "fxkit_known_hosts"))


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
        started = time.perf_counter()
        for _ in range(50):
            conn.run("true")
        per_command = (time.perf_counter() - started) / 50
    # ~3 ms here; 40+ ms would mean Nagle's algorithm holds small packets back (TCP_NODELAY).
    assert per_command < 0.03, f"{per_command * 1000:.1f} ms per command"


def test_command_timeout(lab_fleet):
    fleet = lab_fleet(1)
    with fleet.connect("lab01") as conn:
        started = time.monotonic()
        result = conn.run("echo started; sleep 30", timeout=0.5)
        assert time.monotonic() - started < 5
        assert result.rc == 124 and result.stdout == "started\n"
        assert "timed out after 0.5 s" in result.stderr
        assert conn.run("echo still usable").ok


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
    assert time.monotonic() - started < 5
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
    assert conn.run("true").ok
    outcome: list[BaseException] = []

    def long_command() -> None:
        try:
            conn.run("sleep 30")
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=long_command)
    thread.start()
    time.sleep(0.3)
    fleet.stop("lab02")
    thread.join(10)
    assert not thread.is_alive()
    assert outcome and isinstance(outcome[0], ConnectionFailed), outcome
    with pytest.raises(ConnectionFailed):
        conn.run("true")
    conn.close()
    fleet.up(2)


def test_a_jump_host_carries_the_connection(lab_fleet):
    # A lab host reaches nothing but its own network namespace (docs/lab.md): lab01 is the jump
    # host and the target, two logins on it, the second through a channel of the first.
    fleet = lab_fleet(1)
    before = _logins(fleet, "lab01")
    args = f"-o UserKnownHostsFile={fleet.known_hosts} -o ProxyJump=root@{fleet.address('lab01')}"
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
        "-o 'UserKnownHostsFile /b/kh /c/kh' -oProxyJump=bob@jump:2222"
    )
    assert args.known_hosts_files == ["/a/kh", "/b/kh", "/c/kh"]
    assert args.proxy_jump == "bob@jump:2222"
    assert SSHArgs.parse("-J jump").proxy_jump == "jump"
    assert JumpHost.parse("bob@jump:2222", "here") == JumpHost("jump", 2222, "bob")
    assert JumpHost.parse("jump", "here") == JumpHost("jump", 22, None)
    with pytest.raises(ConnectionFailed, match="only one jump host"):
        JumpHost.parse("a,b", "here")
    with pytest.raises(ConnectionFailed, match="bad jump host"):
        JumpHost.parse("bob@jump:ssh", "here")


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
        assert time.monotonic() - started < 5
        assert "connect timeout 1 s" in info.value.hint
