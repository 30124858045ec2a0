"""Secrets planted everywhere reach only the files that need them (issue 8, part 4).

``tests/data/secrets/site.yml`` runs through the real ``fxkit`` executable over real SSH against
the lab fleet, with ``--diff -v --log-json``, and fails on purpose on both hosts (a command whose
error output holds a secret, a secret that is a broken template). Its secrets sit in the
inventory, ``-e``, the play's vars file, nested in mappings, named by ``secret_vars`` or the
inventory's ``fxkit_secret_vars``, secret by the usual names (``*_key``, ``credentials``), too
short to mask, and transformed (sliced too) by a template and by Python. Then every output is
searched for them, and so is every file the run wrote on the hosts. ``fxkit gate`` gets the
same treatment: its console, its errors and its four reports.
"""

from __future__ import annotations

import base64
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fxkit.lab import Fleet

pytestmark = pytest.mark.lab

FXKIT = Path(sys.executable).with_name("fxkit")
BOOK = Path(__file__).parent / "data" / "secrets" / "site.yml"
#: What a lab host can write (overlays and tmpfs, docs/lab.md): a file fxkit left is there.
WRITABLE = "/etc /var /usr /opt /srv /root /home /run /tmp /dev/shm"
MARKER = "/tmp/.fxkit-secrets-test-start"
#: The files the role writes its secrets into, on purpose.
TARGETS = ["/etc/secretapp/app.conf", "/etc/secretapp/db.b64", "/etc/secretapp/env"]


def fxkit(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(FXKIT), *args],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=cwd,
        env={**os.environ, "COLUMNS": "200"},
    )


def plant(fleet: Fleet, path: Path, token: str) -> dict[str, str]:
    """The fleet's inventory with secrets in it; returns every secret of the run by where it
    sits (the vars file's from tests/data)."""
    inventory = yaml.safe_load(fleet.inventory.read_text())
    secrets = {
        "-e db_password": f"db-pass-{token}",
        "inventory api_token": f"api-tok-{token}",
        "inventory bmc_login (secret_vars)": f"bmc-login-{token}",
        "lab01 creds.password (nested)": f"adm-pass-1-{token}",
        "lab02 creds.password (nested)": f"adm-pass-2-{token}",
        "lab01 broken_password (a template)": f"pw{{%x9{token}{{{{zz",
        "inventory registry_auth_key": f"auth-key-{token}",
        "inventory private_key": f"-----BEGIN PRIVATE KEY-----{token}",
        "inventory credentials": f"creds-{token}",
        "inventory apikey": f"apikey-{token}",
        "inventory site_code (fxkit_secret_vars)": f"site-{token}",
    }
    inventory["all"]["vars"].update(
        api_token=secrets["inventory api_token"],
        bmc_login=secrets["inventory bmc_login (secret_vars)"],
        pin_password="MI3",  # shorter than the minimum: masked nowhere
        registry_auth_key=secrets["inventory registry_auth_key"],
        private_key=secrets["inventory private_key"],
        credentials=secrets["inventory credentials"],
        apikey=secrets["inventory apikey"],
        site_code=secrets["inventory site_code (fxkit_secret_vars)"],
        fxkit_secret_vars=["site_*"],
        token_hint="{{ api_token[0:4] }}-{{ inventory_hostname }}",  # a slice in a longer value
        tls_key_file="/etc/tls/node.key",  # a path to a key and a digest: not secrets
        rocm_host_key_sha256="ab12" * 16,
    )
    hosts = inventory["all"]["children"]["lab"]["hosts"]
    for host in ("lab01", "lab02"):
        password = secrets[f"{host} creds.password (nested)"]
        hosts[host]["creds"] = {"user": "admin", "password": password}
    hosts["lab01"]["broken_password"] = secrets["lab01 broken_password (a template)"]
    path.write_text(yaml.safe_dump(inventory))
    planted = yaml.safe_load((BOOK.parent / "vars" / "secrets.yml").read_text())
    secrets["vars file nvme_dhchap_key (a key)"] = planted["nvme_dhchap_key"]
    secrets["vars file vault.registry.token (nested)"] = planted["vault"]["registry"]["token"]
    return secrets


