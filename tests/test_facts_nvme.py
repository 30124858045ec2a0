"""NVMe facts: ``nvme list`` and ``nvme list-subsys`` in both nvme-cli shapes, native multipath,
the nvmet configfs tree read back into nvmetcli's config.json structure, blkid, and NQNs.

Real outputs and configs from tests/data/reference/ (copied from /work/shared/reference/; see
SOURCES.md there):

- nvme_list_o_json_nvmecli2x.json: vast-data/vast-csi, vast_csi/block_utils.py (docstring of
  list_nvme_devices), real nvme-cli 2.x output;
- nvme_list_o_json_nvmecli1x.json: dell/gonvme test data, nvme-cli 1.x shape;
- nvmetcli_{rdma,tcp,loop}.json: linux-nvme/nvmetcli at 7a94d925 (rdma.json, tcp.json,
  examples/loop.json), the configs ``nvmetcli restore`` reads.

No captured ``list-subsys`` output is among them: its samples below are written field by field
after nvme-cli's printers (json_print_nvme_subsystem_list in nvme-print.c of v1.8 and v1.16, and
of v2.3 / nvme-print-json.c of v2.8), and say so. The facts' commands run for real through
LocalConnection, with stand-in ``nvme`` scripts on PATH that print those files.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from fxkit.connection.base import RunResult
from fxkit.connection.local import LocalConnection
from fxkit.facts.base import Fact, FactError
from fxkit.facts.filesystems import BlockSignature
from fxkit.facts.lab import SEPARATOR
from fxkit.facts.nvme import (
    NvmeList,
    NvmeListSubsys,
    NvmeMultipath,
    nqn_problem,
    parse_list_subsys,
    parse_nvme_list,
)
from fxkit.facts.nvmet import NvmetConfig, PathKinds, differences, read_tree

REFERENCE = Path(__file__).parent / "data" / "reference"
NVME_LISTS = sorted(REFERENCE.glob("nvme_list_o_json_*.json"))
NVMET_CONFIGS = sorted(REFERENCE.glob("nvmetcli_*.json"))


def gather(fact: type[Fact[Any]], *args: Any, path: Path | None = None) -> Any:
    """Run the fact's real command here (with ``path`` first on PATH) and parse it."""
    command = fact().command(*args)
    if path is not None:
        command = f"PATH={path}:$PATH; {command}"
    return fact().parse(LocalConnection("localhost").run(command), *args)


def stand_in(tmp_path: Path, script: str) -> Path:
    """A folder with an executable ``nvme`` that runs ``script`` (sh)."""
    folder = tmp_path / "bin"
    folder.mkdir(exist_ok=True)
    tool = folder / "nvme"
    tool.write_text(f"#!/bin/sh\n{script}\n")
    tool.chmod(0o755)
    return folder


def marked(
    output: str, marker: str = '{"lab": true, "profile": "mi308x"}', rc: int = 0
) -> RunResult:
    return RunResult("x", rc, f"{marker}\n{SEPARATOR}\n{output}", "")


# -- NQNs -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "nqn",
    [
        "nqn.2014-08.org.nvmexpress:uuid:0a6cb37d-1915-40d2-97a1-4de3c4017f0b",
        "nqn.2014-08.com.example:nvme:nvm-subsystem-sn-d78432",  # nvme-discover.txt's example
        "nqn.2024-01.io.fxkit:models",
        "nqn.2014-08.org.nvmexpress.discovery",
        "nqn.2016-06.io.spdk:cnode1",
    ],
)
def test_nqns_of_the_spec_forms_pass(nqn: str) -> None:
    assert nqn_problem(nqn) == ""


@pytest.mark.parametrize(
    ("nqn", "says"),
    [
        ("testnqn", "not in the form nqn.YYYY-MM"),
        ("nqn.2024-13.io.fxkit:x", "is not a year and month"),
        ("nqn.24-01.io.fxkit:x", "not in the form"),
        ("nqn.2024-01.fxkit:x", "not in the form"),  # a domain has a dot
        ("nqn.2024-01.io.fxkit", "has no ':name'"),
        ("nqn.2024-01.io.fxkit:a b", "holds a space"),
        ("nqn.2024-01.io.fxkit:a/b", "'/'"),
        ("nqn.2014-08.org.nvmexpress:uuid:1234", "comes a UUID"),
        ("nqn.2024-01.io.fxkit:" + "x" * 210, "longer than 223 bytes"),
        ("", "is not an NQN"),
        (None, "is not an NQN"),
    ],
)
def test_wrong_nqns_say_what_is_wrong(nqn: object, says: str) -> None:
    assert says in nqn_problem(nqn)


