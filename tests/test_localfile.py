"""write_whole: a file on this machine is the old one or the new one, and the temporary file
it goes through is new (a link planted beside it is never followed) and never left behind."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fxkit.localfile import write_whole


def test_a_link_planted_where_the_temporary_file_was_is_not_followed(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep")
    (tmp_path / ".report.json.tmp").symlink_to(victim)  # the name an older fxkit used
    write_whole(tmp_path / "report.json", "new\n")
    assert victim.read_text() == "keep"
    assert (tmp_path / "report.json").read_text() == "new\n"
    umask = os.umask(0)
    os.umask(umask)
    assert (tmp_path / "report.json").stat().st_mode & 0o777 == 0o666 & ~umask  # as open() makes
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".report.json.tmp",
        "report.json",
        "victim",
    ]


def test_a_file_written_again_keeps_its_mode(tmp_path: Path) -> None:
    path = tmp_path / "result.json"
    path.write_text("old")
    path.chmod(0o600)  # the user's choice: a result only they read
    write_whole(path, "new")
    assert path.stat().st_mode & 0o777 == 0o600 and path.read_text() == "new"


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "report.json"
    path.write_text("old")
    with pytest.raises(UnicodeEncodeError):
        write_whole(path, "half \udc80")
    assert path.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]
