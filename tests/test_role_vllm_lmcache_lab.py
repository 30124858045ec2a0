"""roles/vllm_lmcache on real lab hosts (2: each virtualenv is ~1 GB of the host's RAM).

There is no vLLM here: the hosts get what the rollout's CI runs instead (no vLLM,
``vllm_lmcache_server: serve-probe``): a virtualenv of torch CPU, fxkit (built from this
checkout) and serve-probe's libraries, all from a wheelhouse copied over (tests/lab_wheelhouse.py),
as on an air-gapped node. Check mode changes nothing; a run converges; a second run changes
nothing; torch is the version installed first and fxkit's loader imports in the venv; the files
on the host are what instance_specs says and LMCache's own code reads the config; the checks
that need the host (local_disk on a mount, the disk budget) fail naming the variable and host;
the torch read-back fails a changed torch; LMCache from a pinned commit (a stand-in source tree:
no hipcc here) is built once, with LMCACHE_TARGET_DEVICE=HIP and CXX=hipcc.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

import lab_wheelhouse
import pytest
import yaml
from nvme_lab import play_role
from test_role_vllm_lmcache_fidelity import LMCACHE_VERSION, lmcache_config_module

from fxkit.engine.role import RoleLoader, roles_path
from fxkit.engine.variables import HostVars, Layer
from fxkit.facts.base import FactCache
from fxkit.ops.base import OpContext, Status
from tests.lab_helpers import changes, events_of, sh, snapshot

ROLE = RoleLoader(roles_path(None)).load("vllm_lmcache")
CODE = inspect.getmodule(ROLE.apply)
HOSTS = ["lab01", "lab02"]
#: The deployment's link to the venv its variables want (each set of pins has its own venv).
VENV = "/opt/fxkit/venvs/probe"


def venv_of(variables: dict[str, Any]) -> str:
    """The venv the role makes for ``variables`` (``<prefix>/probe.venvs/v-<digest>``)."""
    given = {**variables, "vllm_lmcache_bind_host": "127.0.0.1"}  # (per host; not a pin)
    layers = [Layer("role defaults", ROLE.defaults), Layer("inventory", given)]
    return str(CODE.venv(ROLE.typed(HostVars("lab01", layers))))


def lab_vars(house: Path, **values: Any) -> dict[str, Any]:
    return {
        "vllm_lmcache_deployment": "probe",
        "vllm_lmcache_vllm_version": False,  # (None would drop it from the inventory)
        "vllm_lmcache_torch_version": "2.13.0+cpu",
        "vllm_lmcache_lmcache_version": False,  # PyPI's wheels are CUDA builds
        "vllm_lmcache_server": "serve-probe",
        "vllm_lmcache_python": "/usr/bin/python3",  # the lab's Python (3.11, as the wheels)
        "vllm_lmcache_wheelhouse": str(house),
        "vllm_lmcache_packages": ["uvicorn", "starlette", "prometheus_client"],
        "vllm_lmcache_model": "/srv/models/tiny",
        "vllm_lmcache_layout": "TP4x2",
        "vllm_lmcache_bind_host": "{{ ansible_host }}",
        # /tmp is a mount of its own on a lab host (tmpfs): LMCache's disk tier goes there
        "vllm_lmcache_local_disk": "/tmp/lmcache",
        "vllm_lmcache_max_local_disk_size": 0.01,
        # No checkpoint here: the instances are started by tests/test_rollout_vllm_lab.py.
        "vllm_lmcache_rollout_instances": [],
        **values,
    }


@pytest.fixture(scope="module")
def converged(lab_fleet: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The fleet after check mode, a first and a second run (the slow part, once)."""
    house = lab_wheelhouse.build(tmp_path_factory.mktemp("wheelhouse") / "wheels")
    fleet = lab_fleet(2, name="vllm-lmcache")
    folder = tmp_path_factory.mktemp("play")
    variables = lab_vars(house)
    before = {h: snapshot(fleet, h) for h in HOSTS}
    check = play_role(fleet, folder, "vllm_lmcache", "all", variables, "--check")
    after_check = {h: snapshot(fleet, h) for h in HOSTS}
    first = play_role(fleet, folder, "vllm_lmcache", "all", variables)
    done = {h: snapshot(fleet, h) for h in HOSTS}
    second = play_role(fleet, folder, "vllm_lmcache", "all", variables)
    return {
        "fleet": fleet, "folder": folder, "house": house, "vars": variables, "check": check,
        "first": first, "second": second, "changed_by_check": {
            h: changes(before[h], after_check[h]) for h in HOSTS},
        "changed_by_second": {h: changes(done[h], snapshot(fleet, h)) for h in HOSTS},
    }  # fmt: skip


