"""checkpoints.stage on this machine: it reads what ``fxkit stage --json`` prints as the models of
fxkit.staging_report declare it (a round trip through the real CLI), and a malformed report from
the host fails the task naming each wrong key and what was wanted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from fxkit.connection.local import LocalConnection
from fxkit.facts.base import FactCache
from fxkit.ops.base import OpContext, Status
from fxkit.ops.checkpoints import stage
from fxkit.staging_report import PlanReport, Summary

FXKIT = str(Path(sys.executable).with_name("fxkit"))


def make_ctx(check: bool = False) -> OpContext:
    conn = LocalConnection("localhost")
    return OpContext(conn, FactCache(conn), check=check)


def make_model(tmp_path: Path) -> Path:
    source = tmp_path / "model"
    (source / "original").mkdir(parents=True)
    (source / "model.safetensors").write_bytes(b"x" * 300_000)
    (source / "original" / "params.json").write_text('{"dim": 8}\n')
    return source


def cli(*args: str | Path) -> str:
    return subprocess.run(
        [FXKIT, "stage", *map(str, args)], capture_output=True, text=True, check=True
    ).stdout


def test_the_operation_reads_what_the_cli_writes(tmp_path: Path) -> None:
    source, dest = make_model(tmp_path), tmp_path / "fast"
    printed = cli(source, dest, "--plan", "--json")
    plan = PlanReport.read(printed, "fxkit stage --plan --json")
    assert json.dumps(plan.to_json()) == printed.strip()  # read and written back: the same line
    assert plan.to_copy == ["model.safetensors", "original/params.json"] and plan.files == 2

    preview = stage(make_ctx(check=True), str(source), str(dest), command=FXKIT)
    assert preview.status is Status.CHANGED and not dest.exists()
    assert preview.msg == f"would stage 2 files (0.00 GB) from {source}"
    assert preview.data["plan"] == json.loads(printed)

    done = stage(make_ctx(), str(source), str(dest), command=FXKIT)
    assert done.status is Status.CHANGED, done.msg
    summary = Summary.model_validate(done.data["summary"])
    assert (summary.copied, summary.bytes_copied, summary.checksum) == (2, 300_011, "blake3")
    assert done.msg.startswith("staged 2 files (0.00 GB) in ") and done.msg.endswith("0 skipped")

    again = stage(make_ctx(), str(source), str(dest), command=FXKIT)
    assert (again.status, again.msg) == (Status.OK, "2 files staged already")
    assert again.data["plan"]["skip"] == 2


def fake_fxkit(tmp_path: Path, plan: str, summary: str = "") -> str:
    """A command that prints ``plan`` for ``stage ... --plan --json``, else ``summary``."""
    script = tmp_path / "fxkit"
    script.write_text(
        "#!/bin/sh\n"
        "case \"$*\" in *--plan*) cat <<'EOF'\n"
        f"{plan}\nEOF\n;; *) cat <<'EOF'\n{summary}\nEOF\n;; esac\n"
    )
    script.chmod(0o755)
    return str(script)


def test_a_malformed_plan_names_each_wrong_key_and_what_was_wanted(tmp_path: Path) -> None:
    plan = {"plan": True, "source": "/nfs/m", "dest": "/fast/m", "files": "2", "copy": "a"}
    command = fake_fxkit(tmp_path, "progress...\n" + json.dumps(plan))
    result = stage(make_ctx(), "/nfs/m", "/fast/m", command=command)
    assert result.status is Status.FAILED
    first, hint = result.msg.splitlines()
    assert first == (
        f"{command} stage --plan --json printed a plan this fxkit cannot read: "
        "files: Input should be a valid integer (got '2'); "
        "copy: Input should be a valid list (got 'a'); check: missing; skip: missing; "
        "bytes_to_copy: missing; bytes_to_check: missing"
    )
    assert (
        hint.strip()
        == "hint: the host's fxkit and this one differ: install this fxkit's version there"
    )

    nothing = stage(make_ctx(), "/nfs/m", "/fast/m", command=fake_fxkit(tmp_path, "no JSON here"))
    assert nothing.status is Status.FAILED
    assert "stage --plan --json printed no JSON object: 'no JSON here\\n'" in nothing.msg


def test_a_malformed_summary_fails_after_the_copy_naming_the_key(tmp_path: Path) -> None:
    plan = PlanReport(
        source="/nfs/m", dest="/fast/m", files=1, copy=["a"], check=[], skip=0,
        bytes_to_copy=1, bytes_to_check=0,
    )  # fmt: skip
    summary = {"source": "/nfs/m", "dest": "/fast/m", "files": 1, "copied": -1, "checksum": 5}
    command = fake_fxkit(tmp_path, json.dumps(plan.to_json()), json.dumps(summary))
    result = stage(make_ctx(), "/nfs/m", "/fast/m", command=command)
    assert result.status is Status.FAILED and result.data["plan"] == plan.to_json()
    assert result.msg.splitlines()[0] == (
        f"{command} stage --json printed a summary this fxkit cannot read: "
        "copied: Input should be greater than or equal to 0 (got -1); "
        "checksum: Input should be a valid string (got 5)"
    )
