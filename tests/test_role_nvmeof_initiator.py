"""roles/nvmeof_initiator: discovery.conf lines parse as nvme-cli arguments, the variable checks,
and the role on real lab hosts: check mode changes nothing, the file-level steps apply, the
steps that need NVMe hardware are skipped with their reasons, a second run changes nothing, a
host NQN is made once and never rotated, and a filesystem is made only where there is nothing.

discovery.conf is read by nvme-cli's discover_from_conf_file (linux-nvme/nvme-cli v2.8,
fabrics.c): lines starting with '#' or empty are skipped, the rest split at every ' ', '=' and
newline (strsep), argv[0] = "discover", at most 30 words (MAX_DISC_ARGS 32 with argv[0] and the
NULL), then parsed by argconfig (getopt_long) with NVMF_ARGS plus discover's own options. The
table below is that option list; the reference files are nvme-cli v2.8's etc/discovery.conf.in
and the EXAMPLES of Documentation/nvme-discover.txt (tests/data/reference/, see SOURCES.md).
"""

from __future__ import annotations

import inspect
import json
import re
import shutil
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from nvme_lab import place, play_role, refusal, stand_in_packages

from fxkit.connection.local import LocalConnection
from fxkit.engine.role import RoleLoader, roles_path
from fxkit.engine.variables import HostVars, Layer
from fxkit.facts.base import FactCache
from fxkit.facts.nvme import NvmeDevices, NvmeNamespace, NvmeSubsystems, parse_list_subsys
from fxkit.lab.mirror import nvme_cli_postinst
from fxkit.ops.base import OpContext
from fxkit.ops.filesystems import filesystem
from tests.lab_helpers import changes, events_of, sh, snapshot

REFERENCE = Path(__file__).parent / "data" / "reference"
ROLE = RoleLoader(roles_path(None)).load("nvmeof_initiator")
CODE = inspect.getmodule(ROLE.apply)
MODELS = "nqn.2024-01.io.fxkit:models"

#: discover's options in discovery.conf (nvme-cli v2.8 fabrics.c): long name -> (short, kind);
#: kind: "str", "int" or "flag".
DISCOVER_OPTIONS = {
    "transport": ("t", "str"), "nqn": ("n", "str"), "traddr": ("a", "str"),
    "trsvcid": ("s", "str"), "host-traddr": ("w", "str"), "host-iface": ("f", "str"),
    "hostnqn": ("q", "str"), "hostid": ("I", "str"), "dhchap-secret": ("S", "str"),
    "nr-io-queues": ("i", "int"), "nr-write-queues": ("W", "int"),
    "nr-poll-queues": ("P", "int"), "queue-size": ("Q", "int"), "keep-alive-tmo": ("k", "int"),
    "reconnect-delay": ("c", "int"), "ctrl-loss-tmo": ("l", "int"), "tos": ("T", "int"),
    "keyring": ("", "int"), "tls_key": ("", "int"), "duplicate-connect": ("D", "flag"),
    "disable-sqflow": ("d", "flag"), "hdr-digest": ("g", "flag"), "data-digest": ("G", "flag"),
    "tls": ("", "flag"), "concat": ("", "flag"), "output-format": ("o", "str"),
    "raw": ("r", "str"), "persistent": ("p", "flag"), "verbose": ("v", "flag"),
    "force": ("", "flag"),
}  # fmt: skip
SHORT = {short: (name, kind) for name, (short, kind) in DISCOVER_OPTIONS.items() if short}
MAX_WORDS = 30


def parse_discovery_line(line: str) -> dict[str, str]:
    """One discovery.conf line as nvme-cli 2.8 reads it: {long option: value}."""
    words = []
    word = ""
    for char in line:  # strsep(&p, " =\n"): every delimiter ends a word, empty ones too
        if char in " =\n":
            words.append(word)
            word = ""
        else:
            word += char
    words.append(word)
    assert len(words) <= MAX_WORDS, f"{len(words)} words overflow nvme-cli's argv: {line!r}"
    found: dict[str, str] = {}
    i = 0
    while i < len(words):
        word = words[i]
        i += 1
        if word.startswith("--"):
            assert word[2:] in DISCOVER_OPTIONS, f"unrecognized option {word!r}"
            name, kind = word[2:], DISCOVER_OPTIONS[word[2:]][1]
            value = None
        elif word.startswith("-") and len(word) > 1:
            assert word[1] in SHORT, f"invalid option {word!r}"
            (name, kind), value = SHORT[word[1]], word[2:] or None
        else:
            continue  # getopt leaves non-options (the empty words) alone
        if kind == "flag":
            found[name] = ""
            continue
        if value is None:
            assert i < len(words) and words[i], f"option {name} needs a value in {line!r}"
            value, i = words[i], i + 1
        if kind == "int":
            int(value)  # argconfig: "Expected integer argument for ..."
        found[name] = value
    return found


def discovery_lines(text: str) -> list[str]:
    return [line for line in text.splitlines(keepends=True) if line[0] not in "#\n"]


