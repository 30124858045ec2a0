"""``fxkit lab up --like``'s choice of hosts and profiles (fxkit/lab/like.py), on the example
inventory, without starting a host: defaults by group, the command's mapping, faults, and a
clear error for each mistake."""

from __future__ import annotations

from pathlib import Path

import pytest

from fxkit.lab.fleet import LabError
from fxkit.lab.like import faults, shape

INVENTORY = str(Path(__file__).resolve().parent.parent / "inventory" / "mi308x.yml")


def test_gpu_nodes_are_mi308x_and_targets_storage_targets_by_default() -> None:
    shaped = shape([INVENTORY])
    assert shaped.profiles == {
        "gpu01": "mi308x", "gpu02": "mi308x", "gpu03": "mi308x", "gpu04": "mi308x",
        "nvme-tgt01": "storage-target", "nvme-tgt02": "storage-target",
    }  # fmt: skip
    assert shaped.groups["gpu03"] == ["gpu_nodes", "gpu_rack2"]


def test_the_commands_mapping_the_limit_and_a_fault() -> None:
    """A group's profile from the command; a fault is a variant of the host's own profile."""
    shaped = shape([INVENTORY], "gpu_rack2:nvme-tgt01", ["gpu_rack2=mi308x-thor2"], ["gpu04=nvm"])
    assert shaped.profiles == {
        "gpu03": "mi308x-thor2", "gpu04": "mi308x-thor2-nvm", "nvme-tgt01": "storage-target",
    }  # fmt: skip
    assert shaped.faults == {"gpu04": "nvm"}
    with pytest.raises(LabError, match="mi308x-thor2 has no fault 'nic-half'"):
        shape([INVENTORY], "gpu04", ["gpu_rack2=mi308x-thor2"], ["gpu04=nic-half"])


@pytest.mark.parametrize(
    ("limit", "mapping", "fault", "message"),
    [
        ("gpu09", [], [], "no host of"),
        (None, ["gpu_nodes=mi999x"], [], "there is no lab profile 'mi999x'"),
        (None, [], ["gpu09=gpu-link-x8"], "no lab host gpu09"),
        (None, [], ["gpu01=melted"], "mi308x has no fault 'melted'"),
        (None, [], ["gpu01"], "not HOST=FAULT"),
    ],
)
def test_each_mistake_is_named(limit, mapping, fault, message) -> None:
    with pytest.raises(LabError, match=message):
        shape([INVENTORY], limit, mapping, fault)


def test_faults_are_the_profiles_variants() -> None:
    assert {"gpu-link-x8", "gpu-fatal-err", "nic-half", "slow"} <= set(faults("mi308x"))
    assert faults("storage-target") == []
