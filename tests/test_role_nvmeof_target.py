"""roles/nvmeof_target: the rendered /etc/nvmet/config.json against nvmetcli's own configs key
by key (tests/data/reference/nvmetcli_{rdma,tcp,loop}.json: linux-nvme/nvmetcli at 7a94d925,
rdma.json, tcp.json, examples/loop.json), the variable checks, and the role on real lab hosts:
check mode changes nothing, the file-level steps apply, the steps that need nvmet's configfs are
skipped with their reason (a lab host has no nvmet module), a second run changes nothing, and a
host not marked as a lab host fails with that reason. The restore and its read-back run on
hosts with the simulated mi308x profile (the lead's site-wide test) and are unit-tested here
against a configfs tree written as nvmetcli writes it (test_facts_nvme.write_configfs).
"""

from __future__ import annotations

import inspect
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from nvme_lab import place, play_role, refusal, stand_in_packages
from test_facts_nvme import write_configfs

from fxkit.connection.local import LocalConnection
from fxkit.engine.role import RoleLoader, roles_path
from fxkit.engine.variables import HostVars, Layer
from fxkit.errors import VarError
from fxkit.facts.base import FactCache
from fxkit.ops.base import OpContext
from tests.lab_helpers import changes, events_of, sh, snapshot

REFERENCE = Path(__file__).parent / "data" / "reference"
ROLE = RoleLoader(roles_path(None)).load("nvmeof_target")
CODE = inspect.getmodule(ROLE.apply)
HOST_NQN = "nqn.2014-08.org.nvmexpress:uuid:0a6cb37d-1915-40d2-97a1-4de3c4017f0b"
MODELS = "nqn.2024-01.io.fxkit:models"


def host_vars(name: str = "storage01", **values: Any) -> HostVars:
    return HostVars(name, [Layer("role defaults", ROLE.defaults), Layer("inventory", values)])


def typed(name: str = "storage01", **values: Any) -> Any:
    """The role's typed ``Vars`` of a host with these inventory values."""
    return ROLE.typed(host_vars(name, **values))


#: nvmetcli's examples name their subsystems and hosts with words the role refuses (an NQN is
#: nqn.YYYY-MM.domain:name): the references are compared with these NQNs in their place.
NQNS = {word: f"nqn.2014-08.org.example:{word}" for word in ("testnqn", "hostnqn", "nvmet-always")}
TESTNQN, HOSTNQN, ALWAYS = NQNS.values()


def renamed(value: Any) -> Any:
    """A reference config with each of its words of :data:`NQNS` replaced by its NQN."""
    if isinstance(value, dict):
        return {renamed(k): renamed(item) for k, item in value.items()}
    if isinstance(value, list):
        return [renamed(item) for item in value]
    return NQNS.get(value, value) if isinstance(value, str) else value


