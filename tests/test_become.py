"""become through sudo, one implementation for both connections (fxkit.connection.become).

Over SSH as the lab's non-root user ``fxkit``; the local connection runs as that user inside a
lab host (this machine's tests run as root, where LocalConnection never needs sudo). Both are
tried where sudo asks for the password and where it does not (a NOPASSWD rule, or sudo's cached
credentials): the password must never reach the command's own stdin.
"""

from __future__ import annotations

import io
import json
import shlex
import tarfile
from pathlib import Path

import pytest

from fxkit.connection.become import Sudo
from fxkit.lab import SUDO_USER

REPO = Path(__file__).resolve().parents[1]
#: Where the tests copy fxkit's connection code inside each host: the checkout itself may not be
#: visible there (a checkout under /tmp, /root or /home is hidden by the host's own mounts).
HOST_SRC = "/opt/fxkit-src"
#: The lab hosts' own Python (the virtualenv's interpreter lives under /root, not in a host);
#: fxkit.connection.local needs nothing beyond the standard library.
HOST_PYTHON = "/usr/bin/python3"
LOCAL_PROBE = """
import json, sys
from fxkit.connection.local import LocalConnection
password = sys.stdin.readline().strip() or None
conn = LocalConnection("inside", become_password=password)
results = [conn.run("cat", become=True, stdin=b"only this") for _ in range(2)]
results.append(conn.run("id -un", become=True))
results.append(conn.run("cat", become=True))
conn.put("/root/local-put", b"root's", become=True)
results.append(conn.run("stat -c %U:%s /root/local-put", become=True))
print(json.dumps([[r.rc, r.stdout, r.stderr] for r in results]))
"""


def test_the_sudo_command_line_holds_no_password_and_a_quoted_prompt() -> None:
    sudo = Sudo("root", "s3cret-pass")
    line = sudo.command("echo 'hi'")
    assert "s3cret-pass" not in line
    words = shlex.split(line)
    assert words[:2] == ["sudo", "-S"] and words[3].startswith("[fxkit-sudo-")
    assert words[-3:-1] == ["sh", "-c"] and "\necho 'hi'\n" in words[-1]
    assert shlex.split(Sudo("root", None).command("true"))[:2] == ["sudo", "-n"]


@pytest.fixture(scope="module")
def sudo_fleet(lab_fleet):
    fleet = lab_fleet(2, name="become")
    if fleet.become_password() is None:
        pytest.skip("sudo is not installed: lab hosts have no non-root user (apt-get install sudo)")
    # lab02's fxkit user may sudo without a password: sudo never asks there.
    source = _connection_source()
    for host in ("lab01", "lab02"):
        with fleet.connect(host) as root:
            unpacked = root.run(f"mkdir -p {HOST_SRC} && tar -x -C {HOST_SRC}", stdin=source)
            assert unpacked.ok, unpacked
    with fleet.connect("lab02") as root:
        rule = f"{SUDO_USER} ALL=(ALL:ALL) NOPASSWD: ALL\n"
        root.put("/etc/sudoers.d/zz-nopasswd", rule.encode())
        assert root.run("chmod 0440 /etc/sudoers.d/zz-nopasswd && visudo -c").ok
    return fleet


def _connection_source() -> bytes:
    """A tar of the modules LocalConnection needs (standard library only beyond these)."""
    stream = io.BytesIO()
    with tarfile.open(fileobj=stream, mode="w") as tar:
        for name in ("__init__.py", "errors.py", "redaction.py", "connection"):
            tar.add(
                REPO / "fxkit" / name,
                arcname=f"fxkit/{name}",
                filter=lambda info: None if "__pycache__" in info.name else info,
            )
    return stream.getvalue()


@pytest.mark.lab
@pytest.mark.parametrize("host", ["lab01", "lab02"])
def test_ssh_become_sends_the_password_only_when_asked(sudo_fleet, host: str) -> None:
    password = sudo_fleet.become_password()
    with sudo_fleet.connect(host, ansible_user=SUDO_USER, ansible_become_password=password) as c:
        results = [c.run("cat", become=True, stdin=b"only this") for _ in range(2)]
        assert [r.stdout for r in results] == ["only this", "only this"], results
        assert c.run("id -un", become=True).stdout == "root\n"


@pytest.mark.lab
@pytest.mark.parametrize("host", ["lab01", "lab02"])
def test_local_become_sends_the_password_only_when_asked(sudo_fleet, host: str) -> None:
    password = sudo_fleet.become_password()
    if not Path(HOST_PYTHON).exists():
        pytest.skip(f"{HOST_PYTHON} is not installed")
    with sudo_fleet.connect(host, ansible_user=SUDO_USER) as conn:
        probe = conn.run(
            f"cd {HOST_SRC} && PYTHONDONTWRITEBYTECODE=1 PYTHONPATH=. "
            f"{HOST_PYTHON} -c {shlex.quote(LOCAL_PROBE)}",
            stdin=f"{password}\n".encode(),
            timeout=60,
        )
    assert probe.ok, probe
    assert password not in probe.stdout + probe.stderr
    (cat1, cat2, whoami, empty, stat) = json.loads(probe.stdout)
    # The second run finds sudo's cached credentials on lab01: sudo does not ask again.
    assert cat1[:2] == cat2[:2] == [0, "only this"], (cat1, cat2)
    assert whoami[:2] == [0, "root\n"]
    assert empty[:2] == [0, ""]
    assert stat[:2] == [0, "root:6\n"]


@pytest.mark.lab
def test_local_become_with_a_wrong_password_fails_fast(sudo_fleet) -> None:
    probe = (
        "from fxkit.connection.local import LocalConnection\n"
        "r = LocalConnection('inside', become_password='wrong-password-4711')"
        ".run('id -u', become=True, timeout=30)\n"
        "print(r.rc, r.stderr.strip().splitlines()[-1])\n"
    )
    with sudo_fleet.connect("lab01", ansible_user=SUDO_USER) as conn:
        result = conn.run(
            f"cd {HOST_SRC} && PYTHONDONTWRITEBYTECODE=1 PYTHONPATH=. "
            f"{HOST_PYTHON} -c {shlex.quote(probe)}",
            timeout=60,
        )
    assert result.stdout.strip() == "1 sudo: the become password was refused", result
