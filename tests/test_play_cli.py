"""``fxkit play`` end to end on this machine: the built-in site playbook and node_base role,
through the real inventory, operations and local connection, inside a scratch root folder."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from fxkit.cli import cli

LOCAL = "all:\n  hosts:\n    localhost:\n      ansible_connection: local\n"


#: What node_base manages on a real machine: no test may create any of it here.
REAL_TARGETS = [
    Path("/etc/fxkit"),
    Path("/opt/fxkit"),
    Path("/etc/sysctl.d/90-fxkit.conf"),
    Path("/etc/modules-load.d/fxkit.conf"),
]


@pytest.fixture(autouse=True)
def real_machine_untouched() -> Iterator[None]:
    """Every run here must stay inside its scratch root (node_base_root)."""
    before = [p.exists() for p in REAL_TARGETS]
    limits = Path("/etc/security/limits.conf")
    limits_before = limits.read_bytes() if limits.exists() else None
    yield
    assert [p.exists() for p in REAL_TARGETS] == before
    assert (limits.read_bytes() if limits.exists() else None) == limits_before


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A scratch root with what a Debian node has before fxkit runs."""
    root = tmp_path / "root"
    for folder in ("etc/sysctl.d", "etc/modules-load.d", "etc/security", "proc/sys/kernel"):
        (root / folder).mkdir(parents=True)
    (root / "etc/security/limits.conf").write_text(
        "# /etc/security/limits.conf\n*  soft  nofile  65536\n"
    )
    (root / "proc/sys/kernel/numa_balancing").write_text("1\n")
    return root


def snapshot(root: Path) -> dict[str, tuple[int, bytes | None]]:
    """Every path under root: its mode and (for files) its bytes."""
    tree = {}
    for path in sorted(root.rglob("*")):
        info = path.lstat()
        content = path.read_bytes() if stat.S_ISREG(info.st_mode) else None
        tree[str(path.relative_to(root))] = (info.st_mode, content)
    return tree


def fxkit(*args: str, env: dict[str, str] | None = None) -> Any:
    result = CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False)
    return result


def site(
    tmp_path: Path, root: Path, *extra: str, inventory: str = LOCAL
) -> tuple[int, str, list[dict]]:
    (tmp_path / "hosts.yml").write_text(inventory)
    log = tmp_path / "events.json"
    args = ["play", "site", "-i", str(tmp_path / "hosts.yml"), "-e", f"node_base_root={root}"]
    result = fxkit(*args, "--log-json", str(log), *extra)
    return result.exit_code, result.output, [e for e in log_events(log) if e["event"] == "task"]


def log_events(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()]


def statuses(events: list[dict]) -> dict[str, int]:
    out: dict[str, int] = {}
    for event in events:
        out[event["status"]] = out.get(event["status"], 0) + 1
    return out


def test_converge_then_a_second_run_changes_nothing(tmp_path: Path, root: Path) -> None:
    code, output, events = site(tmp_path, root)
    assert code == 0, output
    assert statuses(events) == {"changed": 9, "ok": 3}
    node = (root / "etc/fxkit/node.yaml").read_text()
    assert "name: localhost\n" in node and "model: MI308X\n" in node
    assert (root / "etc/sysctl.d/90-fxkit.conf").read_text() == "kernel.numa_balancing = 0\n"
    assert (root / "proc/sys/kernel/numa_balancing").read_text().strip() == "0"
    assert (root / "etc/modules-load.d/fxkit.conf").read_text().splitlines()[1:] == [
        "amdgpu",
        "rdma_ucm",
        "nvme_rdma",
    ]
    limits = (root / "etc/security/limits.conf").read_text().splitlines()
    assert limits[-2:] == ["*  soft  memlock  unlimited", "*  hard  memlock  unlimited"]
    assert stat.S_IMODE((root / "opt/fxkit/bin").stat().st_mode) == 0o755
    node_id = (root / "etc/fxkit/node-id").read_text()

    before = snapshot(root)
    code, output, events = site(tmp_path, root)
    assert code == 0
    assert statuses(events) == {"ok": 12}
    assert "changed" not in {e["status"] for e in events}
    assert snapshot(root) == before
    assert (root / "etc/fxkit/node-id").read_text() == node_id  # the guarded command did not rerun


