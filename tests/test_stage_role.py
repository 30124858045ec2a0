"""The model_stage role on a real lab host: ``fxkit stage`` runs on the host (from a folder in
it, as from an NFS mount), check mode leaves the host as it was, a re-run changes nothing, a
removed file is staged again, a bad source fails the host with fxkit's message.

fxkit is not installed on lab hosts, so the test unpacks fxkit and the packages its CLI imports
(taken from this virtualenv) into /opt/fxkit-stage on the host; the host's own python3 (this
machine's /usr, the same 3.11 as the virtualenv) runs it."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from fxkit.lab import Fleet
from tests.lab_helpers import events_of, sh
from tests.test_play_lab import cli_play

pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parents[1]
BUNDLE = "/opt/fxkit-stage"
COMMAND = f"PYTHONPATH={BUNDLE} python3 -m fxkit"
SOURCE, DEST = "/srv/nfs/models/llama", "/srv/fast/models/llama"


def fxkit_bundle() -> bytes:
    """A tar of fxkit (its loader as fxkit/loader) and the top-level modules of
    site-packages that ``import fxkit.cli`` loads."""
    site = next(p for p in sys.path if p.endswith("site-packages"))
    probe = (
        "import sys, fxkit.cli, fxkit.staging\n"
        "for m in list(sys.modules.values()):\n"
        "    f = getattr(m, '__file__', None) or ''\n"
        f"    if f.startswith({site!r}): print(f[{len(site) + 1}:].split('/')[0])\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    tops = {t for t in out.stdout.split() if not t.startswith(("__editable__", "_distutils"))}
    skip = lambda info: None if "__pycache__" in info.name else info  # noqa: E731
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        tar.add(REPO / "fxkit", "fxkit", filter=skip)
        tar.add(REPO / "loader", "fxkit/loader", filter=skip)
        for top in sorted(tops):
            tar.add(Path(site, top), top, filter=skip)
    return buffer.getvalue()


@pytest.fixture(scope="module")
def fleet(lab_fleet) -> Fleet:
    fleet = lab_fleet(1)
    with fleet.connect("lab01") as conn:
        result = conn.run(f"rm -rf {BUNDLE} && mkdir -p {BUNDLE} && tar -xf - -C {BUNDLE}",
                          stdin=fxkit_bundle())  # fmt: skip
        assert result.ok, result.stderr
        sh(
            conn,
            f"rm -rf {SOURCE} /srv/fast && mkdir -p {SOURCE}/original && cd {SOURCE} && "
            "head -c 12000000 /dev/urandom > model-00001.safetensors && "
            "head -c 5000000 /dev/urandom > model-00002.safetensors && "
            "echo '{}' > config.json && echo '{\"dim\": 8}' > original/params.json",
        )
    return fleet


def playbook(tmp_path: Path, source: str = SOURCE) -> Path:
    path = tmp_path / "stage.yml"
    path.write_text(
        "- hosts: lab01\n"  # the shared fleet may have more hosts: fxkit is on this one
        "  roles:\n"
        "    - role: model_stage\n"
        f"      model_stage_source: {source}\n"
        f"      model_stage_dest: {DEST}\n"
        f"      model_stage_command: {COMMAND}\n"
        "      model_stage_jobs: 2\n"
    )
    return path


def tree(fleet: Fleet) -> str:
    """Every file under /srv/fast with its size, mtime and sha256 (empty when none)."""
    with fleet.connect("lab01") as conn:
        return conn.run(
            "find /srv/fast -printf '%p %y %s %T@\\n' 2>/dev/null | sort; "
            "find /srv/fast -type f -exec sha256sum {} + 2>/dev/null | sort"
        ).stdout


def test_stages_on_the_host_and_check_mode_changes_nothing(fleet: Fleet, tmp_path: Path) -> None:
    book, log = playbook(tmp_path), tmp_path / "log.json"
    with fleet.connect("lab01") as conn:
        sh(conn, "rm -rf /srv/fast")

    before = tree(fleet)
    preview = cli_play(book, fleet.inventory, log, "--check")
    assert preview.code == 0, preview.output
    [(op, msg)] = events_of(preview, "lab01", "changed")
    assert op.startswith("stage ") and "would stage 4 files (0.02 GB)" in msg
    assert tree(fleet) == before  # nothing made, not even the folder

    applied = cli_play(book, fleet.inventory, log)
    assert applied.code == 0, applied.output
    [(_, msg)] = events_of(applied, "lab01", "changed")
    assert "staged 4 files" in msg and "GB/s" in msg
    with fleet.connect("lab01") as conn:
        sums = f"cd {SOURCE} && find . -type f | sort | xargs sha256sum"
        assert sh(conn, sums) == sh(
            conn, sums.replace(SOURCE, DEST).replace("-type f", "-type f ! -name '.*'")
        )

    staged = tree(fleet)
    again = cli_play(book, fleet.inventory, log)
    assert again.code == 0 and events_of(again, "lab01", "changed") == []
    assert [m for _, m in events_of(again, "lab01", "ok")] == ["4 files staged already"]
    assert tree(fleet) == staged

    with fleet.connect("lab01") as conn:
        sh(conn, f"rm {DEST}/config.json")
    gone = tree(fleet)
    preview = cli_play(book, fleet.inventory, log, "--check")
    assert "would stage 1 files" in events_of(preview, "lab01", "changed")[0][1]
    assert tree(fleet) == gone
    fixed = cli_play(book, fleet.inventory, log)
    assert "staged 1 files" in events_of(fixed, "lab01", "changed")[0][1]


def test_a_missing_source_fails_the_host_with_fxkit_s_message(fleet: Fleet, tmp_path: Path) -> None:
    run = cli_play(playbook(tmp_path, "/srv/nfs/no-such-model"), fleet.inventory,
                   tmp_path / "log.json")  # fmt: skip
    assert run.code != 0
    [(_, msg)] = events_of(run, "lab01", "failed")
    assert "/srv/nfs/no-such-model: the source does not exist" in msg
    assert "Traceback" not in msg
    assert json.dumps(run.events)  # the JSON log holds it
