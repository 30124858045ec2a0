"""roles/nic_firmware: variables checked first, mlxconfig's table and niccli's answer read, the
commands it reports or runs, and runs on lab hosts (the mlxconfig and niccli stand-ins keep the
NVM's values; a set changes the next boot's value only, as on the NICs).

Sources: mlxconfig's output, Mellanox/mstflint mlxconfig/mlxcfg_ui.cpp at b9d9e844
(printOpening, printConfHeader, printSingleParam) and real `mlxconfig -d DEV query` outputs
(TerrenceMiao/blog 625b3aef source/_posts/Configure-and-setup-Mellanox-network-adapter.md, a
ConnectX-4; a ConnectX-5 dump, tests/data/reference/mlxconfig_query_connectx5_excerpt.txt and
its SOURCES.md); the set syntax `mlxconfig -y -d DEV set K=V`
(ROCm/system-acceptance-docs docs/network/nic-installation.md, "MLX Config"); niccli's syntax,
ROCm/gpu-cluster-networking docs/how-to/single-node-config.rst at 26650997 (`niccli -dev=$i
getoption -name support_rdma -scope 0`, `setoption ... -value 1`). niccli's answer has no
published sample (see the role README).
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from fxkit.engine.role import RoleLoader
from fxkit.engine.variables import HostVars, Layer
from fxkit.errors import VarError
from fxkit.facts.base import FactError
from fxkit.facts.nicfw import Value, last_number, parse_mlxconfig
from fxkit.lab import Fleet, calls
from tests.role_play import by_operation, play, snapshot, statuses

ROLES = Path(__file__).resolve().parents[1] / "roles"
ROLE = RoleLoader([ROLES]).load("nic_firmware")
R: ModuleType = sys.modules[ROLE.apply.__module__]


def typed(**values: Any) -> Any:
    v = ROLE.typed(
        HostVars("gpu01", [Layer("role defaults", ROLE.defaults), Layer("inventory", values)])
    )
    R.validate(v)
    return v


# -- reading mlxconfig ----------------------------------------------------------------------------

#: A real ConnectX-5 `mlxconfig -d /dev/mst/mt4119_pciconf0 query` (no -e), 11 of its lines.
CONNECTX5 = (
    Path(__file__).parent / "data" / "reference" / "mlxconfig_query_connectx5_excerpt.txt"
).read_text()

#: With -e, as mlxcfg_ui.cpp prints it: a diff mark, the RO mark, Default, Current, Next Boot.
VERBOSE = (
    "Configurations:"
    + " " * 41
    + "Default"
    + " " * 14
    + "Current"
    + " " * 14
    + "Next Boot\n"
    + "*       PCI_WR_ORDERING"
    + " " * 33
    + "per_mkey(0)"
    + " " * 10
    + "per_mkey(0)"
    + " " * 10
    + "force_relax(1)\n"
    + " RO     NUM_OF_PF"
    + " " * 39
    + "1"
    + " " * 20
    + "1"
    + " " * 20
    + "1\n"
    + "The '*' shows parameters with next value different from default/current value.\n"
)


def test_the_next_boot_table_is_read() -> None:
    params = parse_mlxconfig(CONNECTX5, "mt4119_pciconf0")
    assert params["ATS_ENABLED"].next == Value("False(0)")
    assert params["ROCE_CONTROL"].next.number == 2
    assert params["ROCE_CC_PRIO_MASK_P1"].next.number == 255
    assert params["HOST_CHAINING_DESCRIPTORS"].next.number is None
    assert params["ATS_ENABLED"].current is None  # no -e: what runs now is not shown
    assert len(params) == 11 and params["CNP_DSCP_P1"].next.number == 48


def test_default_current_and_next_boot_are_read() -> None:
    params = parse_mlxconfig(VERBOSE, "mlx5_0")
    ordering = params["PCI_WR_ORDERING"]
    assert (ordering.default, ordering.current, ordering.next) == (
        Value("per_mkey(0)"),
        Value("per_mkey(0)"),
        Value("force_relax(1)"),
    )
    assert params["NUM_OF_PF"].next.number == 1 and set(params) == {"PCI_WR_ORDERING", "NUM_OF_PF"}
    with pytest.raises(FactError, match="no `Configurations:` table"):
        parse_mlxconfig("-E- Failed to open device\n", "mlx5_0")


def test_niccli_answers_are_read_by_their_last_number() -> None:
    assert last_number("support_rdma (scope 0) = 1") == 1
    assert last_number("pcie_relaxed_ordering: 0x1") == 1
    assert last_number("ens26np0 - 0") == 0
    assert last_number("Error: no value") is None


# -- variables and commands -----------------------------------------------------------------------


def test_the_defaults_are_the_guides_values() -> None:
    v = typed()
    assert v.nic_firmware_mlxconfig == {
        "P2P_ORDERING_MODE": 1,
        "RDMA_SELECTIVE_REPEAT_EN": 1,
        "PCI_WR_ORDERING": 1,
        "ATS_ENABLED": 1,
    }
    assert [(o.name, o.scope, o.value) for o in v.nic_firmware_niccli] == [
        ("pcie_relaxed_ordering", None, 1),
        ("support_rdma", 0, 1),
        ("support_rdma", 1, 1),
        ("performance_profile", None, 1),
    ]
    assert (v.nic_firmware_write, v.nic_firmware_on_difference) == (False, "fail")


@pytest.mark.parametrize(
    "values, where, words",
    [
        ({"nic_firmware_mlxconfig": {"ats_enabled": 1}}, "nic_firmware_mlxconfig", "mlxconfig"),
        ({"nic_firmware_mlxconfig": {"ATS_ENABLED": -1}}, "nic_firmware_mlxconfig", "greater"),
        ({"nic_firmware_mlxconfig": {"ATS_ENABLED": True}}, "nic_firmware_mlxconfig", "boolean"),
        (
            {"nic_firmware_niccli": [{"name": "Support RDMA", "value": 1}]},
            "nic_firmware_niccli",
            "niccli",
        ),
        ({"nic_firmware_niccli": [{"name": "support_rdma"}]}, "nic_firmware_niccli", "value"),
        (
            {"nic_firmware_niccli": [{"name": "x", "value": 1}, {"name": "x", "value": 0}]},
            "nic_firmware_niccli[1]",
            "listed twice",
        ),
        ({"nic_firmware_write": "maybe"}, "nic_firmware_write", "'maybe'"),
        ({"nic_firmware_on_difference": "warn"}, "nic_firmware_on_difference", "'warn'"),
        ({"nic_firmware_devices": ["mlx5 0"]}, "nic_firmware_devices", "RDMA device"),
    ],
)
def test_wrong_variables_name_host_and_variable(values: dict, where: str, words: str) -> None:
    with pytest.raises(VarError) as caught:
        typed(**values)
    assert caught.value.where.startswith(f"gpu01: {where}")
    assert words in caught.value.message, caught.value.message


def test_the_commands_are_the_guides() -> None:
    nic = R.Nic("mlx5_0", "ens6np0", "connectx", "0000:0c:00.0")
    argv = shlex.split(R.mlx_set(nic.target, {"ATS_ENABLED": 1, "PCI_WR_ORDERING": 1}))
    assert argv == [
        "mlxconfig",
        "-y",
        "-d",
        "0000:0c:00.0",
        "set",
        "ATS_ENABLED=1",
        "PCI_WR_ORDERING=1",
    ]
    assert "mlxfwreset -d 0000:0c:00.0 reset" in R.reset_hint(nic)


# -- on lab hosts ---------------------------------------------------------------------------------

CONNECTX = [f"mlx5_{i}" for i in (0, 1, 2, 3, 4, 5, 6, 9)]
WRITE = {"nic_firmware_write": True, "nic_firmware_on_difference": "report"}


def sets(fleet: Fleet, tool: str) -> list[list[str]]:
    with fleet.connect("lab01") as conn:
        return [
            c["argv"] for c in calls(conn) if c["argv"][0] == tool and "set" in " ".join(c["argv"])
        ]


def query(fleet: Fleet, device: str) -> dict[str, Any]:
    with fleet.connect("lab01") as conn:
        shown = conn.run(f"mlxconfig -e -d {device} query").stdout
    return parse_mlxconfig(shown, device)


@pytest.mark.lab
def test_connectx_differences_are_reported_then_written_when_asked(
    lab_fleet, tmp_path: Path
) -> None:
    fleet = lab_fleet(1, name="nicfw", profile="mi308x-frontend-bond")
    before = snapshot(fleet)
    code, tasks = play(tmp_path, fleet, "nic_firmware", {})
    assert code != 0 and snapshot(fleet) == before and sets(fleet, "mlxconfig") == []
    ops = by_operation(tasks)
    assert {op for op in ops if op.startswith("NVM of")} == {f"NVM of {d}" for d in CONNECTX}
    assert ops["NVM of mlx5_0"]["status"] == "failed"  # every device read before the host fails
    msg = ops["NVM of mlx5_0"]["msg"]
    assert "ATS_ENABLED is False(0), wanted 1" in msg and "PCI_WR_ORDERING is per_mkey(0)" in msg
    assert "fix: `mlxconfig -y -d mlx5_0 set P2P_ORDERING_MODE=1 RDMA_SELECTIVE_REPEAT_EN=1" in msg
    assert "firmware reset (`mlxfwreset -d mlx5_0 reset`) or a reboot" in msg
    assert ops["fail"]["msg"].startswith("8 NIC firmware check(s) failed")

    code, reported = play(tmp_path, fleet, "nic_firmware", {"nic_firmware_on_difference": "report"})
    assert code == 0 and statuses(reported) == {"ok": 8} and snapshot(fleet) == before

    code, checked = play(tmp_path, fleet, "nic_firmware", WRITE, "--check")
    assert code == 0 and statuses(checked)["changed"] == 8 and snapshot(fleet) == before

    code, first = play(tmp_path, fleet, "nic_firmware", WRITE)
    ops = by_operation(first)
    assert code == 0 and statuses(first)["changed"] == 8
    assert "the firmware uses them after a firmware reset" in ops["NVM of mlx5_3"]["msg"]
    assert "still uses" in ops["firmware in force on mlx5_3"]["msg"]  # honest: pending reset
    assert len(sets(fleet, "mlxconfig")) == 8
    read = query(fleet, "mlx5_3")
    assert {k: read[k].next.number for k in R.AMD_MLXCONFIG} == R.AMD_MLXCONFIG
    assert read["ATS_ENABLED"].current == Value("False(0)")  # the running value waits for a reset
    assert "mlx5_bond_0" not in json.dumps(first)  # the front-end is left out

    code, again = play(tmp_path, fleet, "nic_firmware", WRITE)
    assert code == 0 and statuses(again)["changed"] == 0 and len(sets(fleet, "mlxconfig")) == 8


@pytest.mark.lab
def test_thor2_options_through_niccli(lab_fleet, tmp_path: Path) -> None:
    fleet = lab_fleet(1, name="nicfw-thor2", profile="mi308x-thor2-nvm")
    before = snapshot(fleet)
    code, checked = play(tmp_path, fleet, "nic_firmware", WRITE, "--check")
    assert code == 0 and statuses(checked)["changed"] == 8 and snapshot(fleet) == before
    code, first = play(tmp_path, fleet, "nic_firmware", WRITE)
    assert code == 0 and statuses(first)["changed"] == 8, first
    ops = by_operation(first)
    assert "the NIC uses it after a reboot" in ops["NVM support_rdma of ens27np1"]["msg"]
    assert [
        "niccli",
        "-dev=ens26np0",
        "setoption",
        "-name",
        "support_rdma",
        "-scope",
        "1",
        "-value",
        "1",
    ] in sets(fleet, "niccli")
    code, again = play(tmp_path, fleet, "nic_firmware", WRITE)
    assert code == 0 and statuses(again) == {"ok": 8}


@pytest.mark.lab
def test_a_wrong_variable_touches_no_host(lab_fleet, tmp_path: Path) -> None:
    fleet = lab_fleet(1, name="nicfw", profile="mi308x-frontend-bond")
    before = snapshot(fleet)
    with pytest.raises(VarError) as caught:
        play(tmp_path, fleet, "nic_firmware", {"nic_firmware_mlxconfig": {"ATS_ENABLED": "on"}})
    assert caught.value.where.startswith("lab01: nic_firmware_mlxconfig")
    events = (tmp_path / "log.jsonl").read_text().splitlines()
    assert not [e for e in map(json.loads, events) if e["event"] == "task"]
    assert snapshot(fleet) == before


@pytest.mark.lab
def test_without_rdma_a_lab_host_skips_and_another_host_fails_untouched(
    lab_fleet, tmp_path: Path
) -> None:
    fleet = lab_fleet(1, name="nicfw-plain")  # no profile: no RDMA in its kernel namespace
    before = snapshot(fleet)
    code, skipped = play(tmp_path, fleet, "nic_firmware", {})
    assert code == 0 and [t["status"] for t in skipped] == ["skipped"]
    assert skipped[0]["msg"].startswith("NIC firmware: ")
    code, failed = play(tmp_path, fleet, "nic_firmware", {"fxkit_lab": False})
    assert code != 0 and [t["status"] for t in failed] == ["failed"]
    assert "not marked as a lab host" in failed[0]["msg"]
    assert snapshot(fleet) == before