#: The variables that describe each of nvmetcli's example configs.
EXAMPLES: dict[str, dict[str, Any]] = {
    "nvmetcli_rdma.json": {
        "nvmeof_target_hosts": [HOSTNQN],
        "nvmeof_target_ports": [
            {"id": 2, "transport": "rdma", "address": "192.168.6.68", "service_id": 4420}
        ],
        "nvmeof_target_subsystems": [
            {
                "nqn": TESTNQN,
                "allow_any_host": True,
                "namespaces": [
                    {
                        "nsid": 1,
                        "path": "/dev/nvme0n1",
                        "nguid": "ef90689c-6c46-d44c-89c1-4067801309a8",
                    }
                ],
            }
        ],
    },
    "nvmetcli_loop.json": {
        "nvmeof_target_ports": [{"id": 1, "transport": "loop"}],
        "nvmeof_target_subsystems": [
            {
                "nqn": TESTNQN,
                "allowed_hosts": [HOSTNQN],
                "namespaces": [
                    {
                        "nsid": 1,
                        "path": "/dev/nvme0n1",
                        "nguid": "ef90689c-6c46-d44c-89c1-4067801309a8",
                    }
                ],
            }
        ],
    },
    "nvmetcli_tcp.json": {
        "nvmeof_target_ports": [
            {"id": 1, "transport": "tcp", "address": "192.168.122.33", "service_id": 4420}
        ],
        "nvmeof_target_subsystems": [
            {
                "nqn": ALWAYS,
                "allow_any_host": True,
                "serial": "123456789abcdef",
                "model": "Linux",
                "attr": {"cntlid_max": 65519, "cntlid_min": 1, "pi_enable": 0, "version": "1.3"},
                "namespaces": [
                    {
                        "nsid": 1,
                        "path": "/dev/nvme0n1",
                        "nguid": "00000000-0000-0000-0000-000000000000",
                        "uuid": "d592cdf3-5d1c-44e0-8412-3fcf7d99df27",
                    }
                ],
            }
        ],
    },
}
#: Keys of tcp.json the role leaves to the kernel's defaults (ANA group 1 optimized, the inline
#: data size, PI off): nvmetcli restores a file without them.
KERNEL_DEFAULTS = {
    "ports[0].ana_groups[0].ana.state",
    "ports[0].ana_groups[0].grpid",
    "ports[0].param.inline_data_size",
    "ports[0].param.pi_enable",
    "subsystems[0].namespaces[0].ana_grpid",
}


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """Every leaf of a config by its path (``ports[0].addr.traddr``); empty lists are leaves."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(flatten(item, f"{prefix}.{key}" if prefix else key))
        return out
    if isinstance(value, list) and value and isinstance(value[0], dict):
        out = {}
        for i, item in enumerate(value):
            out.update(flatten(item, f"{prefix}[{i}]"))
        return out
    return {prefix: value}


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_the_rendered_config_is_nvmetcli_s_own_key_by_key(name: str) -> None:
    assert sorted(p.name for p in REFERENCE.glob("nvmetcli_*.json")) == sorted(EXAMPLES)
    reference = renamed(json.loads((REFERENCE / name).read_text()))
    rendered_text = CODE.render(CODE.nvmet_config(typed(**EXAMPLES[name])))
    rendered = json.loads(rendered_text)
    assert rendered_text == json.dumps(rendered, sort_keys=True, indent=2) + "\n"  # nvmetcli save
    ours, theirs = flatten(rendered), flatten(reference)
    for key, value in ours.items():
        assert key in theirs, f"{name}: {key} is not a key nvmetcli writes"
        assert theirs[key] == value, f"{name}: {key} is {value!r}, nvmetcli's is {theirs[key]!r}"
    left = {k for k in theirs if k not in ours}
    assert left == (KERNEL_DEFAULTS if name == "nvmetcli_tcp.json" else set()), sorted(left)


def test_the_restore_step_compares_configfs_key_by_key(tmp_path: Path) -> None:
    """The step's read-back on a configfs tree as nvmetcli restore writes it: equal is ok (no
    restore); a drifted key triggers ``nvmetcli restore`` (here in check mode: not run)."""
    desired = CODE.nvmet_config(typed(**EXAMPLES["nvmetcli_tcp.json"]))
    root = tmp_path / "nvmet"
    write_configfs(root, desired)
    conn = LocalConnection("localhost")
    path = "/etc/nvmet/config.json"
    same = CODE.nvmet_restore(OpContext(conn, FactCache(conn)), path, desired, False, str(root))
    assert (same.status, same.msg) == ("ok", f"configfs matches {path}")
    (root / "ports/1/addr_trsvcid").write_text("4421\n")
    check = OpContext(conn, FactCache(conn), check=True, diff=True)
    drift = CODE.nvmet_restore(check, path, desired, False, str(root))
    assert drift.changed and drift.data["commands"] == [f"nvmetcli restore {path}"]
    assert "ports[1].addr.trsvcid: wanted '4420', configfs has '4421'" in drift.msg
    assert drift.diff == "ports[1].addr.trsvcid: wanted '4420', configfs has '4421'\n"
    written = CODE.nvmet_restore(
        OpContext(conn, FactCache(conn), check=True), path, {}, True, str(root)
    )
    assert written.changed and "config.json changed" not in written.msg  # the stray objects
    assert f"subsystems[{ALWAYS}]: in configfs, not in the config" in written.msg


# -- validation -------------------------------------------------------------------------------

GOOD = {
    "nvmeof_target_ports": [{"id": 1, "transport": "rdma", "address": "192.168.100.10"}],
    "nvmeof_target_subsystems": [
        {"nqn": MODELS, "allowed_hosts": [HOST_NQN],
         "namespaces": [{"nsid": 1, "path": "/dev/nvme0n1"}]}
    ],
}  # fmt: skip


def bad(change: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps({**GOOD, **change}))


def port(**keys: Any) -> dict[str, Any]:
    return {"nvmeof_target_ports": [{"id": 1, "transport": "tcp", "address": "10.0.0.1", **keys}]}


def subsystem(**keys: Any) -> dict[str, Any]:
    return {"nvmeof_target_subsystems": [{"nqn": MODELS, "allow_any_host": True, **keys}]}


def namespace(**keys: Any) -> dict[str, Any]:
    return subsystem(namespaces=[{"nsid": 1, "path": "/srv/a.img", **keys}])


@pytest.mark.parametrize(
    ("values", "where", "says"),
    [
        (bad({"nvmeof_target_subsystems": [{"nqn": "testnqn", "allow_any_host": True}]}),
         "nvmeof_target_subsystems[0].nqn", "not in the form nqn.YYYY-MM"),
        (bad({"nvmeof_target_subsystems": GOOD["nvmeof_target_subsystems"] * 2}),
         "nvmeof_target_subsystems[1].nqn", "is defined twice"),
        (bad({"nvmeof_target_ports": [{"id": 1, "transport": "rdma"}]}),
         "nvmeof_target_ports[0].address", "port 1 (rdma) has no address"),
        (bad({"nvmeof_target_ports": [{"id": 1, "transport": "tcp", "address": "10.0.0.1"},
                                      {"id": 1, "transport": "tcp", "address": "10.0.0.2"}]}),
         "nvmeof_target_ports[1].id", "port id 1 is used twice"),
        (bad({"nvmeof_target_ports": [{"id": 1, "transport": "tcp", "address": "10.0.0.1"},
                                      {"id": 2, "transport": "tcp", "address": "10.0.0.1"}]}),
         "nvmeof_target_ports[1].address", "tcp 10.0.0.1:4420 is used by two ports"),
        (bad(port(transport="fc")),
         "nvmeof_target_ports[0].transport", "is 'fc': Input should be 'rdma', 'tcp' or 'loop'"),
        (bad(port(id=9000)),
         "nvmeof_target_ports[0].id", "is 9000: Input should be less than or equal to 8192"),
        (bad(port(id=True)), "nvmeof_target_ports[0].id", "a boolean is not a number"),
        (bad(port(address="storage01")),
         "nvmeof_target_ports[0].address", "is 'storage01': not an IP address"),
        (bad(port(service_id=0)),
         "nvmeof_target_ports[0].service_id", "Input should be greater than or equal to 1"),
        (bad(port(adrfam="ipv6")),
         "nvmeof_target_ports[0].adrfam", "adrfam 'ipv6' but 10.0.0.1 is ipv4"),
        (bad(port(adrfam="ib")), "nvmeof_target_ports[0].adrfam", "Input should be 'ipv4'"),
        (bad(port(subsystems=["nqn.2024-01.io.fxkit:none"])),
         "nvmeof_target_ports[0].subsystems", "is not in nvmeof_target_subsystems"),
        (bad(port(subsystems=["models"])),
         "nvmeof_target_ports[0].subsystems[0]", "not in the form"),
        (bad(port(adress="10.0.0.2")),
         "nvmeof_target_ports[0].adress", "Extra inputs are not permitted"),
        (bad({"nvmeof_target_ports": {"id": 1}}),
         "nvmeof_target_ports", "Input should be a valid list"),
        (bad({"nvmeof_target_subsystems": [{"nqn": MODELS, "allowed_hosts": [HOST_NQN],
              "namespaces": [{"nsid": 1, "path": "/a"}, {"nsid": 1, "path": "/b"}]}]}),
         "nvmeof_target_subsystems[0].namespaces[1].nsid", "nsid 1 is used twice"),
        (bad(namespace(nsid=0)),
         "nvmeof_target_subsystems[0].namespaces[0].nsid", "greater than or equal to 1"),
        (bad(namespace(path="dev/nvme0n1")),
         "nvmeof_target_subsystems[0].namespaces[0].path", "not an absolute path"),
        (bad(namespace(path="/srv/nvmet/")),
         "nvmeof_target_subsystems[0].namespaces[0].path", "not an absolute path"),
        (bad(namespace(size="lots")),
         "nvmeof_target_subsystems[0].namespaces[0].size", "is 'lots': not a size"),
        (bad(namespace(size=0)),
         "nvmeof_target_subsystems[0].namespaces[0].size", "is 0: not a size"),
        (bad(namespace(uuid="1234")),
         "nvmeof_target_subsystems[0].namespaces[0].uuid", "not a UUID"),
        (bad(namespace(enable="maybe")),
         "nvmeof_target_subsystems[0].namespaces[0].enable", "valid boolean"),
        (bad({"nvmeof_target_subsystems": [{"nqn": MODELS, "allowed_hosts": ["host1"]}]}),
         "nvmeof_target_subsystems[0].allowed_hosts[0]", "'host1' is not in the form"),
        (bad({"nvmeof_target_subsystems": [{"nqn": MODELS}]}),
         "nvmeof_target_subsystems[0].allowed_hosts", "no host may connect"),
        (bad({"nvmeof_target_subsystems": [{"nqn": MODELS, "allow_any_host": True,
                                            "allowed_hosts": [HOST_NQN]}]}),
         "nvmeof_target_subsystems[0].allow_any_host", "allowed_hosts are given"),
        (bad(subsystem(allow_any_host="maybe")),
         "nvmeof_target_subsystems[0].allow_any_host", "valid boolean"),
        (bad(subsystem(serial="x" * 21)),
         "nvmeof_target_subsystems[0].serial", "not 1 to 20 printable ASCII characters"),
        (bad(subsystem(serial="fx\u00e9")),
         "nvmeof_target_subsystems[0].serial", "not 1 to 20 printable ASCII characters"),
        (bad(subsystem(model="")),
         "nvmeof_target_subsystems[0].model", "not 1 to 40 printable ASCII characters"),
        (bad(subsystem(attr={"Version": "1.3"})),
         "nvmeof_target_subsystems[0].attr.Version[key]", "not an attribute name"),
        (bad(subsystem(attr={"version": ["1.3"]})),
         "nvmeof_target_subsystems[0].attr.version", "Input should be a valid string"),
        (bad({"nvmeof_target_hosts": ["host1"]}), "nvmeof_target_hosts[0]", "not in the form"),
        (bad({"nvmeof_target_config_file": "config.json"}),
         "nvmeof_target_config_file", "not absolute"),
    ],
)  # fmt: skip
def test_wrong_variables_name_the_host_and_the_variable(
    values: dict[str, Any], where: str, says: str
) -> None:
    CODE.validate(typed(**GOOD))  # the good ones pass
    problem = refusal(ROLE, host_vars(**values))
    assert problem.where.startswith("storage01: ")
    assert (place(problem), says in problem.message) == (where, True), problem


def test_values_are_taken_as_an_inventory_gives_them() -> None:
    """Digits in strings (an INI inventory, -e), sizes in bytes, attributes as numbers."""
    values = {
        "nvmeof_target_ports": [{"id": "1", "transport": "loop", "service_id": "4420"}],
        **namespace(size=1 << 30, enable="no"),
    }
    values["nvmeof_target_subsystems"][0]["attr"] = {"version": 1.3, "cntlid_max": 65519}
    config = CODE.nvmet_config(typed(**values))
    assert config["ports"][0]["portid"] == 1
    assert config["subsystems"][0]["attr"] == {
        "allow_any_host": "1", "version": "1.3", "cntlid_max": "65519"
    }  # fmt: skip
    assert config["subsystems"][0]["namespaces"][0]["enable"] == 0
    assert typed(**values).nvmeof_target_subsystems[0].namespaces[0].size == str(1 << 30)


def test_an_nqn_on_two_targets_is_refused_naming_both() -> None:
    hosts = {
        "storage01": typed("storage01", **GOOD),
        "storage02": typed("storage02", **GOOD),
    }
    with pytest.raises(VarError) as caught:
        CODE.validate_all(hosts, Targets(hosts))
    assert caught.value.where == "storage02: nvmeof_target_subsystems[0].nqn (inventory)"
    assert f"subsystem {MODELS} is defined on storage01 and on storage02" in caught.value.message
    one = {"storage01": hosts["storage01"]}
    CODE.validate_all(one, Targets(one))


@dataclass
class Targets:
    """The fleet of a play of targets only (no initiator in the inventory)."""

    hosts: dict[str, Any]

    def of(self, role: str) -> dict[str, Any]:
        return self.hosts if role == "nvmeof_target" else {}


def test_the_shipped_unit_is_valid_for_systemd_analyze() -> None:
    """nvmet.service as nvmetcli ships it (the role enables it; it writes no unit of its own):
    systemd-analyze's only complaint here is that nvmetcli is not installed on this machine."""
    if not shutil.which("systemd-analyze"):
        pytest.skip("systemd-analyze is not installed")
    done = subprocess.run(
        ["systemd-analyze", "verify", str(REFERENCE / "nvmet.service")],
        capture_output=True,
        text=True,
    )
    complaints = [line for line in done.stderr.splitlines() if "is not executable" not in line]
    assert complaints == [], done.stderr