@pytest.mark.lab
def test_check_mode_changes_nothing_then_a_run_converges_and_a_rerun_changes_nothing(
    converged: dict[str, Any],
) -> None:
    check, first, second = converged["check"], converged["first"], converged["second"]
    venv = venv_of(converged["vars"])
    assert venv.startswith("/opt/fxkit/venvs/probe.venvs/v-")
    assert check.code == 0, check.output
    assert converged["changed_by_check"] == {"lab01": [], "lab02": []}
    assert (f"virtualenv {venv}", f"would change virtualenv: absent -> {venv}, "
            "torch: absent -> 2.13.0+cpu") in events_of(check, "lab01", "changed")  # fmt: skip
    assert first.code == 0, first.output
    for host in HOSTS:
        done = [op for op, _ in events_of(first, host, "changed")]
        assert f"virtualenv {venv}" in done and "unit vllm@.service" in done
        assert f"link {VENV}" in done
        with converged["fleet"].connect(host) as conn:
            assert sh(conn, f"readlink {VENV}").strip() == "probe.venvs/" + venv.rsplit("/", 1)[1]
        # A run acts on the instances it is given only (none here): no environment file.
        assert not any(op.startswith(("env file", "instance")) for op in done)
        assert [op for op, _ in events_of(first, host, "failed")] == []
    assert second.code == 0, second.output
    assert events_of(second, "lab01", "changed") == events_of(second, "lab02", "changed") == []
    assert converged["changed_by_second"] == {"lab01": [], "lab02": []}


@pytest.mark.lab
def test_the_venv_has_fxkit_and_the_torch_installed_first(converged: dict[str, Any]) -> None:
    fleet = converged["fleet"]
    venv = venv_of(converged["vars"])
    [(_, verified)] = [
        e for e in events_of(converged["second"], "lab01", "ok") if e[0] == f"verify {venv}"
    ]
    assert "torch 2.13.0+cpu, fxkit 0.1.0, fxkit.loader imports" in verified
    with fleet.connect("lab01") as conn:
        said = sh(conn, f"{VENV}/bin/python -c 'import fxkit.loader, torch, uvicorn, starlette; "
                        "print(torch.__version__)'")  # fmt: skip
        assert said.strip() == "2.13.0+cpu"
        assert sh(conn, f"cat {VENV}/fxkit-constraints.txt") == "torch==2.13.0+cpu\n"
        helped = conn.run(f"{VENV}/bin/fxkit serve-probe --help")
        if helped.ok:  # the probe's branch is merged
            assert "--served-model-name" in helped.stdout
        else:
            assert sh(conn, f"{VENV}/bin/fxkit --help").startswith("Usage")


@pytest.mark.lab
def test_the_files_on_the_host_are_what_the_specs_say(
    converged: dict[str, Any], tmp_path: Path
) -> None:
    fleet = converged["fleet"]
    address = fleet.address("lab02")
    inventory = {**converged["vars"], "ansible_host": address}
    layers = [Layer("role defaults", ROLE.defaults), Layer("inventory", inventory)]
    v = ROLE.typed(HostVars("lab02", layers))
    with fleet.connect("lab02") as conn:
        bound = v.vllm_lmcache_bind_host
        assert bound == address  # the inventory's ansible_host, rendered
        specs = CODE.instance_specs(v)
        assert [(s.name, s.port, s.ready_url) for s in specs] == [
            ("tp4-0", 8000, f"http://{address}:8000/v1/models"),
            ("tp4-1", 8001, f"http://{address}:8001/v1/models"),
        ]
        for spec in specs:  # written when the instance is started: test_rollout_vllm_lab.py
            assert not conn.run(f"test -e {spec.env_file}").ok
        assert sh(conn, "cat /etc/systemd/system/vllm@.service") == CODE.unit_text(v)
        rendered = sh(conn, "cat /etc/fxkit/vllm/probe/lmcache.yaml")
        assert sh(conn, "stat -c %F /tmp/lmcache").strip() == "directory"
    (tmp_path / "lmcache.yaml").write_text(rendered)
    meant = yaml.safe_load(rendered)
    assert meant["local_disk"] == "file:///tmp/lmcache/"
    with lmcache_config_module(LMCACHE_VERSION, tmp_path) as config:
        assert set(meant) <= set(config._CONFIG_DEFINITIONS)
        read = config.LMCacheEngineConfig.from_file(str(tmp_path / "lmcache.yaml"))
    assert (read.local_disk, read.max_local_disk_size) == ("/tmp/lmcache/", 0.01)