# -- nvme list -o json ------------------------------------------------------------------------


def test_every_reference_nvme_list_parses() -> None:
    assert [p.name for p in NVME_LISTS] == [
        "nvme_list_o_json_nvmecli1x.json",
        "nvme_list_o_json_nvmecli2x.json",
    ]
    v1, shape1 = parse_nvme_list((REFERENCE / "nvme_list_o_json_nvmecli1x.json").read_text())
    assert shape1 == "1.x"
    assert [(n.device, n.nsid, n.size, n.sector_size) for n in v1] == [
        ("/dev/nvme0n1", 9217, 5368709120, 512),
        ("/dev/nvme0n2", 9222, 5368709120, 512),
    ]
    assert v1[0].model == "dellemc" and v1[0].serial == "FP08RZ2" and v1[0].generic == ""
    v2, shape2 = parse_nvme_list((REFERENCE / "nvme_list_o_json_nvmecli2x.json").read_text())
    assert shape2 == "2.x"
    [ns] = v2
    assert (ns.device, ns.generic, ns.nsid, ns.size) == (
        "/dev/nvme1n1",
        "/dev/ng1n1",
        2,
        10737418240,
    )
    assert (ns.model, ns.serial, ns.firmware, ns.used) == ("VastData", "VastData", "24.05", 0)


@pytest.mark.parametrize("reference", NVME_LISTS, ids=lambda p: p.name)
def test_the_nvme_list_fact_runs_its_command(tmp_path: Path, reference: Path) -> None:
    tools = stand_in(tmp_path, f"[ \"$*\" = 'list -o json' ] && cat {reference}")
    devices = gather(NvmeList, path=tools)
    assert not devices.missing and not devices.simulated
    assert devices.namespaces == parse_nvme_list(reference.read_text())[0]