def host_vars(**values: Any) -> HostVars:
    return HostVars("gpu01", [Layer("role defaults", ROLE.defaults), Layer("inventory", values)])


def typed(**values: Any) -> Any:
    """The role's typed ``Vars`` of a host with these inventory values."""
    return ROLE.typed(host_vars(**values))


def test_the_parser_reads_nvme_cli_s_own_examples() -> None:
    assert discovery_lines((REFERENCE / "nvme_discovery.conf.in").read_text()) == []
    lines = discovery_lines((REFERENCE / "nvme_discovery.conf.example").read_text())
    parsed = [parse_discovery_line(line) for line in lines]
    assert [(p["transport"], p["traddr"], p["trsvcid"]) for p in parsed] == [
        ("rdma", "192.168.69.33", "4420"),
        ("rdma", "192.168.1.4", "4420"),
    ]
    with pytest.raises(AssertionError, match="unrecognized option"):
        parse_discovery_line("--transport rdma --bogus 1\n")
    with pytest.raises(ValueError):
        parse_discovery_line("-t rdma -a 10.0.0.1 -i many\n")


DISCOVERY = [
    {"transport": "rdma", "address": "192.168.100.10", "nr_io_queues": 8,
     "ctrl_loss_tmo": -1, "reconnect_delay": 5},
    {"transport": "tcp", "address": "fd00::10", "host_traddr": "fd00::21", "host_iface": "ens6np0"},
]  # fmt: skip


def test_every_discovery_conf_line_parses_as_nvme_cli_arguments() -> None:
    text = CODE.discovery_conf(typed(nvmeof_initiator_discovery=DISCOVERY))
    lines = discovery_lines(text)
    assert len(lines) == 2
    first, second = (parse_discovery_line(line) for line in lines)
    assert first == {
        "transport": "rdma", "traddr": "192.168.100.10", "trsvcid": "4420",
        "nr-io-queues": "8", "ctrl-loss-tmo": "-1", "reconnect-delay": "5",
    }  # fmt: skip
    assert second == {
        "transport": "tcp", "traddr": "fd00::10", "trsvcid": "8009",  # discovery over TCP
        "host-traddr": "fd00::21", "host-iface": "ens6np0",
    }  # fmt: skip
    nvme = shutil.which("nvme")
    if nvme:  # the real nvme-cli where it is installed: only "cannot reach" errors, no parse one
        for line in lines:
            done = subprocess.run([nvme, "discover", *line.split()], capture_output=True, text=True)
            said = done.stdout + done.stderr
            assert not any(s in said for s in ("unrecognized", "Expected integer", "invalid")), said


def test_the_connect_command_has_the_nvme_cli_options() -> None:
    entry = {"nqn": MODELS, "transport": "rdma", "address": "192.168.100.10", "service_id": 4420,
             "nr_io_queues": 8, "ctrl_loss_tmo": 600, "reconnect_delay": 10}  # fmt: skip
    args = CODE.fabric_args(CODE.Connection.model_validate(entry))
    assert args == ["-t", "rdma", "-a", "192.168.100.10", "-s", "4420",
                    "-i", "8", "-l", "600", "-c", "10"]  # fmt: skip
    assert parse_discovery_line(" ".join([*args, "-n", MODELS]) + "\n")["nqn"] == MODELS


def test_namespaces_of_a_subsystem_by_its_instance_or_controllers() -> None:
    subsystems, _, _ = parse_list_subsys(json.dumps([{"HostNQN": "h", "Subsystems": [
        {"Name": "nvme-subsys1", "NQN": MODELS,
         "Paths": [{"Name": "nvme1", "Transport": "rdma", "Address": "traddr=1.2.3.4,trsvcid=4420",
                    "State": "live"}]},
        {"Name": "nvme-subsys0", "NQN": "nqn.2024-01.io.local:ssd", "Paths": []}]}]))  # fmt: skip
    devices = NvmeDevices(
        (
            NvmeNamespace("/dev/nvme0n1", 1, 1 << 40, 512, 0),  # a local SSD
            NvmeNamespace("/dev/nvme1n1", 1, 10 << 30, 512, 0),
            NvmeNamespace("/dev/nvme1n2", 2, 10 << 30, 512, 0),
        )
    )
    found = CODE.namespaces_of(MODELS, NvmeSubsystems(subsystems), devices)
    assert [ns.device for ns in found] == ["/dev/nvme1n1", "/dev/nvme1n2"]
    assert CODE.size_bytes("10G") == 10 << 30 and CODE.size_bytes(512) == 512


def connection(**keys: Any) -> dict[str, Any]:
    entry = {"nqn": MODELS, "transport": "tcp", "address": "10.0.0.1", **keys}
    return {"nvmeof_initiator_connections": [entry]}


def discovery(**keys: Any) -> dict[str, Any]:
    return {"nvmeof_initiator_discovery": [{"transport": "tcp", "address": "10.0.0.1", **keys}]}