@pytest.mark.lab
@pytest.mark.parametrize(
    ("values", "says"),
    [
        ({"vllm_lmcache_local_disk": "/mnt/fx/lmcache"},
         "lab01: vllm_lmcache_local_disk: /mnt/fx/lmcache is not on a mounted filesystem"),
        ({"vllm_lmcache_local_disk": ["/tmp/lmcache", "/mnt/fx/lmcache"]},
         "lab01: vllm_lmcache_local_disk[1]: /mnt/fx/lmcache is not on a mounted filesystem"),
        ({"vllm_lmcache_max_local_disk_size": 100000},
         "lab01: vllm_lmcache_max_local_disk_size: 8 GPU workers x 100000 GiB"),
        ({"vllm_lmcache_layout": [[0, 1], [1, 2]]},
         "lab01: vllm_lmcache_layout"),
        ({"vllm_lmcache_layout": "TP16"}, "lab01: vllm_lmcache_layout"),
    ],
)  # fmt: skip
def test_what_cannot_work_fails_naming_the_variable_and_host_and_writes_nothing(
    converged: dict[str, Any], values: dict[str, Any], says: str
) -> None:
    fleet = converged["fleet"]
    before = snapshot(fleet, "lab01")
    variables = {**converged["vars"], **values}
    run = play_role(fleet, converged["folder"], "vllm_lmcache", "lab01", variables, executable=True)
    assert run.code != 0
    assert says in run.output.replace("\n", " ") or any(
        says in msg for _, msg in events_of(run, "lab01", "failed")
    ), run.output
    assert events_of(run, "lab01", "changed") == []
    assert changes(before, snapshot(fleet, "lab01")) == []


@pytest.mark.lab
def test_a_later_install_that_changed_torch_fails_the_host(converged: dict[str, Any]) -> None:
    """The read-back after the installs, on the real venv: as if torch had been 2.12.0 before."""
    with converged["fleet"].connect("lab01") as conn:
        ctx = OpContext(conn, FactCache(conn))
        assert CODE.verify_venv(ctx, VENV, "2.13.0+cpu").status == Status.OK
        result = CODE.verify_venv(ctx, VENV, "2.12.0")
    assert result.failed
    assert f"torch in {VENV} changed from 2.12.0 to 2.13.0+cpu" in result.msg
    assert "replaced the torch vLLM brought" in result.msg


#: A stand-in for LMCache's source tree (ROCm's hipcc is not here): a package named lmcache
#: whose build records the environment it was built in.
SETUP = """\
import json, os
from setuptools import setup
with open("lmcache/built_with.json", "w") as f:
    json.dump({k: os.environ.get(k) for k in ("LMCACHE_TARGET_DEVICE", "CXX")}, f)
setup(name="lmcache", version="0.0.0", packages=["lmcache"],
      package_data={"lmcache": ["built_with.json"]})
"""
PYPROJECT = '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n'


@pytest.mark.lab
def test_lmcache_from_a_pinned_commit_is_built_for_hip_once(converged: dict[str, Any]) -> None:
    fleet, repo = converged["fleet"], "/srv/lmcache-src"
    with fleet.connect("lab01") as conn:
        sh(conn, f"mkdir -p {repo}/lmcache")
        conn.put(f"{repo}/setup.py", SETUP.encode())
        conn.put(f"{repo}/pyproject.toml", PYPROJECT.encode())
        conn.put(f"{repo}/lmcache/__init__.py", b"")
        git = f"git -C {repo} -c user.name=fxkit -c user.email=fxkit@localhost"
        commit = sh(conn, f"{git} init -q && {git} add -A && {git} commit -qm v1 && "
                          f"{git} rev-parse HEAD").strip()  # fmt: skip
        variables = {
            **converged["vars"],
            "vllm_lmcache_lmcache_git": repo,
            "vllm_lmcache_lmcache_git_version": commit,
        }
        built = play_role(fleet, converged["folder"], "vllm_lmcache", "lab01", variables)
        assert built.code == 0, built.output
        done = [op for op, _ in events_of(built, "lab01", "changed")]
        # Another LMCache: another venv beside the first (kept for its revision), linked.
        venv, first = venv_of(variables), venv_of(converged["vars"])
        assert venv != first and f"virtualenv {venv}" in done
        src = done.index("directory /opt/fxkit/src")
        assert done[src : src + 3] == [
            "directory /opt/fxkit/src",
            "git /opt/fxkit/src/lmcache-probe",
            f"build LMCache {commit[:12]} for HIP",
        ]
        assert f"link {VENV}" in done and done[-1].startswith("revision r-")
        said = sh(
            conn,
            f"{VENV}/bin/python -c 'import importlib.resources as r; "
            'print(r.files("lmcache").joinpath("built_with.json").read_text())\'',
        )
        assert json.loads(said) == {"LMCACHE_TARGET_DEVICE": "HIP", "CXX": "hipcc"}
        assert sh(conn, f"cat {venv}/.fxkit-lmcache-commit").strip() == commit
        assert sh(conn, f"test -x {first}/bin/fxkit && echo kept").strip() == "kept"
        again = play_role(fleet, converged["folder"], "vllm_lmcache", "lab01", variables)
        assert again.code == 0 and events_of(again, "lab01", "changed") == []
        # The fleet is shared with the rollout tests: a third venv would not fit its tmpfs.
        sh(conn, f"rm -rf {venv}")
