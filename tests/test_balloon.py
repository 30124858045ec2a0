"""fxkit.loadbench.balloon: a virtio balloon's free page reporting, read from a sysfs tree laid out
as the kernel does (``features`` as this VM's: /sys/bus/virtio/drivers/virtio_balloon/virtio0/
features on Linux 6.18, 5 Dec 2026, a string of 0/1 with bit 0 first), and from the real /sys."""

from __future__ import annotations

from pathlib import Path

import pytest

from fxkit.loadbench import balloon

# This VM's balloon: STATS_VQ (1), DEFLATE_ON_OOM (2), REPORTING (5), VERSION_1 (32).
FEATURES = "0110010" + "0" * 25 + "1" + "0" * 95


def _sysfs(root: Path, features: str | None, **params: str) -> Path:
    if features is not None:
        device = root / "bus/virtio/drivers/virtio_balloon/virtio0"
        device.mkdir(parents=True)
        (device / "features").write_text(features + "\n")
    folder = root / "module/page_reporting/parameters"
    folder.mkdir(parents=True)
    for name, value in params.items():
        (folder / name).write_text(value + "\n")
    return root


def test_a_balloon_that_reports_free_pages_says_so_with_its_settings(tmp_path: Path) -> None:
    root = _sysfs(tmp_path, FEATURES, page_reporting_order="9", min_free_ms="0",
                 reported_kib="353617628")  # fmt: skip
    assert balloon.reporting(root) == "on (page_reporting_order 9, min_free_ms 0)"
    assert balloon.reported_bytes(root) == 353617628 * 1024


def test_upstreams_kernel_shows_only_the_order_and_counts_nothing(tmp_path: Path) -> None:
    root = _sysfs(tmp_path, FEATURES, page_reporting_order="9")
    assert balloon.reporting(root) == "on (page_reporting_order 9)"
    assert balloon.reported_bytes(root) is None


@pytest.mark.parametrize("features", [None, FEATURES[:5] + "0" + FEATURES[6:], "01100"])
def test_no_balloon_or_one_without_reporting_is_none(tmp_path: Path, features: str | None) -> None:
    root = _sysfs(tmp_path, features, page_reporting_order="9", reported_kib="12")
    assert balloon.reporting(root) is None


def test_an_unreadable_counter_is_none(tmp_path: Path) -> None:
    assert balloon.reported_bytes(_sysfs(tmp_path, FEATURES, reported_kib="n/a")) is None


def test_this_machine() -> None:
    """The real /sys: a VM whose balloon reports says on, with the order its kernel shows."""
    devices = sorted(Path("/sys/bus/virtio/drivers/virtio_balloon").glob("virtio*/features"))
    if not any(f.read_text()[balloon.REPORTING_BIT : balloon.REPORTING_BIT + 1] == "1"
               for f in devices):  # fmt: skip
        assert balloon.reporting() is None
        pytest.skip("no virtio balloon that reports free pages here (bare metal or no feature)")
    order = Path("/sys/module/page_reporting/parameters/page_reporting_order").read_text().strip()
    assert (balloon.reporting() or "").startswith(f"on (page_reporting_order {order}")
    counted = balloon.reported_bytes()
    assert counted is None or counted >= 0