def mounted(**keys: Any) -> dict[str, Any]:
    return {"nvmeof_initiator_filesystems": [{"device": "/dev/nvme1n1", "path": "/m", **keys}]}


@pytest.mark.parametrize(
    ("values", "where", "says"),
    [
        ({"nvmeof_initiator_hostnqn": "myhost"}, "nvmeof_initiator_hostnqn", "not in the form"),
        ({"nvmeof_initiator_hostnqn": None}, "nvmeof_initiator_hostnqn", "valid string"),
        ({"nvmeof_initiator_hostnqn_file": "hostnqn"}, "nvmeof_initiator_hostnqn_file",
         "not absolute"),
        ({"nvmeof_initiator_multipath": "maybe"}, "nvmeof_initiator_multipath", "valid boolean"),
        (connection(nqn="testnqn"), "nvmeof_initiator_connections[0].nqn", "not in the form"),
        (connection(transport="fc"),
         "nvmeof_initiator_connections[0].transport", "Input should be 'rdma' or 'tcp'"),
        ({"nvmeof_initiator_connections": [{"nqn": MODELS, "transport": "tcp"}]},
         "nvmeof_initiator_connections[0].address", "is not set"),
        (discovery(address="10.0.0.1 -q x"),
         "nvmeof_initiator_discovery[0].address", "not an IP address"),
        (discovery(host_traddr="gpu01"),
         "nvmeof_initiator_discovery[0].host_traddr", "not an IP address"),
        (connection(nr_io_queues="8 -D"),
         "nvmeof_initiator_connections[0].nr_io_queues", "Input should be a valid integer"),
        (connection(nr_io_queues=0),
         "nvmeof_initiator_connections[0].nr_io_queues", "greater than or equal to 1"),
        (connection(reconnect_delay=True),
         "nvmeof_initiator_connections[0].reconnect_delay", "a boolean is not a number"),
        (connection(ctrl_loss_tmo=-2),
         "nvmeof_initiator_connections[0].ctrl_loss_tmo", "greater than or equal to -1"),
        (connection(service_id=65536),
         "nvmeof_initiator_connections[0].service_id", "less than or equal to 65535"),
        (discovery(service_id="any"),
         "nvmeof_initiator_discovery[0].service_id", "Input should be a valid integer"),
        (connection(namespaces=-1),
         "nvmeof_initiator_connections[0].namespaces", "greater than or equal to 0"),
        (connection(size="lots"), "nvmeof_initiator_connections[0].size", "not a size"),
        (discovery(host_iface="eth0#x"),
         "nvmeof_initiator_discovery[0].host_iface", "holds '=' or '#'"),
        (discovery(host_iface="eth0:1"),
         "nvmeof_initiator_discovery[0].host_iface", "not a Linux interface name"),
        (discovery(nqn=MODELS), "nvmeof_initiator_discovery[0].nqn", "Extra inputs"),
        ({"nvmeof_initiator_connections": connection()["nvmeof_initiator_connections"] * 2},
         "nvmeof_initiator_connections[1]", "is listed twice"),
        ({"nvmeof_initiator_filesystems": [{"nqn": MODELS, "nsid": 1, "path": "/mnt/m"}]},
         "nvmeof_initiator_filesystems[0]", "give device, or nqn"),
        ({**connection(), "nvmeof_initiator_filesystems": [{"nqn": MODELS, "path": "/mnt/m"}]},
         "nvmeof_initiator_filesystems[0]", "give device, or nqn"),
        (mounted(path="mnt"), "nvmeof_initiator_filesystems[0].path", "not an absolute path"),
        (mounted(path="/"), "nvmeof_initiator_filesystems[0].path", "not an absolute path"),
        ({"nvmeof_initiator_filesystems": mounted()["nvmeof_initiator_filesystems"] * 2},
         "nvmeof_initiator_filesystems[1].path", "mount point /m is used twice"),
        (mounted(device="/mnt/disk"),
         "nvmeof_initiator_filesystems[0].device", "not a device under /dev"),
        (mounted(label="much-too-long-label"),
         "nvmeof_initiator_filesystems[0].label", "up to 12"),
        (mounted(reader_opts="defaults,_netdev"),
         "nvmeof_initiator_filesystems[0].reader_opts", "does not mount read-only"),
        (mounted(owner=["gpu01"]), "nvmeof_initiator_filesystems[0].owner", "valid string"),
    ],
)  # fmt: skip
def test_wrong_variables_name_the_host_and_the_variable(
    values: dict[str, Any], where: str, says: str
) -> None:
    problem = refusal(ROLE, host_vars(**values))
    assert problem.where.startswith("gpu01: ")
    assert (place(problem), says in problem.message) == (where, True), problem