# -- on lab hosts -----------------------------------------------------------------------------

LAB_VARS = {
    "nvmeof_target_ports": [
        {"id": 1, "transport": "rdma", "address": "192.168.100.10"},
        {"id": 2, "transport": "tcp", "address": "192.168.100.10", "service_id": 4420},
    ],
    "nvmeof_target_subsystems": [
        {"nqn": MODELS, "allowed_hosts": [HOST_NQN], "serial": "fx0001", "model": "fxkit",
         "namespaces": [{"nsid": 1, "path": "/srv/nvmet/models.img", "size": "64M"},
                        {"nsid": 2, "path": "/dev/nvme0n1"}]},
    ],
}  # fmt: skip
#: Plain lab host: the steps that cannot run, with their reasons (the module steps persist
#: their files, so they count as changed, and say that the module loads at boot).
SKIPS = [
    ("service nvmet.service", "systemd is not running on this host (PID 1 is sshd)"),
    (
        "apply the nvmet configuration",
        "apply the nvmet configuration: /sys/kernel/config/nvmet does not exist (configfs is not "
        "mounted or the nvmet module is not loaded)",
    ),
]


@pytest.fixture(scope="module")
def target(lab_fleet: Any) -> Any:
    fleet = lab_fleet(1, name="nvmet")
    with fleet.connect("lab01") as conn:
        stand_in_packages(conn, "nvmetcli")
    return fleet