def test_an_empty_scratch_folder_converges_too(tmp_path: Path) -> None:
    root = tmp_path / "empty"
    code, _, events = site(tmp_path, root)
    assert code == 0 and statuses(events) == {"changed": 12}  # sysctl: persisted, live skipped
    code, _, events = site(tmp_path, root)
    assert code == 0 and statuses(events) == {"ok": 11, "skipped": 1}


@pytest.mark.parametrize("converged", [False, True])
def test_check_mode_leaves_the_target_byte_for_byte(
    tmp_path: Path, root: Path, converged: bool
) -> None:
    if converged:
        site(tmp_path, root)
        (root / "etc/fxkit/node.yaml").write_text("drifted\n")
    before = snapshot(root)
    code, output, events = site(tmp_path, root, "--check", "--diff")
    assert code == 0, output
    assert snapshot(root) == before
    assert statuses(events)["changed"] == (1 if converged else 9)
    assert "check mode: nothing was changed" in output
    assert "+name: localhost" in output  # the diff of what would be written


def test_a_missing_kernel_setting_is_skipped_not_faked(tmp_path: Path, root: Path) -> None:
    (root / "proc/sys/kernel/numa_balancing").unlink()
    code, _, events = site(tmp_path, root)
    assert code == 0
    [sysctl] = [e for e in events if e["operation"] == "sysctl kernel.numa_balancing"]
    assert sysctl["status"] == "changed"  # the drop-in was written ...
    assert "applies at boot" in sysctl["msg"]  # ... and the live part says why it was not
    assert (root / "etc/sysctl.d/90-fxkit.conf").read_text() == "kernel.numa_balancing = 0\n"
    code, _, events = site(tmp_path, root)
    [sysctl] = [e for e in events if e["operation"] == "sysctl kernel.numa_balancing"]
    assert sysctl["status"] == "skipped" and "applies at boot" in sysctl["msg"]
    assert "changed" not in {e["status"] for e in events}


def test_secrets_are_redacted_in_output_and_log(tmp_path: Path, root: Path) -> None:
    inventory = LOCAL + (
        "      ansible_become_password: hunter2-Secret\n"
        "      node_role: hunter2-Secret\n"
        "      node_gpu_model: '{{ registry_token }}'\n"
    )
    token = "-e registry_token=tok-0xDEADBEEF"
    code, output, events = site(tmp_path, root, "--diff", "-v", *token.split(), inventory=inventory)
    assert code == 0
    node = (root / "etc/fxkit/node.yaml").read_text()
    assert "role: hunter2-Secret" in node and "model: tok-0xDEADBEEF" in node
    log = (tmp_path / "events.json").read_text()
    for secret in ("hunter2-Secret", "tok-0xDEADBEEF"):
        assert secret not in output and secret not in log
    assert "+role: ********" in output and "+  model: ********" in output
    assert any("********" in (e["diff"] or "") for e in events)


def test_unreachable_host_fails_the_run(tmp_path: Path, root: Path) -> None:
    inventory = LOCAL + "    elsewhere:\n      ansible_connection: carrier-pigeon\n"
    code, _, events = site(tmp_path, root, inventory=inventory)
    assert code == 1
    [event] = [e for e in events if e["host"] == "elsewhere"]
    assert event["status"] == "unreachable" and "unknown connection type" in event["msg"]
    assert statuses([e for e in events if e["host"] == "localhost"])["changed"] == 9


def test_the_json_log_ends_with_one_summary_per_host(tmp_path: Path, root: Path) -> None:
    inventory = LOCAL + "    elsewhere:\n      ansible_connection: carrier-pigeon\n"
    code, _, tasks = site(tmp_path, root, inventory=inventory)
    events = log_events(tmp_path / "events.json")
    assert code == 1 and events[: len(tasks)] == tasks
    assert events[len(tasks) :] == [
        {"event": "summary", "host": "localhost", "outcome": "ok",
         "ok": 3, "changed": 9, "failed": 0, "skipped": 0, "unreachable": 0},
        {"event": "summary", "host": "elsewhere", "outcome": "unreachable",
         "ok": 0, "changed": 0, "failed": 0, "skipped": 0, "unreachable": 1},
    ]  # fmt: skip


