"""The NVMe-oF fabric checked as a whole before any host is touched (fxkit/nvme_fabric.py, the
``validate_all`` of roles/nvmeof_initiator and roles/nvmeof_target), with the real
playbooks/storage.yml and roles: no namespace written by two hosts, and what the targets export
is what the initiators expect. No host is contacted: the connector fails the test if called.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from fxkit.engine.playbook import Playbook
from fxkit.engine.record import Recorder
from fxkit.engine.runner import Runner, RunOptions, load_inventory
from fxkit.errors import VarError

REPO = Path(__file__).resolve().parent.parent
STORAGE = REPO / "playbooks" / "storage.yml"
MODELS = "nqn.2026-01.io.fxkit:models"
NODE = "nqn.2026-01.io.fxkit:node-{{ inventory_hostname }}"


def hostnqn(n: int) -> str:
    return f"nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-00000000000{n}"


def connection(nqn: str, address: str) -> dict[str, Any]:
    return {"nqn": nqn, "transport": "rdma", "address": address, "namespaces": 1}


def subsystem(nqn: str, *hosts: int, nsids: tuple[int, ...] = (1,)) -> dict[str, Any]:
    namespaces = [{"nsid": n, "path": f"/dev/nvme{n}n1"} for n in nsids]
    return {"nqn": nqn, "allowed_hosts": [hostnqn(h) for h in hosts], "namespaces": namespaces}


def target(address: str, *subsystems: dict[str, Any]) -> dict[str, Any]:
    port = {"id": 1, "transport": "rdma", "address": address}
    return {"nvmeof_target_ports": [port], "nvmeof_target_subsystems": list(subsystems)}


def good() -> dict[str, Any]:
    """Both layouts: a shared read-only model library written by gpu01, and a namespace of
    each node's own (the example inventory's design, docs/storage.md)."""
    return {
        "all": {
            "children": {
                "gpu_nodes": {
                    "hosts": {
                        "gpu01": {"nvmeof_initiator_hostnqn": hostnqn(1)},
                        "gpu02": {"nvmeof_initiator_hostnqn": hostnqn(2)},
                    },
                    "vars": {
                        "nvmeof_initiator_connections": [
                            connection(MODELS, "10.0.0.1"),
                            connection(NODE, "10.0.0.2"),
                        ],
                        "nvmeof_initiator_filesystems": [
                            {"nqn": MODELS, "nsid": 1, "path": "/mnt/models", "owner": "gpu01"},
                            {"nqn": NODE, "nsid": 1, "path": "/mnt/local"},
                        ],
                    },
                },
                "storage_targets": {
                    "hosts": {
                        "tgt01": target("10.0.0.1", subsystem(MODELS, 1, 2)),
                        "tgt02": target(
                            "10.0.0.2",
                            subsystem("nqn.2026-01.io.fxkit:node-gpu01", 1),
                            subsystem("nqn.2026-01.io.fxkit:node-gpu02", 2),
                        ),
                    }
                },
            }
        }
    }


def never(name: str, *_: object) -> None:
    raise AssertionError(f"{name} was contacted")


def runner(tmp_path: Path, inventory: dict[str, Any], **options: Any) -> Runner:
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(inventory))
    return Runner(
        Playbook.load(STORAGE),
        load_inventory(tmp_path / "hosts.yml"),
        RunOptions(check=True, **options),
        Recorder(),
        connector=never,  # type: ignore[arg-type]
    )


def refused(tmp_path: Path, inventory: dict[str, Any], **options: Any) -> VarError:
    with pytest.raises(VarError) as caught:
        runner(tmp_path, inventory, **options).run()
    return caught.value


def gpu_vars(inv: dict[str, Any]) -> dict[str, Any]:
    return inv["all"]["children"]["gpu_nodes"]["vars"]  # type: ignore[no-any-return]


def targets(inv: dict[str, Any]) -> dict[str, Any]:
    return inv["all"]["children"]["storage_targets"]["hosts"]  # type: ignore[no-any-return]


@pytest.mark.parametrize("limit", [None, "gpu01", "storage_targets"])
def test_both_layouts_pass(tmp_path: Path, limit: str | None) -> None:
    runner(tmp_path, good(), limit=limit).validate()


def _shared_rw(inv: dict[str, Any]) -> None:
    del gpu_vars(inv)["nvmeof_initiator_filesystems"][0]["owner"]


@pytest.mark.parametrize("limit", [None, "gpu01", "storage_targets"])
def test_a_namespace_two_hosts_mount_read_write_is_refused(
    tmp_path: Path, limit: str | None
) -> None:
    """--limit narrows nothing here: the check is across the inventory."""
    inv = good()
    _shared_rw(inv)
    problem = refused(tmp_path, inv, limit=limit)
    assert problem.where.startswith("gpu02: nvmeof_initiator_filesystems[0] (")
    assert (
        f"nsid 1 of {MODELS} carries a filesystem that 2 hosts would mount read-write (and make "
        "where it is empty): gpu01 (/mnt/models), gpu02 (/mnt/models). XFS is not a cluster "
        "filesystem" in problem.message
    )
    assert problem.hint is not None
    assert "give each host a namespace of its own" in problem.hint
    assert "the same owner (the staging host) on every host's entry" in problem.hint
    assert "ro,norecovery" in problem.hint


def _mutate(change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    inv = good()
    change(inv)
    return inv


def _owner(inv: dict[str, Any]) -> None:
    gpu_vars(inv)["nvmeof_initiator_filesystems"][0]["owner"] = "gpu09"


def _owners(inv: dict[str, Any]) -> None:
    models = {"nqn": MODELS, "nsid": 1, "path": "/mnt/models"}
    hosts = inv["all"]["children"]["gpu_nodes"]["hosts"]
    hosts["gpu01"]["nvmeof_initiator_filesystems"] = [{**models, "owner": "gpu01"}]
    hosts["gpu02"]["nvmeof_initiator_filesystems"] = [{**models, "owner": "gpu01"}]
    hosts["gpu03"] = {
        "nvmeof_initiator_hostnqn": hostnqn(3),
        "nvmeof_initiator_connections": [connection(MODELS, "10.0.0.1")],
        "nvmeof_initiator_filesystems": [{**models, "owner": "gpu02"}],
    }
    targets(inv)["tgt01"]["nvmeof_target_subsystems"][0] = subsystem(MODELS, 1, 2, 3)


def _more_namespaces(inv: dict[str, Any]) -> None:
    targets(inv)["tgt01"]["nvmeof_target_subsystems"][0] = subsystem(MODELS, 1, 2, nsids=(1, 2))


def _unexported(inv: dict[str, Any]) -> None:
    gpu_vars(inv)["nvmeof_initiator_connections"][0]["nqn"] = "nqn.2026-01.io.fxkit:other"


def _not_allowed(inv: dict[str, Any]) -> None:
    targets(inv)["tgt01"]["nvmeof_target_subsystems"][0] = subsystem(MODELS, 1)


def _no_hostnqn(inv: dict[str, Any]) -> None:
    del inv["all"]["children"]["gpu_nodes"]["hosts"]["gpu02"]["nvmeof_initiator_hostnqn"]
    own = targets(inv)["tgt02"]["nvmeof_target_subsystems"][1]  # gpu02's: any host may connect
    own.update(allowed_hosts=[], allow_any_host=True)


def _address(inv: dict[str, Any]) -> None:
    gpu_vars(inv)["nvmeof_initiator_connections"][0]["address"] = "10.0.0.9"


def _nsid(inv: dict[str, Any]) -> None:
    gpu_vars(inv)["nvmeof_initiator_filesystems"][0]["nsid"] = 2


def _reader_rw(inv: dict[str, Any]) -> None:
    gpu_vars(inv)["nvmeof_initiator_filesystems"][0]["reader_opts"] = "rw,_netdev"


@pytest.mark.parametrize(
    ("change", "where", "says"),
    [
        (_owner, "gpu01: nvmeof_initiator_filesystems[0].owner",
         f"owner gpu09 of nsid 1 of {MODELS} does not mount it (it is mounted by gpu01, gpu02): "
         "no host would make its filesystem"),
        (_owners, "gpu03: nvmeof_initiator_filesystems[0].owner",
         f"the hosts that mount nsid 1 of {MODELS} name different owners (gpu01 names gpu01, "
         "gpu02 names gpu01, gpu03 names gpu02)"),
        (_more_namespaces, "gpu01: nvmeof_initiator_connections[0].namespaces",
         f"gpu01, gpu02 expect(s) 1 namespace(s) of {MODELS}, tgt01 exports 2 (nsid 1, 2)"),
        (_unexported, "gpu01: nvmeof_initiator_connections[0].nqn",
         "gpu01, gpu02 connect(s) to nqn.2026-01.io.fxkit:other, which no target of the "
         f"inventory exports (tgt01 exports {MODELS}; tgt02 exports "
         "nqn.2026-01.io.fxkit:node-gpu01; tgt02 exports nqn.2026-01.io.fxkit:node-gpu02)"),
        (_not_allowed, "gpu02: nvmeof_initiator_hostnqn",
         f"gpu02 (host NQN {hostnqn(2)}) is not in the allowed_hosts of {MODELS} on tgt01"),
        (_no_hostnqn, "gpu02: nvmeof_initiator_hostnqn",
         f"gpu02 set(s) no host NQN, so tgt01 cannot allow it to connect to {MODELS}"),
        (_address, "gpu01: nvmeof_initiator_connections[0].address",
         f"gpu01, gpu02 connect(s) to {MODELS} over rdma 10.0.0.9:4420, where tgt01 does not "
         "offer it (it does on: rdma 10.0.0.1:4420)"),
        (_nsid, "gpu01: nvmeof_initiator_filesystems[0].nsid",
         f"gpu01, gpu02 put(s) a filesystem on nsid 2 of {MODELS}, but tgt01 exports nsid 1 "
         "of it"),
        (_reader_rw, "gpu01: nvmeof_initiator_filesystems[0].reader_opts",
         "'rw,_netdev' does not mount read-only"),
    ],
)  # fmt: skip
def test_each_mismatch_is_one_clear_error_before_any_host_is_touched(
    tmp_path: Path, change: Callable[[dict[str, Any]], None], where: str, says: str
) -> None:
    text = str(refused(tmp_path, _mutate(change)))  # where: host: variable (file:line)
    assert f"{where} (" in text and says in text, text


def test_several_problems_are_named_at_once(tmp_path: Path) -> None:
    inv = good()
    _shared_rw(inv)
    _more_namespaces(inv)
    problem = refused(tmp_path, inv)
    assert "the NVMe-oF fabric of the inventory has 2 problems (nothing was changed)" in str(
        problem
    )
    assert "would mount read-write" in problem.message
    assert "expect(s) 1 namespace(s)" in problem.message


def test_without_targets_in_the_inventory_only_the_writers_are_checked(tmp_path: Path) -> None:
    """Targets fxkit does not manage (an appliance): what they export cannot be compared."""
    inv = good()
    del inv["all"]["children"]["storage_targets"]
    runner(tmp_path, copy.deepcopy(inv)).validate()
    _shared_rw(inv)
    assert "would mount read-write" in refused(tmp_path, inv).message


def test_the_example_inventory_passes_and_its_old_layout_is_refused(tmp_path: Path) -> None:
    """inventory/mi308x.yml: a namespace of each node's own plus the shared read-only library.
    Its old layout, every node mounting the model namespace read-write, is refused."""
    example = REPO / "inventory" / "mi308x.yml"

    def run(**extra: Any) -> Runner:
        return Runner(
            Playbook.load(STORAGE),
            load_inventory(example),
            RunOptions(check=True, extra_vars=extra),
            Recorder(),
            connector=never,  # type: ignore[arg-type]
        )

    run().validate()
    old = [{"nqn": MODELS, "nsid": 1, "path": "/mnt/models", "label": "models"}]
    with pytest.raises(VarError) as caught:
        run(nvmeof_initiator_filesystems=old).run()
    assert (
        "4 hosts would mount read-write (and make where it is empty): gpu01 (/mnt/models), "
        "gpu02 (/mnt/models), gpu03 (/mnt/models), gpu04 (/mnt/models)" in caught.value.message
    )


def test_one_host_mounting_a_namespace_at_two_paths_is_one_writer(tmp_path: Path) -> None:
    inv = good()
    own = {"nqn": NODE, "nsid": 1}
    gpu_vars(inv)["nvmeof_initiator_filesystems"][1:] = [
        {**own, "path": "/mnt/local"},
        {**own, "path": "/mnt/local2"},
    ]
    runner(tmp_path, inv).validate()