@pytest.mark.lab
def test_on_a_plain_lab_host_files_apply_and_configfs_steps_skip_with_reasons(
    target: Any, tmp_path: Path
) -> None:
    before = snapshot(target, "lab01")
    check = play_role(target, tmp_path, "nvmeof_target", "lab01", LAB_VARS, "--check", "--diff")
    assert check.code == 0, check.output
    assert changes(before, snapshot(target, "lab01")) == [], "check mode changed the host"
    assert '+        "trtype": "rdma"' in check.output  # the diff of config.json
    assert check.counts("skipped") == {"lab01": len(SKIPS)}

    first = play_role(target, tmp_path, "nvmeof_target", "lab01", LAB_VARS)
    assert first.code == 0, first.output
    changed = [op for op, _ in events_of(first, "lab01", "changed")]
    assert changed == [
        "packages",
        "create_file /srv/nvmet/models.img",
        "directory /etc/nvmet",
        "file /etc/nvmet/config.json",
        "module nvmet",
        "module nvmet-rdma",
        "module nvmet-tcp",
    ]
    skipped = events_of(first, "lab01", "skipped")
    for op, reason in SKIPS:
        assert any(o == op and reason in msg for o, msg in skipped), (op, skipped)
    assert len(skipped) == len(SKIPS)
    modules = [msg for op, msg in events_of(first, "lab01", "changed") if op.startswith("module")]
    assert all("persisted; loads at boot: " in msg for msg in modules), modules
    with target.connect("lab01") as conn:
        written = json.loads(sh(conn, "cat /etc/nvmet/config.json"))
        assert written == CODE.nvmet_config(typed(**LAB_VARS))
        assert sh(conn, "stat -c %a /etc/nvmet/config.json") == "600\n"
        assert sh(conn, "cat /etc/modules-load.d/nvmet-rdma.conf") == "nvmet-rdma\n"
        assert sh(conn, "stat -c '%s %b' /srv/nvmet/models.img").split()[0] == str(64 << 20)
        assert sh(conn, "dpkg-query -W -f '${Version}' nvmetcli") == "0.0-fxkit"
    converged = snapshot(target, "lab01")

    second = play_role(target, tmp_path, "nvmeof_target", "lab01", LAB_VARS)
    assert second.code == 0, second.output
    assert events_of(second, "lab01", "changed") == []
    assert changes(converged, snapshot(target, "lab01")) == []


