"""attribute: the compare and normalise logic on temp files (LocalConnection), real sysfs files of
this machine read in check mode only (nothing here writes to the real /sys), and /dev/null as an
attribute that does not keep what is written. Over SSH on a lab host, whose /sys is read-only:
tests/test_ops_lab_sysfs.py."""

from __future__ import annotations

import glob
import os
from pathlib import Path

import pytest

from fxkit.connection.local import LocalConnection
from fxkit.facts import FactCache
from fxkit.facts.sysfs import normalize_attribute
from fxkit.ops.base import OpContext, OpError, Status
from fxkit.ops.sysfs import attribute


def make_ctx(check: bool = False, diff: bool = True) -> OpContext:
    conn = LocalConnection("localhost")
    return OpContext(conn, FactCache(conn), check=check, diff=diff)


def test_normalize() -> None:
    # The scheduler file of this machine's disks reads "[none] mq-deadline kyber bfq " (with the
    # trailing space), the kernel's block/elevator.c format.
    assert normalize_attribute("[none] mq-deadline kyber bfq \n") == "none"
    assert normalize_attribute("none [mq-deadline] kyber\n") == "mq-deadline"
    assert normalize_attribute("65536\n") == "65536"
    assert normalize_attribute("RoCE v2\n") == "RoCE v2"  # rdma_cm default_roce_mode
    assert normalize_attribute("[a] [b]\n") == "[a] [b]"  # not a choice list: kept as it is


def test_attribute_on_a_file_check_apply_again(tmp_path: Path) -> None:
    path = tmp_path / "scheduler"
    path.write_text("none [mq-deadline] kyber\n")
    assert attribute(make_ctx(), str(path), "mq-deadline").msg == f"{path} is mq-deadline"
    preview = attribute(make_ctx(check=True), str(path), "kyber")
    assert preview.changed and preview.msg == f"would set {path} to kyber"
    assert preview.diff == f"{path}: mq-deadline -> kyber\n"
    assert preview.data["commands"] == [f"printf '%s' kyber > {path}"]
    assert path.read_text() == "none [mq-deadline] kyber\n"
    applied = attribute(make_ctx(), str(path), "kyber")
    assert applied.changed and applied.msg == f"set {path} to kyber"
    assert path.read_text() == "kyber"
    assert attribute(make_ctx(), str(path), "kyber").status is Status.OK
    assert attribute(make_ctx(), str(path), 1).changed and path.read_text() == "1"
    assert attribute(make_ctx(), str(path), True).status is Status.OK  # True is written as 1


def test_values_are_quoted(tmp_path: Path) -> None:
    path = tmp_path / "model"
    path.write_text("Linux\n")
    assert attribute(make_ctx(), str(path), "FX100 $(touch x); `id`").changed
    assert path.read_text() == "FX100 $(touch x); `id`"
    assert sorted(os.listdir(tmp_path)) == ["model"]


def test_what_cannot_be_written_is_skipped_with_the_reason(tmp_path: Path) -> None:
    path = tmp_path / "carrier"
    path.write_text("1\n")
    path.chmod(0o444)
    result = attribute(make_ctx(), str(path), "0")
    assert result.status is Status.SKIPPED
    assert result.msg == f"the attribute is read-only (mode 0444): {path} stays 1 (wanted 0)"
    missing = attribute(make_ctx(), str(tmp_path / "ib0" / "mtu"), 4096)
    assert missing.status is Status.SKIPPED
    assert missing.msg.endswith("does not exist on this host (no such device, driver or object)")


def test_a_value_the_kernel_does_not_keep_fails() -> None:
    # /dev/null takes every write and reads back empty: as an attribute that stores another form.
    result = attribute(make_ctx(), "/dev/null", "4096")
    assert result.failed
    assert result.msg.startswith("wrote '4096' to /dev/null but it reads ''")


def test_bad_values() -> None:
    for value in ("", "a\nb", "  "):
        with pytest.raises(OpError, match="bad value"):
            attribute(make_ctx(), "/tmp/x", value)


@pytest.mark.skipif(not glob.glob("/sys/block/*/queue/scheduler"), reason="no block devices here")
def test_real_sysfs_scheduler_in_check_mode() -> None:
    path = sorted(glob.glob("/sys/block/*/queue/scheduler"))[0]
    current = normalize_attribute(Path(path).read_text())
    assert attribute(make_ctx(check=True), path, current).status is Status.OK
    other = "mq-deadline" if current != "mq-deadline" else "none"
    preview = attribute(make_ctx(check=True), path, other)
    mounts = Path("/proc/mounts").read_text().splitlines()
    sys_options = [line.split()[3] for line in mounts if line.split()[1] == "/sys"]
    if "ro" in sys_options[-1].split(","):
        assert preview.status is Status.SKIPPED, preview
        assert preview.msg.startswith("/sys is mounted read-only on this host: ")
    else:
        assert preview.changed and preview.diff == f"{path}: {current} -> {other}\n", preview
    assert normalize_attribute(Path(path).read_text()) == current