def transforms(secrets: dict[str, str]) -> dict[str, str]:
    """What the role makes of them: each must be as invisible as the secret itself."""
    db, api = secrets["-e db_password"], secrets["inventory api_token"]
    return {
        **secrets,
        "db_password | upper (template and Python)": db.upper(),
        "db_password base64 (Python)": base64.b64encode(db.encode()).decode(),
        "api_token | reverse (template)": api[::-1],
        "token | replace (template)": secrets["vars file vault.registry.token (nested)"].replace(
            "-", "_"
        ),
        "a piece of the broken template": secrets["lab01 broken_password (a template)"][4:-4],
        "api_token[0:4] (template)": f"token_head: {api[0:4]}",
        "token_hint: a slice in a variable": f"{api[0:4]}-lab0",
    }


def test_secrets_planted_everywhere_reach_only_the_files_that_need_them(
    lab_fleet, tmp_path: Path
) -> None:
    fleet = lab_fleet(2, name="secrets-everywhere")
    token = os.urandom(6).hex()
    inventory = tmp_path / "inventory.yml"
    hidden = transforms(plant(fleet, inventory, token))
    for host in ("lab01", "lab02"):
        with fleet.connect(host) as conn:
            assert conn.run(f"rm -rf /etc/secretapp; touch {MARKER}").ok
    log = tmp_path / "events.jsonl"
    extra = ["-e", f"db_password={hidden['-e db_password']}", "-e", '{"password_min_length": 8}']

    run = fxkit(
        "play", str(BOOK), "-i", str(inventory), "--diff", "-v", "--log-json", str(log), *extra,
        cwd=tmp_path,
    )  # fmt: skip
    output = run.stdout + run.stderr
    log_text = log.read_text()
    events = [json.loads(line) for line in log_text.splitlines()]  # every line is JSON

    # It ran: files written with diffs shown, then both hosts failed on purpose.
    assert run.returncode == 1, output
    failed = {e["host"]: e for e in events if e.get("status") == "failed"}
    assert set(failed) == {"lab01", "lab02"}
    assert "secret value (not shown)" in failed["lab01"]["msg"]
    assert failed["lab02"]["operation"].startswith("command echo 'cannot log in with ********'")
    assert "+db_password: ********" in output and "+db_password_upper: ********" in output
    assert "+API_TOKEN=********" in output
    # Short secret values are masked nowhere: they would give themselves away.
    assert "+gpu: MI308X" in output and "+pin: MI3" in output
    assert "+password_min_length: 8" in output and "MI30*" not in output
    app_conf = next(e for e in events if e.get("operation") == "template /etc/secretapp/app.conf")
    assert "+gpu: MI308X\n" in app_conf["diff"]
    for line in ("+tls_key_file: /etc/tls/node.key\n", f"+key_sha256: {'ab12' * 16}\n"):
        assert line in app_conf["diff"] and line in output  # refer to secrets: visible
    assert "+auth_key: ********\n" in app_conf["diff"] and "+********\n" in app_conf["diff"]

    # Not one secret, nor what the role made of them, in any output.
    for where, text in [("output", output), ("JSON log", log_text)]:
        for name, secret in hidden.items():
            assert secret not in text, f"{name} in the {where}"

    # On the hosts, only the files meant for them hold them (no temp file, no stray copy).
    patterns = " ".join(f"-e {shlex.quote(s)}" for s in hidden.values())
    for host in ("lab01", "lab02"):
        with fleet.connect(host) as conn:
            found = conn.run(
                f"find {WRITABLE} -xdev -type f -cnewer {MARKER} -print0 2>/dev/null"
                f" | xargs -0 -r grep -l -F {patterns} | sort"
            )
            app = conn.run("cat /etc/secretapp/app.conf").stdout
        assert found.stdout.split() == TARGETS, f"{host}: {found.stdout}{found.stderr}"
        assert f"db_password: {hidden['-e db_password']}\n" in app  # the real values, written
        assert f"admin: admin {hidden[f'{host} creds.password (nested)']}\n" in app

    # fxkit inventory masks the play's secret_vars when told the playbook, nested ones always.
    listed = fxkit(
        "inventory", "-i", str(inventory), "--list", "--playbook", str(BOOK), cwd=tmp_path
    )
    one = fxkit(
        "inventory", "-i", str(inventory), "--host", "lab01", "--secret-vars", "bmc_login",
        cwd=tmp_path,
    )  # fmt: skip
    assert listed.returncode == 0 and one.returncode == 0, listed.stderr + one.stderr
    assert json.loads(one.stdout)["pin_password"] == "MI3"
    for name, secret in hidden.items():
        assert secret not in listed.stdout + one.stdout, f"{name} in fxkit inventory"

    # A malformed -e is refused without echoing it.
    bad = fxkit(
        "play", str(BOOK), "-i", str(inventory), "-e", f'{{"db_password": "{token}x", oops',
        cwd=tmp_path,
    )  # fmt: skip
    assert bad.returncode == 2 and "-e #1" in bad.stderr
    assert token not in bad.stdout + bad.stderr and "Traceback" not in bad.stderr