def test_good_variables_pass_as_an_inventory_gives_them() -> None:
    """Digits in strings (an INI inventory, -e), a size in bytes, a filesystem on a connected
    namespace."""
    values = {
        **connection(service_id="4420", nr_io_queues="8", size=1 << 30),
        "nvmeof_initiator_filesystems": [{"nqn": MODELS, "nsid": 1, "path": "/mnt/m"}],
        "nvmeof_initiator_multipath": "no",
    }
    v = typed(**values)
    CODE.validate(v)
    [entry] = v.nvmeof_initiator_connections
    assert CODE.fabric_args(entry) == ["-t", "tcp", "-a", "10.0.0.1", "-s", "4420", "-i", "8"]
    assert CODE.size_bytes(entry.size) == 1 << 30 and v.nvmeof_initiator_multipath is False


def test_the_shipped_unit_is_valid_for_systemd_analyze(tmp_path: Path) -> None:
    """nvmf-autoconnect.service as nvme-cli v2.8 and master ship it (@SYSCONFDIR@ /etc,
    @SBINDIR@ /usr/sbin, as meson fills them in); the role enables it and writes no unit."""
    if not shutil.which("systemd-analyze"):
        pytest.skip("systemd-analyze is not installed")
    for source in sorted(REFERENCE.glob("nvmf-autoconnect.service.in.*")):
        unit = tmp_path / "nvmf-autoconnect.service"
        text = source.read_text().replace("@SYSCONFDIR@", "/etc").replace("@SBINDIR@", "/usr/sbin")
        unit.write_text(text)
        done = subprocess.run(
            ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True
        )
        complaints = [
            line for line in done.stderr.splitlines()
            if "is not executable" not in line  # nvme-cli is not installed on this machine
            and "Unknown key name 'ProtectHostname'" not in line  # not known to old systemd
        ]  # fmt: skip
        assert complaints == [], (source.name, done.stderr)


# -- never over data --------------------------------------------------------------------------


def test_the_mkfs_command_probes_again_and_refuses_a_device_that_filled_up(tmp_path: Path) -> None:
    """Between the probe and mkfs the device may change: the command itself probes again (and
    calls mkfs without -f): a device that got a filesystem meanwhile is left as it is."""
    if not shutil.which("mkfs.ext4") or not shutil.which("mkfs.xfs"):
        pytest.skip("needs mkfs.ext4 and mkfs.xfs")
    image = tmp_path / "ns.img"
    subprocess.run(["truncate", "-s", "300M", str(image)], check=True)
    conn = LocalConnection("localhost")
    planned = filesystem(OpContext(conn, FactCache(conn), check=True), str(image), "xfs")
    assert planned.changed and planned.msg == f"would make xfs on {image}"
    subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True)
    before = subprocess.run(["sha256sum", str(image)], capture_output=True, text=True).stdout
    done = conn.run(planned.data["commands"][0])
    assert done.rc == 3 and "is not empty any more" in done.stderr
    assert (
        subprocess.run(["sha256sum", str(image)], capture_output=True, text=True).stdout == before
    )


# -- on lab hosts -----------------------------------------------------------------------------

LAB_VARS = {
    "nvmeof_initiator_discovery": [{"transport": "rdma", "address": "192.168.100.10"}],
    "nvmeof_initiator_connections": [
        {"nqn": MODELS, "transport": "rdma", "address": "192.168.100.10", "nr_io_queues": 8,
         "namespaces": 1, "size": "64M"}
    ],
    "nvmeof_initiator_filesystems": [{"nqn": MODELS, "nsid": 1, "path": "/mnt/models"}],
}  # fmt: skip


@pytest.fixture(scope="module")
def initiator(lab_fleet: Any) -> Any:
    fleet = lab_fleet(1, name="nvme-host")
    with fleet.connect("lab01") as conn:
        stand_in_packages(conn, "nvme-cli")
    return fleet


@pytest.mark.lab
def test_on_a_plain_lab_host_files_apply_and_hardware_steps_skip_with_reasons(
    initiator: Any, tmp_path: Path
) -> None:
    before = snapshot(initiator, "lab01")
    check = play_role(
        initiator, tmp_path, "nvmeof_initiator", "lab01", LAB_VARS, "--check", "--diff"
    )
    assert check.code == 0, check.output
    assert changes(before, snapshot(initiator, "lab01")) == [], "check mode changed the host"
    assert "+-t rdma -a 192.168.100.10 -s 4420" in check.output

    first = play_role(initiator, tmp_path, "nvmeof_initiator", "lab01", LAB_VARS)
    assert first.code == 0, first.output
    assert [op for op, _ in events_of(first, "lab01", "changed")] == [
        "packages",
        "directory /etc/nvme",
        "host identity /etc/nvme/hostnqn",
        "module nvme_core",
        "module nvme-rdma",
        "file /etc/nvme/discovery.conf",
    ]
    assert events_of(first, "lab01", "skipped") == [
        ("service nvmf-autoconnect.service", "systemd is not running on this host (PID 1 is "
         "sshd): nvmf-autoconnect.service not managed"),
        ("native NVMe multipath", "native NVMe multipath: nvme_core is not loaded "
         "(/sys/module/nvme_core/parameters/multipath is absent)"),
        ("connect NVMe-oF subsystems", "connect NVMe-oF subsystems: nvme not found"),
        ("XFS at /mnt/models", "XFS at /mnt/models: the NVMe-oF connections did not run"),
    ]  # fmt: skip
    with initiator.connect("lab01") as conn:
        nqn = sh(conn, "cat /etc/nvme/hostnqn").strip()
        hostid = sh(conn, "cat /etc/nvme/hostid").strip()
        assert nqn == f"nqn.2014-08.org.nvmexpress:uuid:{hostid}"
        assert sh(conn, "cat /etc/modprobe.d/nvme_core.conf") == "options nvme_core multipath=Y\n"
        conf = sh(conn, "cat /etc/nvme/discovery.conf")
        assert [parse_discovery_line(line) for line in discovery_lines(conf)] == [
            {"transport": "rdma", "traddr": "192.168.100.10", "trsvcid": "4420"}
        ]
    converged = snapshot(initiator, "lab01")

    second = play_role(initiator, tmp_path, "nvmeof_initiator", "lab01", LAB_VARS)
    assert second.code == 0, second.output
    assert events_of(second, "lab01", "changed") == []
    assert changes(converged, snapshot(initiator, "lab01")) == []
    with initiator.connect("lab01") as conn:
        assert sh(conn, "cat /etc/nvme/hostnqn").strip() == nqn  # not rotated