@pytest.mark.lab
def test_a_backing_file_with_data_is_never_touched(target: Any, tmp_path: Path) -> None:
    with target.connect("lab01") as conn:
        sh(conn, "mkdir -p /srv/data && printf 'precious' > /srv/data/ns.img")
        variables = {
            "nvmeof_target_subsystems": [
                {"nqn": MODELS, "allow_any_host": True,
                 "namespaces": [{"nsid": 1, "path": "/srv/data/ns.img", "size": "1G"}]}
            ]
        }  # fmt: skip
        run = play_role(target, tmp_path, "nvmeof_target", "lab01", variables)
        assert run.code == 0, run.output
        assert ("create_file /srv/data/ns.img", "/srv/data/ns.img exists") in events_of(
            run, "lab01", "ok"
        )
        assert sh(conn, "cat /srv/data/ns.img") == "precious"


@pytest.mark.lab
def test_a_host_not_marked_as_lab_fails_with_the_reason(target: Any, tmp_path: Path) -> None:
    run = play_role(target, tmp_path, "nvmeof_target", "lab01", LAB_VARS, lab=False)
    assert run.code != 0
    [failure] = events_of(run, "lab01", "failed")
    assert failure[1] == (
        "apply the nvmet configuration: /sys/kernel/config/nvmet does not exist (configfs is not "
        "mounted or the nvmet module is not loaded) (this host is not marked as a lab host, so "
        "this is a failure)"
    )


