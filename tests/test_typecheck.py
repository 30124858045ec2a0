"""The type checker guards roles: a misspelt operation, a wrong argument type or a task keyword
passed to an operation fails mypy (which `make test` runs over fxkit/ and roles/)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

api = pytest.importorskip("mypy.api", reason="mypy is in the dev extra")
ROOT = Path(__file__).resolve().parents[1]


def mypy(tmp_path: Path, code: str) -> list[str]:
    role = tmp_path / "role.py"
    role.write_text(textwrap.dedent(code))
    out, err, _ = api.run(
        ["--config-file", str(ROOT / "pyproject.toml"), "--no-error-summary", str(role)]
    )
    assert not err, err
    mine = [line for line in out.splitlines() if line.startswith(f"{role}:")]
    return [line.split(": error: ", 1)[1] for line in mine if ": error: " in line]


HEADER = """
    from fxkit.engine.role import Host
    from fxkit.engine.variables import HostVars

    def apply(host: Host, v: HostVars) -> None:
"""


@pytest.mark.slow
def test_a_well_typed_role_passes_and_mistakes_fail(tmp_path: Path) -> None:
    good = mypy(
        tmp_path,
        HEADER
        + """
        host.directory("/etc/fxkit", mode="0755")
        host.task("limits", tags=["tuning"]).line("/etc/limits.conf", "x", regexp="^x")
        host.command("nvme list", unless="true").data.get("stdout")
    """,
    )
    assert good == []
    bad = mypy(
        tmp_path,
        HEADER
        + """
        host.dirctory("/etc/fxkit")
        host.directory(755)
        host.file("/etc/x", content="a", ignore_errors=True)
    """,
    )
    assert len(bad) == 3, bad
    assert '"Host" has no attribute "dirctory"' in bad[0]
    assert 'incompatible type "int"; expected "str"' in bad[1]
    assert 'Unexpected keyword argument "ignore_errors"' in bad[2]