PRESET = "nqn.2014-08.org.nvmexpress:uuid:3b2f6c1e-0d0a-4a51-9a57-0c5d1f2e0a01"
PACKAGE_NQN = re.compile(r"^\s*-(nqn\.2014-08\.org\.nvmexpress:uuid:[0-9a-f-]{36})$", re.M)


def _identity(conn: Any) -> tuple[str, str]:
    return sh(conn, "cat /etc/nvme/hostnqn").strip(), sh(conn, "cat /etc/nvme/hostid").strip()


@pytest.mark.lab
def test_the_preset_nqn_replaces_the_package_s_until_a_subsystem_is_connected(
    initiator: Any, tmp_path: Path
) -> None:
    """As Debian and Ubuntu ship nvme-cli: its postinst (the real one, tests/data/reference)
    writes /etc/nvme/hostnqn and a hostid of its own UUID when the package installs. The
    inventory's NQN, and a hostid of its UUID, replace them while nothing is connected; once a
    subsystem is, a different NQN is refused and nothing changes."""
    preset = {"nvmeof_initiator_hostnqn": PRESET}
    with initiator.connect("lab01") as conn:
        if not conn.run("test -x /usr/bin/python3").ok:
            pytest.skip("needs python3 on the lab hosts (the stand-in nvme)")
        sh(conn, "dpkg --purge nvme-cli >/dev/null 2>&1; rm -rf /etc/nvme")
        stand_in_packages(conn, "nvme-cli", postinst={"nvme-cli": nvme_cli_postinst()})
        try:
            before = snapshot(initiator, "lab01")
            check = play_role(initiator, tmp_path, "nvmeof_initiator", "lab01", preset, "--check")
            assert check.code == 0, check.output
            assert changes(before, snapshot(initiator, "lab01")) == []

            first = play_role(initiator, tmp_path, "nvmeof_initiator", "lab01", preset, "--diff")
            assert first.code == 0, first.output
            assert "ii" in sh(conn, "dpkg -l nvme-cli | tail -1")[:2]  # the role installed it
            [package_nqn] = PACKAGE_NQN.findall(first.output)  # what the postinst wrote
            assert package_nqn != PRESET
            assert "host identity /etc/nvme/hostnqn" in dict(events_of(first, "lab01", "changed"))
            assert _identity(conn) == (PRESET, PRESET.rsplit(":", 1)[1])

            again = play_role(initiator, tmp_path, "nvmeof_initiator", "lab01", preset)
            assert again.code == 0 and events_of(again, "lab01", "changed") == [], again.output

            # A node whose package wrote its pair, connected by hand before fxkit came.
            fresh = "rm -rf /etc/nvme /var/lib/fxkit-test-nvme.json"
            sh(
                conn,
                f"dpkg --purge nvme-cli >/dev/null && {fresh} && apt-get install -y -q nvme-cli",
            )
            package_nqn, package_id = _identity(conn)
            assert package_id != package_nqn.rsplit(":", 1)[1]  # the postinst's uuidgen
            conn.put("/usr/local/bin/nvme", STAND_IN_NVME.encode())
            sh(conn, "chmod 755 /usr/local/bin/nvme && touch /dev/nvme-fabrics && "
                     f"nvme connect -t rdma -a 192.168.100.10 -s 4420 -n {MODELS}")  # fmt: skip
            kept = play_role(initiator, tmp_path, "nvmeof_initiator", "lab01", {})
            assert kept.code == 0, kept.output
            assert (
                "host identity /etc/nvme/hostnqn",
                f"/etc/nvme/hostnqn is {package_nqn}; /etc/nvme/hostid ({package_id}) is not its "
                f"UUID, left as it is while connected (nvme1 ({MODELS}))",
            ) in events_of(kept, "lab01", "ok")
            refused = play_role(initiator, tmp_path, "nvmeof_initiator", "lab01", preset)
            assert refused.code != 0
            [(op, msg)] = events_of(refused, "lab01", "failed")
            assert op == "host identity /etc/nvme/hostnqn"
            assert f"this host is connected as {package_nqn} (nvme1 ({MODELS}))" in msg
            assert "fxkit never rotates the host NQN of a connected host" in msg
            assert _identity(conn) == (package_nqn, package_id)
        finally:
            sh(conn, "rm -f /usr/local/bin/nvme /dev/nvme-fabrics /dev/nvme1n1 "
                     "/var/lib/fxkit-test-nvme.json")  # fmt: skip