@pytest.mark.lab
def test_wrong_variables_stop_the_play_before_any_host_is_touched(
    target: Any, tmp_path: Path
) -> None:
    before = snapshot(target, "lab01")
    wrong = bad({"nvmeof_target_ports": [{"id": 1, "transport": "rdma"}]})
    run = play_role(target, tmp_path, "nvmeof_target", "lab01", wrong, executable=True)
    assert run.code != 0 and run.events == []
    assert "lab01: nvmeof_target_ports[0].address (" in run.output
    assert "): port 1 (rdma) has no address" in run.output
    assert changes(before, snapshot(target, "lab01")) == []


def stand_in_nvmetcli(folder: Path, root: Path) -> Path:
    """``nvmetcli restore FILE`` as a test double: it clears ``root`` and writes the file's tree
    there (test_facts_nvme.write_configfs), and, like the real one, a namespace whose device
    does not exist stays disabled with a message while the exit status stays 0."""
    tool = folder / "nvmetcli"
    tool.write_text(
        f"#!{sys.executable}\n"
        "import json, os, shutil, sys\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "from test_facts_nvme import write_configfs\n"
        f"root = {str(root)!r}\n"
        "assert sys.argv[1] == 'restore', sys.argv\n"
        "config = json.load(open(sys.argv[2]))\n"
        "for sub in config['subsystems']:\n"
        "    for ns in sub['namespaces']:\n"
        "        if not os.path.exists(ns['device']['path']):\n"
        "            ns['enable'] = 0\n"
        "            where = f\"{root}/subsystems/{sub['nqn']}/namespaces/{ns['nsid']}\"\n"
        "            print(f'Cannot enable {where}: No such file or directory (1), skipped')\n"
        "shutil.rmtree(root, ignore_errors=True)\n"
        "write_configfs(__import__('pathlib').Path(root), config)\n"
    )
    tool.chmod(0o755)
    return folder


def test_a_restore_is_read_back_and_a_silent_failure_is_caught(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "nvmet"
    write_configfs(root, {"hosts": [], "ports": [], "subsystems": []})  # nvmet just loaded
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", f"{stand_in_nvmetcli(bin_dir, root)}:{os.environ['PATH']}")
    backing = tmp_path / "ns1.img"
    backing.write_bytes(b"")
    variables = json.loads(json.dumps(GOOD))
    variables["nvmeof_target_subsystems"][0]["namespaces"] = [{"nsid": 1, "path": str(backing)}]
    desired = CODE.nvmet_config(typed(**variables))
    config = tmp_path / "config.json"
    config.write_text(CODE.render(desired))
    conn = LocalConnection("localhost")

    def restore(written: bool) -> Any:
        ctx = OpContext(conn, FactCache(conn), diff=True)
        return CODE.nvmet_restore(ctx, str(config), desired, written, str(root))

    applied = restore(written=True)
    assert applied.changed, applied
    assert applied.msg == f"restored {config}; configfs read back matches it"
    assert "subsystems[nqn.2024-01.io.fxkit:models]: not in configfs" in applied.diff
    assert restore(written=False).msg == f"configfs matches {config}"

    backing.unlink()  # nvmetcli cannot enable the namespace, and still exits 0
    failed = restore(written=True)
    assert failed.failed
    assert failed.msg.startswith(f"nvmetcli restore exited 0 but configfs differs from {config}: ")
    assert (
        "subsystems[nqn.2024-01.io.fxkit:models].namespaces[1].enable: wanted 1, configfs has 0"
        in (failed.msg)
    )
    assert "(nvmetcli said: Cannot enable" in failed.msg