GATE = """\
gate: secrets
title: Secrets gate
hosts: lab
vars:
  token_hint: "{{ registry_token[0:4] }}-{{ inventory_hostname }}"  # a slice, in a longer value
checks:
  - id: dhchap
    title: A DH-HMAC-CHAP key echoed
    why: Secret by its name (the value is a key).
    measure: {command: {run: "echo key={{ nvme_dhchap_key }}"}}
    rule: {"==": "none"}
  - id: more
    title: More secrets echoed, on stderr
    why: A failing command's output is its check's reason.
    measure:
      command:
        run: "echo {{ private_key }} {{ credentials }} {{ apikey }} {{ site_code }} >&2; exit 3"
    rule: {"==": "x"}
  - id: auth
    title: An auth key compared
    why: The rule holds a secret.
    measure: {command: {run: "echo other"}}
    rule: {"==": "{{ registry_auth_key }}"}
  - id: hint
    title: A slice of a token, compared
    why: What a template makes of a secret is secret.
    measure: {command: {run: "echo other"}}
    rule: {"!=": "{{ token_hint }}"}
  - id: visible
    title: Paths and digests stay visible
    why: They refer to secrets, they are not.
    measure: {command: {run: "echo {{ tls_key_file }} {{ rocm_host_key_sha256 }}"}}
    rule: {"contains": "{{ tls_key_file }}"}
"""


def test_fxkit_gate_masks_secrets_on_the_console_in_errors_and_reports(
    lab_fleet, tmp_path: Path
) -> None:
    fleet = lab_fleet(2)
    token = os.urandom(6).hex()
    secrets = {
        "nvme_dhchap_key": f"DHHC-1:00:{token}dhchap==",
        "registry_auth_key": f"auth-key-{token}",
        "private_key": f"-----BEGIN KEY-----{token}",
        "credentials": f"creds-{token}",
        "apikey": f"api-{token}",
        "site_code": f"site-{token}",  # by the inventory's fxkit_secret_vars
        "registry_token": f"tok{token}",
    }
    visible = {"tls_key_file": "/etc/tls/node.key", "rocm_host_key_sha256": "ab12" * 16}
    inventory = yaml.safe_load(fleet.inventory.read_text())
    inventory["all"]["vars"].update(secrets, **visible, fxkit_secret_vars=["site_*"])
    (tmp_path / "inventory.yml").write_text(yaml.safe_dump(inventory))
    (tmp_path / "gate.yml").write_text(GATE)
    hidden = {**secrets, "token_hint slice": f"tok{token[:1]}-lab01"}

    run = fxkit(
        "gate", "gate.yml", "-i", "inventory.yml", "--out", "out", "--connect-retries", "0",
        cwd=tmp_path,
    )  # fmt: skip
    output = run.stdout + run.stderr
    assert run.returncode == 1 and "Traceback" not in output, output
    assert "********" in output and "/etc/tls/node.key" in output and "ab12ab12" in output
    reports = {path.name: path.read_text() for path in (tmp_path / "out").iterdir()}
    assert set(reports) == {"result.json", "junit.xml", "report.md", "report.html"}
    for where, text in [("console", output), *reports.items()]:
        for name, secret in hidden.items():
            assert secret not in text, f"{name} in the {where}"
    result = json.loads(reports["result.json"])
    checks = {c["id"]: c for c in result["hosts"]["lab01"]["checks"]}
    assert checks["dhchap"]["value"] == "key=********" and checks["visible"]["status"] == "PASS"
    assert "token_hint" not in result["hosts"]["lab01"]["vars"]  # secret: not kept

    # A rule error quotes what Jinja2 quotes: here the key a secret looked up.
    (tmp_path / "bad.yml").write_text(
        GATE.replace('"{{ registry_auth_key }}"', '"{{ {}[registry_auth_key] }}"')
    )
    bad = fxkit("gate", "bad.yml", "-i", "inventory.yml", "--out", "bad", cwd=tmp_path)
    assert bad.returncode == 2 and "undefined variable '********'" in bad.stderr, bad.stderr
    assert secrets["registry_auth_key"] not in bad.stdout + bad.stderr