SHARED_RW = {
    "nvmeof_initiator_connections": [
        {"nqn": MODELS, "transport": "rdma", "address": "192.168.100.10", "namespaces": 1}
    ],
    "nvmeof_initiator_filesystems": [{"nqn": MODELS, "nsid": 1, "path": "/mnt/models"}],
}


@pytest.mark.lab
def test_two_lab_hosts_on_one_read_write_namespace_are_refused_untouched(
    lab_fleet: Any, tmp_path: Path
) -> None:
    """The old example layout on real hosts: two hosts mounting one namespace read-write is
    refused by ``fxkit play`` before either host is touched (tests/test_nvme_fabric.py has
    every case)."""
    fleet = lab_fleet(2, name="nvme-shared-rw")  # exactly two hosts: the play sees them all
    before = {h: snapshot(fleet, h) for h in ("lab01", "lab02")}
    run = play_role(fleet, tmp_path, "nvmeof_initiator", "lab01:lab02", SHARED_RW, executable=True)
    assert run.code != 0 and run.events == []
    said = " ".join(run.output.split())
    assert (
        f"nsid 1 of {MODELS} carries a filesystem that 2 hosts would mount read-write (and make "
        "where it is empty): lab01 (/mnt/models), lab02 (/mnt/models)" in said
    ), run.output
    assert "give each host a namespace of its own" in said
    assert {h: snapshot(fleet, h) for h in ("lab01", "lab02")} == before
    owned = [{**SHARED_RW["nvmeof_initiator_filesystems"][0], "owner": "lab01"}]
    check = play_role(
        fleet, tmp_path, "nvmeof_initiator", "lab01:lab02",
        {**SHARED_RW, "nvmeof_initiator_filesystems": owned}, "--check",
    )  # fmt: skip
    assert check.code == 0, check.output  # one owner, one reader: accepted


def _device_vars(device: str) -> dict[str, Any]:
    return {"nvmeof_initiator_filesystems": [{"device": device, "path": "/mnt/models",
                                              "label": "models"}]}  # fmt: skip


@pytest.mark.lab
def test_a_filesystem_is_made_only_where_there_is_nothing(initiator: Any, tmp_path: Path) -> None:
    """Namespaces here are image files under the host's /dev (as the mi308x stand-ins make
    them): an empty one gets XFS once, mounted by UUID; one holding ext4, or XFS made before,
    keeps every byte."""
    with initiator.connect("lab01") as conn:
        if not conn.run("command -v mkfs.xfs && command -v mkfs.ext4").ok:
            pytest.skip("needs xfsprogs and e2fsprogs on the lab hosts")
        empty, ext4, xfs = "/dev/fx-empty.img", "/dev/fx-ext4.img", "/dev/fx-xfs.img"
        sh(conn, f"truncate -s 300M {empty} {ext4} {xfs} && mkfs.ext4 -q -F {ext4} "
                 f"&& mkfs.xfs -q {xfs}")  # fmt: skip

        def digest(path: str) -> str:
            return sh(conn, f"sha256sum {path}")

        untouched = {p: digest(p) for p in (empty, ext4, xfs)}
        check = play_role(initiator, tmp_path, "nvmeof_initiator", "lab01", _device_vars(empty),
                          "--check")  # fmt: skip
        assert check.code == 0, check.output
        assert ("xfs on /dev/fx-empty.img", "would make xfs on /dev/fx-empty.img") in events_of(
            check, "lab01", "changed"
        )
        assert digest(empty) == untouched[empty]

        made = play_role(initiator, tmp_path, "nvmeof_initiator", "lab01", _device_vars(empty))
        assert made.code == 0, made.output
        probe = sh(conn, f"blkid -p -o export {empty}")
        assert "TYPE=xfs" in probe and "LABEL=models" in probe
        uuid = next(line[5:] for line in probe.splitlines() if line.startswith("UUID="))
        assert f"UUID={uuid} /mnt/models xfs defaults,_netdev,nofail 0 0\n" in sh(
            conn, "cat /etc/fstab"
        )
        [mount] = [
            msg for op, msg in events_of(made, "lab01", "changed") if op == "mount /mnt/models"
        ]
        assert "lacks CAP_SYS_ADMIN" in mount  # a lab host cannot mount: the entry applies at boot
        again = play_role(initiator, tmp_path, "nvmeof_initiator", "lab01", _device_vars(empty))
        assert again.code == 0 and events_of(again, "lab01", "changed") == []
        assert f"UUID={uuid}" in sh(conn, f"blkid -p -o export {empty}")  # not made again

        refused = play_role(initiator, tmp_path, "nvmeof_initiator", "lab01", _device_vars(ext4))
        assert refused.code != 0
        [(op, msg)] = events_of(refused, "lab01", "failed")
        assert op == f"xfs on {ext4}" and "holds a ext4 signature" in msg
        assert "fxkit never formats over data" in msg
        assert digest(ext4) == untouched[ext4]

        kept = play_role(initiator, tmp_path, "nvmeof_initiator", "lab01", _device_vars(xfs))
        assert kept.code == 0, kept.output
        assert digest(xfs) == untouched[xfs]
        sh(conn, f"rm -f {empty} {ext4} {xfs}")