def test_limit_tags_and_skip_tags(tmp_path: Path, root: Path) -> None:
    inventory = LOCAL + "    elsewhere:\n      ansible_connection: carrier-pigeon\n"
    code, _, events = site(
        tmp_path, root, "--limit", "localhost", "--skip-tags", "never-used", inventory=inventory
    )
    assert code == 0 and {e["host"] for e in events} == {"localhost"}
    code, _, events = site(tmp_path, root, "--tags", "nothing-has-this")
    assert code == 0 and events == []


def test_roles_path_order(tmp_path: Path, root: Path) -> None:
    """The playbook's roles/ first, then --roles-path / FXKIT_ROLES_PATH, then the built-ins."""
    (tmp_path / "hosts.yml").write_text(LOCAL)
    book = tmp_path / "book" / "site.yml"
    mine = tmp_path / "mine"
    for folder, marker in ((mine, "roles-path"), (book.parent / "roles", "playbook")):
        role = folder / "node_base"
        role.mkdir(parents=True)
        (role / "role.py").write_text(
            f"def apply(host, v):\n    host.file(v.out + '/which', content={marker!r})\n"
        )
    book.write_text("- hosts: all\n  roles: [node_base]\n")
    args = ["play", str(book), "-i", str(tmp_path / "hosts.yml"), "-e", f"out={root}"]
    assert fxkit(*args, "--roles-path", str(mine)).exit_code == 0
    assert (root / "which").read_text() == "playbook"
    (book.parent / "roles/node_base/role.py").unlink()
    (book.parent / "roles/node_base").rmdir()
    assert fxkit(*args, env={"FXKIT_ROLES_PATH": f"/nonexistent:{mine}"}).exit_code == 0
    assert (root / "which").read_text() == "roles-path"
    assert fxkit(*args, "-e", f"node_base_root={root}").exit_code == 0  # the built-in one
    assert (root / "etc/fxkit/node.yaml").is_file()


def test_help_names_every_option() -> None:
    result = fxkit("play", "--help")
    assert result.exit_code == 0
    for option in ("--inventory", "--limit", "--check", "--diff", "--tags", "--skip-tags",
                   "--extra-vars", "--forks", "--log-json", "--roles-path",
                   "--accept-new-host-keys", "--connect-timeout", "--ask-become-pass",
                   "--become-password-file"):  # fmt: skip
        assert option in result.output


def run_fxkit(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "fxkit", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_mistakes_are_one_clear_message_with_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "hosts.yml").write_text(LOCAL)
    (tmp_path / "book.yml").write_text("- hosts: all\n  roles: [node_base]\n  serail: 2\n")
    proc = run_fxkit("play", "book.yml", "-i", "hosts.yml", cwd=tmp_path)
    assert proc.returncode == 2
    assert "book.yml:3" in proc.stderr and "did you mean 'serial'?" in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout

    proc = run_fxkit("play", "site", "-i", "hosts.yml", "-e", "not-a-pair", cwd=tmp_path)
    assert proc.returncode == 2 and "cannot read extra var" in proc.stderr


def test_a_template_error_names_template_line_variable_and_host(tmp_path: Path) -> None:
    role = tmp_path / "roles" / "motd"
    (role / "templates").mkdir(parents=True)
    (role / "role.py").write_text("def apply(host, v):\n    host.template('motd.j2', v.out)\n")
    (role / "templates" / "motd.j2").write_text(
        "Welcome to {{ inventory_hostname }}\nrack {{ rack }}\n"
    )
    (tmp_path / "book.yml").write_text("- hosts: all\n  roles: [motd]\n")
    (tmp_path / "hosts.yml").write_text(LOCAL)
    out = tmp_path / "motd"
    result = fxkit(
        "play", str(tmp_path / "book.yml"), "-i", str(tmp_path / "hosts.yml"), "-e", f"out={out}"
    )
    assert result.exit_code == 1
    assert f"{role}/templates/motd.j2:2" in result.output
    assert "undefined variable 'rack' for host localhost" in result.output
    assert not out.exists()