def test_nvme_list_without_the_tool_or_the_driver_says_why(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    command = NvmeList().command()
    result = LocalConnection("x").run(f"PATH={empty}; {command}")
    assert NvmeList().parse(result).missing == "nvme not found"
    # What nvme-cli 2.3 (Debian 12) prints on a machine without NVMe (run here, extracted).
    scan = stand_in(
        tmp_path, "echo 'Failed to scan topology: No such file or directory' >&2; exit 1"
    )
    missing = gather(NvmeList, path=scan).missing
    assert (
        missing == "no NVMe driver or device (Failed to scan topology: No such file or directory)"
    )


@pytest.mark.parametrize(
    ("output", "says"),
    [
        ("", "printed nothing"),
        ("{", "did not print JSON"),
        ("[]", "wanted {'Devices': [...]}"),
        ('{"Devices": [3]}', "Devices[0] is 3, not an object"),
        ('{"Devices": [{"NameSpace": 1}]}', "no string 'DevicePath'"),
        ('{"Devices": [{"DevicePath": "/dev/nvme0n1", "NameSpace": "x"}]}', "NameSpace is 'x'"),
    ],
)
def test_malformed_nvme_list_is_a_clear_fact_error(output: str, says: str) -> None:
    with pytest.raises(FactError, match="nvme list -o json") as caught:
        NvmeList().parse(marked(output))
    assert says in str(caught.value)


def test_an_nvme_failure_that_is_not_a_missing_driver_is_an_error() -> None:
    with pytest.raises(FactError, match="exited 2"):
        NvmeList().parse(RunResult("nvme list", 2, f"\n{SEPARATOR}\n", "ioctl failed"))


def test_a_simulated_host_says_so() -> None:
    text = (REFERENCE / "nvme_list_o_json_nvmecli2x.json").read_text()
    assert NvmeList().parse(marked(text)).simulated
    assert not NvmeList().parse(marked(text, '{"lab": true, "profile": null}')).simulated


# -- nvme list-subsys -o json -----------------------------------------------------------------

#: nvme-cli <= 1.8 (nvme-print.c): each subsystem, then its paths as a separate entry. Older
#: kernels separate the address fields with spaces.
LIST_SUBSYS_18 = {
    "Subsystems": [
        {"Name": "nvme-subsys0", "NQN": "nqn.2024-01.io.fxkit:models"},
        {
            "Paths": [
                {"Name": "nvme0", "Transport": "rdma",
                 "Address": "traddr=192.168.100.10 trsvcid=4420", "State": "live"},
                {"Name": "nvme1", "Transport": "rdma",
                 "Address": "traddr=192.168.101.10 trsvcid=4420", "State": "connecting"},
            ]
        },
        {"Name": "nvme-subsys1", "NQN": "nqn.2024-01.io.fxkit:scratch"},
    ]
}  # fmt: skip
#: nvme-cli 1.9-1.16: the paths inside the subsystem (ANAState where the kernel reports it).
LIST_SUBSYS_116 = {
    "Subsystems": [
        {
            "Name": "nvme-subsys0",
            "NQN": "nqn.2024-01.io.fxkit:models",
            "Paths": [
                {"Name": "nvme0", "Transport": "tcp", "Address": "traddr=10.0.0.2,trsvcid=4420",
                 "State": "live", "ANAState": "optimized"}
            ],
        }
    ]
}  # fmt: skip
#: nvme-cli 2.x: a list of hosts, each with its subsystems.
LIST_SUBSYS_2 = [
    {
        "HostNQN": "nqn.2014-08.org.nvmexpress:uuid:0a6cb37d-1915-40d2-97a1-4de3c4017f0b",
        "HostID": "0a6cb37d-1915-40d2-97a1-4de3c4017f0b",
        "Subsystems": [
            {
                "Name": "nvme-subsys1",
                "NQN": "nqn.2024-01.io.fxkit:models",
                "IOPolicy": "numa",
                "Paths": [
                    {"Name": "nvme1", "Transport": "rdma",
                     "Address": "traddr=192.168.100.10,trsvcid=4420,src_addr=192.168.100.21",
                     "State": "live"}
                ],
            }
        ],
    }
]  # fmt: skip


def test_list_subsys_of_nvme_cli_1_8_joins_the_separate_paths() -> None:
    subsystems, shape, hostnqn = parse_list_subsys(json.dumps(LIST_SUBSYS_18))
    assert (shape, hostnqn) == ("1.x", "")
    models, scratch = subsystems
    assert [p.name for p in models.paths] == ["nvme0", "nvme1"] and scratch.paths == ()
    assert models.paths[1].field("traddr") == "192.168.101.10"
    assert models.paths[1].field("trsvcid") == "4420"


def test_list_subsys_of_1_16_and_2_x() -> None:
    [sub], shape, _ = parse_list_subsys(json.dumps(LIST_SUBSYS_116))
    assert shape == "1.x" and sub.paths[0].ana_state == "optimized"
    assert sub.paths[0].field("traddr") == "10.0.0.2"
    [sub], shape, hostnqn = parse_list_subsys(json.dumps(LIST_SUBSYS_2))
    assert shape == "2.x" and hostnqn.endswith("0a6cb37d-1915-40d2-97a1-4de3c4017f0b")
    assert (sub.name, sub.iopolicy, sub.paths[0].transport) == ("nvme-subsys1", "numa", "rdma")
    # None connected: 1.x prints {}, 2.x [] (or hosts without subsystems).
    assert parse_list_subsys("{}")[0] == () and parse_list_subsys("[]")[0] == ()
    assert parse_list_subsys('[{"HostNQN": "x", "Subsystems": []}]')[0] == ()


@pytest.mark.parametrize("shape", [LIST_SUBSYS_18, LIST_SUBSYS_116, LIST_SUBSYS_2])
def test_the_list_subsys_fact_finds_a_connection(tmp_path: Path, shape: object) -> None:
    (tmp_path / "out.json").write_text(json.dumps(shape, indent=2))
    tools = stand_in(tmp_path, f"[ \"$*\" = 'list-subsys -o json' ] && cat {tmp_path / 'out.json'}")
    found = gather(NvmeListSubsys, path=tools)
    assert not found.missing
    models = "nqn.2024-01.io.fxkit:models"
    address = "10.0.0.2" if shape is LIST_SUBSYS_116 else "192.168.100.10"
    transport = "tcp" if shape is LIST_SUBSYS_116 else "rdma"
    path = found.path_to(models, transport, address, "4420")
    assert path is not None and path.state == "live"
    assert found.path_to(models, transport, address, "4421") is None
    assert found.path_to("nqn.2024-01.io.fxkit:other", transport, address, "4420") is None


@pytest.mark.parametrize(
    ("output", "says"),
    [
        ("", "printed nothing"),
        ("nope", "did not print JSON"),
        ('"x"', "wanted a list (2.x) or an object (1.x)"),
        ('{"Subsystems": 3}', "'Subsystems' is 3"),
        ('{"Subsystems": [{"Paths": []}]}', "paths before any subsystem"),
        ('[{"Subsystems": [{"Name": "s"}]}]', "no string 'NQN'"),
        (
            '[{"Subsystems": [{"Name": "s", "NQN": "n", "Paths": [{"Transport": "tcp"}]}]}]',
            "'Name'",
        ),
        ("[7]", "is not a host"),
    ],
)
def test_malformed_list_subsys_is_a_clear_fact_error(output: str, says: str) -> None:
    with pytest.raises(FactError, match="nvme list-subsys -o json") as caught:
        NvmeListSubsys().parse(marked(output))
    assert says in str(caught.value)


# -- native multipath -------------------------------------------------------------------------


def test_multipath_reads_the_nvme_core_parameter() -> None:
    here = gather(NvmeMultipath)  # this machine: no nvme_core, or its real setting
    if Path("/sys/module/nvme_core/parameters/multipath").exists():
        assert here.value in ("Y", "N") and not here.missing
    else:
        assert not here.value and "nvme_core" in here.missing
    assert NvmeMultipath().parse(marked("Y\n")).enabled
    assert not NvmeMultipath().parse(marked("N\n")).enabled
    with pytest.raises(FactError, match="not Y or N"):
        NvmeMultipath().parse(marked("maybe\n"))
    with pytest.raises(FactError):
        NvmeMultipath().parse(RunResult("x", 0, "no separator", ""))


# -- the nvmet configfs tree ------------------------------------------------------------------


def write_configfs(root: Path, config: dict[str, Any]) -> None:
    """What ``nvmetcli restore`` makes of a config in configfs (nvmet/nvme.py: ``mkdir`` per
    object, ``<group>_<attr>`` files, ``enable``, symlinks for the port and host links), here in
    a plain folder; every attribute file ends with a newline, as the kernel prints them."""

    def attrs(path: Path, obj: dict[str, Any], groups: tuple[str, ...]) -> None:
        path.mkdir(parents=True, exist_ok=True)
        for group in groups:
            for name, value in obj.get(group, {}).items():
                (path / f"{group}_{name}").write_text(f"{value}\n")
        if "enable" in obj:
            (path / "enable").write_text(f"{obj['enable']}\n")

    for folder in ("hosts", "ports", "subsystems"):
        (root / folder).mkdir(parents=True, exist_ok=True)
    for host in config["hosts"]:
        attrs(root / "hosts" / host["nqn"], host, ("dhchap",))
    for sub in config["subsystems"]:
        at = root / "subsystems" / sub["nqn"]
        attrs(at, sub, ("attr",))
        (at / "allowed_hosts").mkdir()
        (at / "namespaces").mkdir()
        for ns in sub["namespaces"]:
            attrs(at / "namespaces" / str(ns["nsid"]), ns, ("device", "ana", "resv"))
            if "ana_grpid" in ns:
                (at / "namespaces" / str(ns["nsid"]) / "ana_grpid").write_text(
                    f"{ns['ana_grpid']}\n"
                )
        for host in sub["allowed_hosts"]:
            (at / "allowed_hosts" / host).symlink_to(root / "hosts" / host)
    for port in config["ports"]:
        at = root / "ports" / str(port["portid"])
        attrs(at, port, ("addr", "param"))
        for folder in ("subsystems", "referrals", "ana_groups"):
            (at / folder).mkdir()
        for nqn in port["subsystems"]:
            (at / "subsystems" / nqn).symlink_to(root / "subsystems" / nqn)
        for group in port.get("ana_groups", []):
            attrs(at / "ana_groups" / str(group["grpid"]), group, ("ana",))


@pytest.mark.parametrize("reference", NVMET_CONFIGS, ids=lambda p: p.name)
def test_configfs_reads_back_as_the_config_nvmetcli_restored(
    tmp_path: Path, reference: Path
) -> None:
    config = json.loads(reference.read_text())
    write_configfs(tmp_path / "nvmet", config)
    state = gather(NvmetConfig, str(tmp_path / "nvmet"))
    assert not state.missing
    assert differences(config, state.config) == []
    # Structure as nvmetcli's dump(): the same objects, the same keys where the file has them.
    assert [h["nqn"] for h in state.config["hosts"]] == [h["nqn"] for h in config["hosts"]]
    for want, have in zip(config["ports"], state.config["ports"], strict=True):
        assert have["addr"] == want["addr"] and have["subsystems"] == want["subsystems"]
        assert have["portid"] == want["portid"] and isinstance(have["portid"], int)
    for want, have in zip(config["subsystems"], state.config["subsystems"], strict=True):
        assert have["attr"] == want["attr"] and have["allowed_hosts"] == want["allowed_hosts"]
        for ns_want, ns_have in zip(want["namespaces"], have["namespaces"], strict=True):
            assert ns_have["device"] == ns_want["device"]
            assert (ns_have["nsid"], ns_have["enable"]) == (ns_want["nsid"], ns_want["enable"])


def test_differences_name_every_key_that_drifted(tmp_path: Path) -> None:
    config = json.loads((REFERENCE / "nvmetcli_tcp.json").read_text())
    write_configfs(tmp_path / "nvmet", config)
    root = tmp_path / "nvmet"
    (root / "ports/1/addr_traddr").write_text("192.168.122.34\n")
    (root / "subsystems/nvmet-always/namespaces/1/enable").write_text("0\n")
    (root / "ports/1/subsystems/nvmet-always").unlink()
    (root / "subsystems/stray").mkdir()
    found = differences(config, gather(NvmetConfig, str(root)).config)
    assert found == [
        "subsystems[nvmet-always].namespaces[1].enable: wanted 1, configfs has 0",
        "subsystems[stray]: in configfs, not in the config",
        "ports[1].addr.traddr: wanted '192.168.122.33', configfs has '192.168.122.34'",
        "ports[1].subsystems: wanted ['nvmet-always'], configfs has []",
    ]
    assert differences(config, {"hosts": [], "ports": [], "subsystems": []}) == [
        "subsystems[nvmet-always]: not in configfs",
        "ports[1]: not in configfs",
    ]


def test_empty_attribute_files_and_unreadable_ones(tmp_path: Path) -> None:
    """A stand-in configfs may hold empty files (nvmetcli writes '' for a loop port's traddr);
    write-only attributes (mode 0200, like revalidate_size) are not read; keys stay secret."""
    root = tmp_path / "nvmet"
    write_configfs(root, json.loads((REFERENCE / "nvmetcli_loop.json").read_text()))
    (root / "ports/1/addr_traddr").write_text("")
    ns = root / "subsystems/testnqn/namespaces/1"
    (ns / "revalidate_size").write_text("")
    (ns / "revalidate_size").chmod(0o200)
    (root / "hosts/hostnqn/dhchap_key").write_text("DHHC-1:00:secret:\n")
    (root / "hosts/hostnqn/dhchap_hash").write_text("hmac(sha256)\n")
    state = gather(NvmetConfig, str(root))
    assert state.config["ports"][0]["addr"]["traddr"] == ""
    assert state.config["hosts"] == [{"nqn": "hostnqn", "dhchap": {"hash": "hmac(sha256)"}}]
    assert "secret" not in repr(state)


def test_no_configfs_says_why(tmp_path: Path) -> None:
    state = gather(NvmetConfig, str(tmp_path / "none"))
    assert state.config == {} and "does not exist" in state.missing
    assert "the nvmet module is not loaded" in state.missing


@pytest.mark.parametrize(
    ("listing", "contents", "says"),
    [
        ("x ports\n", "", "cannot read the listing line"),
        ("d ports\nd ports/a\n", "", "ports/a is 'a', not a number"),
        ("d hosts\n", "no nul here\n", "cannot read the attribute line"),
    ],
)
def test_a_tree_that_is_not_configfs_is_a_clear_error(
    listing: str, contents: str, says: str
) -> None:
    with pytest.raises(FactError, match="nvmet configfs") as caught:
        read_tree(listing, contents)
    assert says in str(caught.value)


def test_path_kinds(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    kinds = gather(PathKinds, str(tmp_path / "file"), str(tmp_path), str(tmp_path / "none"))
    assert list(kinds.values()) == ["file", "other", "absent"]


# -- blkid ------------------------------------------------------------------------------------


def test_block_signatures_of_image_files(tmp_path: Path) -> None:
    if not Path("/usr/sbin/mkfs.ext4").exists():
        pytest.skip("needs mkfs.ext4 (e2fsprogs)")
    image = tmp_path / "disk.img"
    assert not gather(BlockSignature, str(image)).exists
    subprocess.run(["truncate", "-s", "16M", str(image)], check=True)
    empty = gather(BlockSignature, str(image))
    assert empty.exists and empty.empty and not empty.fstype and not empty.error
    subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True)
    ext4 = gather(BlockSignature, str(image))
    assert not ext4.empty and ext4.fstype == "ext4" and len(ext4.uuid) == 36
    assert ext4.what.startswith("a ext4 signature (UUID ")
    if os.geteuid() == 0:  # root reads everything: an unreadable device through another user
        return
    image.chmod(0)
    assert "not readable" in gather(BlockSignature, str(image)).error