@pytest.mark.lab
def test_a_reader_never_makes_the_filesystem_and_mounts_it_read_only(
    initiator: Any, tmp_path: Path
) -> None:
    """A host that is not the namespace's owner: an empty device stays empty (skipped in check
    mode; otherwise it waits nvmeof_initiator_owner_wait seconds, then fails naming the owner);
    the owner's XFS made while it waits is taken; the reader's fstab entry mounts it
    ro,norecovery, and a second run changes nothing."""
    shared = "/dev/fx-shared.img"
    reader = {"nvmeof_initiator_owner_wait": 4, "nvmeof_initiator_filesystems": [
        {"device": shared, "path": "/mnt/models", "owner": "lab02"}]}  # fmt: skip
    with initiator.connect("lab01") as conn:
        if not conn.run("command -v mkfs.xfs").ok:
            pytest.skip("needs xfsprogs on the lab hosts")
        sh(conn, f"rm -f {shared} && truncate -s 300M {shared}")
        empty = sh(conn, f"sha256sum {shared}")
        try:
            check = play_role(initiator, tmp_path, "nvmeof_initiator", "lab01", reader, "--check")
            assert check.code == 0, check.output
            why = f"{shared} holds no filesystem yet and lab02 owns it: only the owner makes its "
            assert (f"xfs on {shared}", f"{why}filesystem (it may in this run)") in events_of(
                check, "lab01", "skipped"
            )
            waits = play_role(initiator, tmp_path, "nvmeof_initiator", "lab01", reader)
            assert waits.code != 0
            assert events_of(waits, "lab01", "failed") == [
                (
                    f"xfs on {shared}",
                    f"{why}filesystem (waited 4 s); run the play on lab02 first, then here",
                )
            ]
            assert sh(conn, f"sha256sum {shared}") == empty  # never formatted by a reader

            # The owner, lab02, makes it while the reader waits (the same run on both).
            patient = {**reader, "nvmeof_initiator_owner_wait": 120}
            with ThreadPoolExecutor(1) as pool:
                play = pool.submit(
                    play_role, initiator, tmp_path, "nvmeof_initiator", "lab01", patient
                )
                time.sleep(3)
                sh(conn, f"mkfs.xfs -q -L models {shared}")
                mounted = play.result()
            assert mounted.code == 0, mounted.output
            made = sh(conn, f"sha256sum {shared}")
            uuid = sh(conn, f"blkid -p -s UUID -o value {shared}").strip()
            entry = f"UUID={uuid} /mnt/models xfs ro,norecovery,_netdev,nofail 0 0\n"
            assert entry in sh(conn, "cat /etc/fstab")
            again = play_role(initiator, tmp_path, "nvmeof_initiator", "lab01", reader)
            assert again.code == 0 and events_of(again, "lab01", "changed") == [], again.output
            assert sh(conn, f"sha256sum {shared}") == made
        finally:
            sh(conn, f"rm -f {shared} && sed -i '\\# /mnt/models #d' /etc/fstab")


@pytest.mark.lab
def test_a_host_not_marked_as_lab_fails_with_the_reason(initiator: Any, tmp_path: Path) -> None:
    run = play_role(initiator, tmp_path, "nvmeof_initiator", "lab01", LAB_VARS, lab=False)
    assert run.code != 0
    [(_, msg)] = events_of(run, "lab01", "failed")
    assert msg.startswith("native NVMe multipath: nvme_core is not loaded")
    assert msg.endswith("(this host is not marked as a lab host, so this is a failure)")


#: A state-backed stand-in for nvme-cli (a test double, this file's own; the mi308x lab profile
#: has the shared one): ``connect`` records its arguments, makes the namespace a sparse file
#: /dev/nvme<K>n1 and a path in ``list-subsys``; ``list`` shows it in nvme-cli 2.x's shape.
STAND_IN_NVME = r"""#!/usr/bin/python3
import json, os, sys
state, log, size = "/var/lib/fxkit-test-nvme.json", "/var/log/fxkit-test-nvme.log", 300 << 20
args = sys.argv[1:]
with open(log, "a") as f:
    f.write(json.dumps(args) + "\n")
subs = json.load(open(state)) if os.path.exists(state) else []
if args[:1] == ["connect"]:
    opts = dict(zip(args[1::2], args[2::2]))
    k = len(subs) + 1
    subs.append({"k": k, "nqn": opts["-n"], "transport": opts["-t"],
                 "address": f"traddr={opts['-a']},trsvcid={opts['-s']}"})
    with open(f"/dev/nvme{k}n1", "wb") as f:
        f.truncate(size)
    json.dump(subs, open(state, "w"))
    print(f"connecting to device: nvme{k}")
elif args == ["list-subsys", "-o", "json"]:
    print(json.dumps([{"HostNQN": open("/etc/nvme/hostnqn").read().strip(), "Subsystems": [
        {"Name": f"nvme-subsys{s['k']}", "NQN": s["nqn"], "IOPolicy": "numa", "Paths": [
            {"Name": f"nvme{s['k']}", "Transport": s["transport"], "Address": s["address"],
             "State": "live"}]} for s in subs]}], indent=2))
elif args == ["list", "-o", "json"]:
    print(json.dumps({"Devices": [
        {"NameSpace": 1, "DevicePath": f"/dev/nvme{s['k']}n1", "GenericPath": f"/dev/ng{s['k']}n1",
         "Firmware": "6.1", "ModelNumber": "Linux", "SerialNumber": "fx0001", "UsedBytes": 0,
         "MaximumLBA": size // 512, "PhysicalSize": size, "SectorSize": 512} for s in subs]}))
else:
    sys.exit(f"stand-in nvme: {args} not supported")
"""


@pytest.mark.lab
def test_connect_once_verify_and_format_the_connected_namespace(
    initiator: Any, tmp_path: Path
) -> None:
    """With a stand-in nvme-cli (and /dev/nvme-fabrics) the steps after the gates run: one
    ``nvme connect`` with the variables' options, none on the second run (list-subsys shows the
    path), the namespace verified by count and size, XFS on it found through nvme list."""
    connection = {
        **LAB_VARS["nvmeof_initiator_connections"][0],
        "size": "300M",
        "ctrl_loss_tmo": 600,
    }
    variables = {**LAB_VARS, "nvmeof_initiator_connections": [connection]}
    with initiator.connect("lab01") as conn:
        if not conn.run("command -v mkfs.xfs && test -x /usr/bin/python3").ok:
            pytest.skip("needs xfsprogs and python3 on the lab hosts")
        conn.put("/usr/local/bin/nvme", STAND_IN_NVME.encode())
        sh(conn, "chmod 755 /usr/local/bin/nvme && touch /dev/nvme-fabrics "
                 "&& rm -f /var/lib/fxkit-test-nvme.json /var/log/fxkit-test-nvme.log")  # fmt: skip
        try:
            first = play_role(initiator, tmp_path, "nvmeof_initiator", "lab01", variables)
            assert first.code == 0, first.output
            calls = [
                json.loads(line)
                for line in sh(conn, "cat /var/log/fxkit-test-nvme.log").splitlines()
            ]
            connects = [c for c in calls if c[0] == "connect"]
            assert connects == [["connect", "-t", "rdma", "-a", "192.168.100.10", "-s", "4420",
                                 "-i", "8", "-l", "600", "-n", MODELS]]  # fmt: skip
            done = dict(events_of(first, "lab01", "changed"))
            assert (
                done[f"nvme connect {MODELS}"]
                == f"connected to {MODELS} over rdma 192.168.100.10:4420"
            )
            assert done["xfs on /dev/nvme1n1"] == "made xfs on /dev/nvme1n1"
            uuid = sh(conn, "blkid -p -s UUID -o value /dev/nvme1n1").strip()
            assert f"UUID={uuid} /mnt/models xfs defaults,_netdev,nofail 0 0\n" in sh(
                conn, "cat /etc/fstab"
            )

            second = play_role(initiator, tmp_path, "nvmeof_initiator", "lab01", variables)
            assert second.code == 0 and events_of(second, "lab01", "changed") == [], second.output
            assert (f"nvme connect {MODELS}", "connected: nvme1 (live)") in events_of(
                second, "lab01", "ok"
            )
            calls = sh(conn, "cat /var/log/fxkit-test-nvme.log")
            assert calls.count('"connect"') == 1

            wrong = {**variables, "nvmeof_initiator_connections": [
                {**variables["nvmeof_initiator_connections"][0], "namespaces": 2}]}  # fmt: skip
            short = play_role(initiator, tmp_path, "nvmeof_initiator", "lab01", wrong)
            assert short.code != 0
            [(_, msg)] = events_of(short, "lab01", "failed")
            assert msg == (
                f"nvme list -o json shows 1 namespace(s) of {MODELS} (/dev/nvme1n1 (314572800 "
                "bytes)), wanted 2"
            )
        finally:
            sh(conn, "rm -f /usr/local/bin/nvme /dev/nvme-fabrics /dev/nvme1n1 "
                     "/var/lib/fxkit-test-nvme.json")  # fmt: skip
