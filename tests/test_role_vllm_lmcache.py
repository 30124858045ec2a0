"""roles/vllm_lmcache: the instances from a layout (argv, environment, unit, health URLs), what
systemd makes of the unit and its environment files, and the variable checks.

systemd's rules, as systemd.service(5) ("Command lines") and systemd.exec(5)
(``EnvironmentFile=``) state them, for systemd 252 (Debian 12) to 257: in ExecStart the program
(the first word) "may not be a variable"; ``${VAR}`` is replaced by the variable's value as
exactly one argument, ``$VAR`` as a word of its own is split at white space into zero or more
arguments; an environment file holds ``NAME=value`` lines, ``#`` and ``;`` lines are comments, a
single-quoted value is read as POSIX shell single-quoted text (nothing escaped, nothing
expanded). :func:`systemd_argv` applies these rules to the files the role writes; where
``systemd-analyze`` is installed it verifies the unit too.
"""

from __future__ import annotations

import inspect
import os
import re
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from fxkit.connection.local import LocalConnection
from fxkit.engine.role import RoleLoader, roles_path
from fxkit.engine.variables import HostVars, Layer
from fxkit.errors import VarError
from fxkit.facts.base import FactCache
from fxkit.ops.base import OpContext, Status
from fxkit.rollout.revision import record_json, write_command

ROLE = RoleLoader(roles_path(None)).load("vllm_lmcache")
CODE = inspect.getmodule(ROLE.apply)
MODEL = "/mnt/models/Llama-3.1-8B-Instruct"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A file named as fxkit's wheel (validate checks it is there on the controller)."""
    path = tmp_path_factory.mktemp("wheels") / "fxkit-0.1.0-py3-none-any.whl"
    path.write_bytes(b"")
    return str(path)


def host_vars(wheel: str, **values: Any) -> Any:
    """The role's typed ``Vars`` of host gpu01 (a wrong type or value raises VarError)."""
    inventory = {"vllm_lmcache_model": MODEL, "vllm_lmcache_fxkit_wheel": wheel, **values}
    layers = [Layer("role defaults", ROLE.defaults), Layer("inventory", inventory)]
    return ROLE.typed(HostVars("gpu01", layers))


# -- systemd's reading of the files -----------------------------------------------------------


def read_env_file(text: str) -> dict[str, str]:
    """An EnvironmentFile as systemd reads one (the subset the role writes: single quotes)."""
    env = {}
    for line in text.splitlines():
        if not line.strip() or line.lstrip()[0] in "#;":
            continue
        name, sep, value = line.partition("=")
        assert sep and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name), line
        match = re.fullmatch(r"'([^']*)'", value)
        assert match, f"not single-quoted as the role writes values: {line!r}"
        env[name] = match[1]
    return env


def systemd_argv(exec_start: str, env: dict[str, str]) -> list[str]:
    """ExecStart's words with ``${VAR}`` (one argument) and ``$VAR`` (split) replaced; the
    program, the first word, "may not be a variable"."""
    program, *words = exec_start.split()
    assert program.startswith("/") and "$" not in program and "%" not in program, program
    argv = [program]
    for word in words:
        if re.fullmatch(r"\$\{\w+\}", word):
            argv.append(env.get(word[2:-1], ""))
        elif re.fullmatch(r"\$\w+", word):
            argv += env.get(word[1:], "").split()
        else:
            assert "$" not in word and "%" not in word, word
            argv.append(word)
    return argv


def unit_setting(unit: str, key: str) -> str:
    (line,) = [line for line in unit.splitlines() if line.startswith(f"{key}=")]
    return line.partition("=")[2]


# -- instances --------------------------------------------------------------------------------


def test_tp4x2_makes_two_instances_of_four_gpus_on_consecutive_ports(wheel: str) -> None:
    v = host_vars(wheel, vllm_lmcache_layout="TP4x2", vllm_lmcache_deployment="llama")
    first, second = CODE.instance_specs(v)
    assert (first.name, first.gpus, first.port) == ("tp4-0", (0, 1, 2, 3), 8000)
    assert (second.name, second.gpus, second.port) == ("tp4-1", (4, 5, 6, 7), 8001)
    assert first.unit == "vllm@tp4-0.service"
    assert first.env_file == "/etc/fxkit/vllm/llama/tp4-0.env"
    assert first.served_name == "Llama-3.1-8B-Instruct" and first.model == MODEL
    venv = CODE.venv(v)
    assert re.fullmatch(r"/opt/fxkit/venvs/llama\.venvs/v-[0-9a-f]{12}", venv)
    assert first.argv == [
        f"{venv}/bin/vllm", "serve", MODEL,
        "--served-model-name", "Llama-3.1-8B-Instruct", "--host", "0.0.0.0", "--port", "8000",
        "--tensor-parallel-size", "4", "--load-format", "fxkit",
        "--kv-transfer-config", '{"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}',
    ]  # fmt: skip
    assert first.env["HIP_VISIBLE_DEVICES"] == "0,1,2,3"
    assert second.env["HIP_VISIBLE_DEVICES"] == "4,5,6,7"
    assert first.env["LMCACHE_CONFIG_FILE"] == "/etc/fxkit/vllm/llama/lmcache.yaml"
    assert first.ready_url == "http://127.0.0.1:8000/v1/models"
    assert second.health_url == "http://127.0.0.1:8001/health"


def test_explicit_gpu_sets_a_bind_address_and_a_selection(wheel: str) -> None:
    v = host_vars(
        wheel,
        vllm_lmcache_layout=[[6, 7], [0, 1, 2, 3]],
        vllm_lmcache_bind_host="10.1.2.3",
        vllm_lmcache_base_port=9100,
        vllm_lmcache_rollout_instances=["tp4-1", "other-node/tp2-0"],
    )
    specs = CODE.instance_specs(v)
    assert [s.name for s in specs] == ["tp2-0", "tp4-1"]  # all of them, for fxkit rollout
    [spec] = CODE.chosen(v, specs)  # the other node's tp2-0 is not this one's
    assert (spec.name, spec.gpus, spec.port) == ("tp4-1", (0, 1, 2, 3), 9101)
    assert spec.ready_url == "http://10.1.2.3:9101/v1/models"
    mine = host_vars(
        wheel, vllm_lmcache_layout="TP4x2", vllm_lmcache_rollout_instances=["gpu01/tp4-1"]
    )
    assert [s.name for s in CODE.chosen(mine, CODE.instance_specs(mine))] == ["tp4-1"]


def test_the_probe_takes_only_the_flags_it_has_and_vllm_s_spellings(wheel: str) -> None:
    v = host_vars(
        wheel,
        vllm_lmcache_server="serve-probe",
        vllm_lmcache_vllm_version=None,
        vllm_lmcache_torch_version="2.13.0+cpu",
        vllm_lmcache_layout="TP1x2",
        vllm_lmcache_extra_args=["--threads=8"],
    )
    first, _ = CODE.instance_specs(v)
    assert first.argv == [
        f"{CODE.venv(v)}/bin/fxkit", "serve-probe", MODEL,
        "--served-model-name", "Llama-3.1-8B-Instruct", "--host", "0.0.0.0", "--port", "8000",
        "--load-format", "fxkit", "--threads=8",
    ]  # fmt: skip
    assert first.env["HIP_VISIBLE_DEVICES"] == "0"


@pytest.mark.parametrize(
    "values",
    [
        {"vllm_lmcache_layout": "TP4x2"},
        {"vllm_lmcache_layout": "TP2x4", "vllm_lmcache_extra_args": ["--max-model-len=8192"],
         "vllm_lmcache_env": {"VLLM_RPC_TIMEOUT": "100000"}},
        {"vllm_lmcache_model": "/mnt/models/Llama-3(8B)$x", "vllm_lmcache_served_name": "a$b",
         "vllm_lmcache_extra_args": ['--override-generation-config={"temperature":0.5}']},
        {"vllm_lmcache_server": "serve-probe", "vllm_lmcache_command": ["/usr/bin/env", "fxkit",
                                                                         "serve-probe"]},
    ],
)  # fmt: skip
def test_systemd_runs_exactly_the_argv_and_env_of_each_instance(
    wheel: str, values: dict[str, Any]
) -> None:
    v = host_vars(wheel, **values)
    CODE.validate(v)
    unit = CODE.unit_text(v)
    assert unit_setting(unit, "EnvironmentFile") == "/etc/fxkit/vllm/default/%i.env"
    for spec in CODE.instance_specs(v):
        env = read_env_file(CODE.env_file_text(spec))
        assert env == spec.env
        assert systemd_argv(unit_setting(unit, "ExecStart"), env) == spec.argv
        assert spec.unit.removeprefix("vllm@").removesuffix(".service") == spec.name  # %i


def test_systemd_analyze_accepts_the_unit(wheel: str, tmp_path: Path) -> None:
    if not shutil.which("systemd-analyze"):
        pytest.skip("systemd-analyze is not installed")
    v = host_vars(wheel, vllm_lmcache_layout="TP4x2", vllm_lmcache_local_disk="/mnt/fx/lmcache",
                  vllm_lmcache_max_local_disk_size=50)  # fmt: skip
    (tmp_path / "vllm@.service").write_text(CODE.unit_text(v))
    (tmp_path / "vllm@tp4-0.service").symlink_to(tmp_path / "vllm@.service")
    done = subprocess.run(
        ["systemd-analyze", "verify", str(tmp_path / "vllm@tp4-0.service")],
        capture_output=True,
        text=True,
    )
    program = f"{CODE.venv(v)}/bin/vllm"  # not installed on this machine
    complaints = [
        line for line in done.stderr.splitlines()
        if line != f"vllm@tp4-0.service: Command {program} is not executable: No such file or "
        "directory"
    ]  # fmt: skip
    assert complaints == [], done.stderr


# -- the variable checks ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "where", "says"),
    [
        ({"vllm_lmcache_layout": "TP3x3"}, "vllm_lmcache_layout", "wants GPU 8, the host has 8"),
        ({"vllm_lmcache_layout": "4xTP2"}, "vllm_lmcache_layout", "unknown layout"),
        ({"vllm_lmcache_layout": [[0, 1, 2, 3], [3, 4]]}, "vllm_lmcache_layout",
         "GPU 3 is in instance 0 and instance 1: GPU sets must not overlap"),
        ({"vllm_lmcache_layout": [[0, -1]]}, "vllm_lmcache_layout",
         "layout[0][1] is -1: Input should be greater than or equal to 0"),
        ({"vllm_lmcache_layout": [[0, True]]}, "vllm_lmcache_layout", "a boolean is not a number"),
        ({"vllm_lmcache_layout": [[]]}, "vllm_lmcache_layout", "at least 1 item"),
        ({"vllm_lmcache_layout": 8}, "vllm_lmcache_layout", "Input should be a valid list"),
        ({"vllm_lmcache_layout": [[2, 2]]}, "vllm_lmcache_layout", "GPU 2 is listed twice"),
        ({"vllm_lmcache_layout": "TP4x2", "vllm_lmcache_gpus": 4}, "vllm_lmcache_layout",
         "instance 1 wants GPU 4, the host has 4"),
        ({"vllm_lmcache_extra_args": ["--max-model-len 8192"]}, "vllm_lmcache_extra_args",
         "not a word (no white space"),
        ({"vllm_lmcache_extra_args": "--max-model-len=8192"}, "vllm_lmcache_extra_args",
         "Input should be a valid list"),
        ({"vllm_lmcache_env": {"FXKIT_MODEL": "x"}}, "vllm_lmcache_env", "not FXKIT_"),
        ({"vllm_lmcache_env": {"A": "line\nbreak"}}, "vllm_lmcache_env",
         "env.A is 'line\\nbreak': not a value without ', newline or control characters"),
        ({"vllm_lmcache_env": {"A": "it's"}}, "vllm_lmcache_env", "not a value without '"),
        ({"vllm_lmcache_env": ["A=1"]}, "vllm_lmcache_env", "Input should be a valid dict"),
        ({"vllm_lmcache_model": "/mnt/models/it's"}, "vllm_lmcache_model", "not a path"),
        ({"vllm_lmcache_rollout_instances": ["tp8-1"]}, "vllm_lmcache_rollout_instances",
         "names instances the layout lacks"),
        ({"vllm_lmcache_local_disk": "lmcache"}, "vllm_lmcache_local_disk", "not an absolute"),
        ({"vllm_lmcache_local_disk": "/mnt/fx/lmcache"}, "vllm_lmcache_max_local_disk_size",
         "LMCache makes no disk backend without a budget"),
        ({"vllm_lmcache_vllm_version": None}, "vllm_lmcache_torch_version",
         "fxkit's loader needs torch"),
        ({"vllm_lmcache_vllm_version": False, "vllm_lmcache_torch_version": "2.13.0+cpu"},
         "vllm_lmcache_command", "vLLM is not installed"),
        ({"vllm_lmcache_lmcache_git": "https://github.com/LMCache/LMCache"},
         "vllm_lmcache_lmcache_git_version", "needs a pinned commit"),
        ({"vllm_lmcache_lmcache_git": "https://github.com/LMCache/LMCache",
          "vllm_lmcache_lmcache_git_version": "v0.5.6"}, "vllm_lmcache_lmcache_git_version",
         "not a full commit hash"),
        ({"vllm_lmcache_model": ""}, "vllm_lmcache_model", "not a path"),
        ({"vllm_lmcache_base_port": 65535, "vllm_lmcache_layout": "TP1x2"},
         "vllm_lmcache_base_port", "pass 65535"),
        ({"vllm_lmcache_bind_host": "gpu01"}, "vllm_lmcache_bind_host", "not an IP address"),
        ({"vllm_lmcache_kv_role": "both"}, "vllm_lmcache_kv_role",
         "Input should be 'kv_both', 'kv_producer' or 'kv_consumer'"),
        ({"vllm_lmcache_fxkit_wheel": ""}, "vllm_lmcache_fxkit_wheel", "not given"),
        ({"vllm_lmcache_wheelhouse": "/no/such/wheels"}, "vllm_lmcache_wheelhouse",
         "not a folder on the controller"),
        ({"vllm_lmcache_vllm_source": "wheels/"}, "vllm_lmcache_vllm_source", "not a path"),
        ({"vllm_lmcache_command": ["vllm", "serve"]}, "vllm_lmcache_command",
         "not an absolute path"),
        ({"vllm_lmcache_command": ["/bin/fxkit", "serve probe"]}, "vllm_lmcache_command",
         "command[1] is 'serve probe': not a word"),
        # One case per type of the declaration beside those above.
        ({"vllm_lmcache_deployment": "my deployment"}, "vllm_lmcache_deployment", "not a name"),
        ({"vllm_lmcache_venv_prefix": "opt/venvs"}, "vllm_lmcache_venv_prefix",
         "not an absolute path without white space"),
        ({"vllm_lmcache_wheel_dir": "/opt/my wheels"}, "vllm_lmcache_wheel_dir",
         "not an absolute path without white space"),
        ({"vllm_lmcache_python": ""}, "vllm_lmcache_python", "at least 1 character"),
        ({"vllm_lmcache_vllm_version": "latest"}, "vllm_lmcache_vllm_version", "not a version"),
        ({"vllm_lmcache_lmcache_version": 0.6}, "vllm_lmcache_lmcache_version",
         "Input should be a valid string"),
        ({"vllm_lmcache_packages": ["numpy>=2"]}, "vllm_lmcache_packages", "not a pin"),
        ({"vllm_lmcache_chunk_size": 0}, "vllm_lmcache_chunk_size", "greater than or equal to 1"),
        ({"vllm_lmcache_chunk_size": True}, "vllm_lmcache_chunk_size", "a boolean is not a number"),
        ({"vllm_lmcache_local_cpu": "maybe"}, "vllm_lmcache_local_cpu", "valid boolean"),
        ({"vllm_lmcache_max_local_cpu_size": -1}, "vllm_lmcache_max_local_cpu_size",
         "greater than or equal to 0"),
        ({"vllm_lmcache_max_local_disk_size": "lots"}, "vllm_lmcache_max_local_disk_size",
         "valid number"),
        ({"vllm_lmcache_extra_config": ["use_odirect"]}, "vllm_lmcache_extra_config",
         "Input should be a valid dict"),
        ({"vllm_lmcache_extra_config": {"disk_io_threads": 8}}, "vllm_lmcache_extra_config",
         "sets disk_io_threads, which vllm_lmcache_disk_io_threads sets"),
        ({"vllm_lmcache_local_disk": ["/mnt/a/kv", "file:///mnt/a/kv/"]},
         "vllm_lmcache_local_disk", "/mnt/a/kv/ is listed twice"),
        ({"vllm_lmcache_local_disk": ["/mnt/a/kv", "/mnt/b,c"]}, "vllm_lmcache_local_disk",
         "not an absolute path or file:// URL"),
        ({"vllm_lmcache_disk_io_threads": 0}, "vllm_lmcache_disk_io_threads",
         "greater than or equal to 1"),
        ({"vllm_lmcache_use_odirect": "maybe"}, "vllm_lmcache_use_odirect", "valid boolean"),
        ({"vllm_lmcache_local_disk_path_sharding": "round_robin"},
         "vllm_lmcache_local_disk_path_sharding", "Input should be 'by_gpu'"),
        ({"vllm_lmcache_server": "sglang"}, "vllm_lmcache_server",
         "Input should be 'vllm' or 'serve-probe'"),
        ({"vllm_lmcache_served_name": "my model"}, "vllm_lmcache_served_name", "not a name"),
        ({"vllm_lmcache_base_port": 0}, "vllm_lmcache_base_port", "greater than or equal to 1"),
        ({"vllm_lmcache_gpus": 0}, "vllm_lmcache_gpus", "greater than or equal to 1"),
        ({"vllm_lmcache_load_format": ""}, "vllm_lmcache_load_format", "not a name"),
        ({"vllm_lmcache_kv_connector": "LMCache Connector"}, "vllm_lmcache_kv_connector",
         "not a name"),
        ({"vllm_lmcache_unit": "vllm.service"}, "vllm_lmcache_unit", "not a template unit name"),
        ({"vllm_lmcache_ready_timeout": 0}, "vllm_lmcache_ready_timeout", "greater than 0"),
        ({"vllm_lmcache_rollout_instances": "tp8-0"}, "vllm_lmcache_rollout_instances",
         "Input should be a valid list"),
    ],
)  # fmt: skip
def test_wrong_variables_name_the_host_and_the_variable(
    wheel: str, values: dict[str, Any], where: str, says: str
) -> None:
    with pytest.raises(VarError) as caught:
        CODE.validate(host_vars(wheel, **values))
    # Every problem also says where the value was set: "gpu01: vllm_lmcache_layout (inventory)"
    assert caught.value.where.startswith(f"gpu01: {where}")  # or a path into it
    assert caught.value.where.endswith((" (inventory)", " (role defaults)"))
    assert says in caught.value.message


def test_the_model_must_be_given(wheel: str) -> None:
    layers = [Layer("role defaults", ROLE.defaults), Layer("inventory", {})]
    with pytest.raises(VarError, match="vllm_lmcache_model is not set") as caught:
        ROLE.typed(HostVars("gpu01", layers))
    assert caught.value.where == "gpu01: vllm_lmcache_model"
    assert caught.value.hint == "e.g. /mnt/models/Llama-3.1-8B"


def test_values_are_converted_as_an_inventory_gives_them(wheel: str) -> None:
    """Digits from an INI inventory or -e make numbers; "false" or "" turn an install off; an
    environment value that YAML read as a number is the text written."""
    v = host_vars(
        wheel,
        vllm_lmcache_base_port="9000",
        vllm_lmcache_local_cpu="no",
        vllm_lmcache_lmcache_version="",
        vllm_lmcache_layout="tp2x2",
        vllm_lmcache_env={"VLLM_RPC_TIMEOUT": 100000, "FLAG": True},
    )
    assert (v.vllm_lmcache_base_port, v.vllm_lmcache_local_cpu) == (9000, False)
    assert v.vllm_lmcache_lmcache_version is None
    assert v.vllm_lmcache_layout == [(0, 1), (2, 3)]
    assert CODE.instance_specs(v)[0].env["VLLM_RPC_TIMEOUT"] == "100000"
    assert CODE.instance_specs(v)[0].env["FLAG"] == "True"


def test_the_defaults_with_a_model_and_a_wheel_pass(wheel: str) -> None:
    CODE.validate(host_vars(wheel))
    assert [s.name for s in CODE.instance_specs(host_vars(wheel))] == ["tp8-0"]


def test_pip_takes_each_source_as_pip_means_it(wheel: str, tmp_path: Path) -> None:
    args = CODE.pip_source_args
    v = host_vars(wheel, vllm_lmcache_vllm_source="/srv/wheels/vllm-0.20.1+rocm721-cp312.whl")
    assert args(v, v.vllm_lmcache_vllm_source) == ["--find-links", "/srv/wheels"]
    v = host_vars(wheel, vllm_lmcache_vllm_source="http://mirror/simple")
    assert args(v, v.vllm_lmcache_vllm_source) == ["--index-url", "http://mirror/simple"]
    v = host_vars(wheel, vllm_lmcache_wheelhouse=str(tmp_path))
    assert args(v, v.vllm_lmcache_vllm_source) == [
        "--no-index", "--find-links", "/opt/fxkit/wheels/default",
    ]  # fmt: skip
    with pytest.raises(VarError, match="beside vllm_lmcache_wheelhouse"):
        CODE.validate(
            host_vars(
                wheel,
                vllm_lmcache_wheelhouse=str(tmp_path),
                vllm_lmcache_lmcache_source="https://pypi.org/simple",
            )
        )


def test_the_local_disk_lies_on_the_longest_mount_point_above_it() -> None:
    from fxkit.facts.system import Mount

    mounts = [
        Mount("/dev/vda1", "/", "ext4", ("rw",)),
        Mount("/dev/nvme1n1", "/mnt/fx", "xfs", ("rw",)),
        Mount("tmpfs", "/mnt/fxtmp", "tmpfs", ("rw",)),
    ]
    assert CODE._mount_of("/mnt/fx/lmcache", mounts).path == "/mnt/fx"
    assert CODE._mount_of("/mnt/fxtmp/a", mounts).path == "/mnt/fxtmp"
    assert CODE._mount_of("/mnt/fxother", mounts).path == "/"  # a prefix, not a parent
    assert CODE._mount_of("/mnt/fx", mounts).path == "/mnt/fx"


def test_several_disk_folders_each_take_the_workers_by_gpu_gives_them(wheel: str) -> None:
    """LMCache's by_gpu: the worker on device d (within its instance) uses folder d mod n
    (lmcache/v1/storage_backend/path_sharder.py); the file names them comma-joined and the unit
    waits for each mount."""
    disks = ["/mnt/nvme0/kv", "file:///mnt/nvme1/kv/", "/mnt/nvme2/kv"]
    v = host_vars(wheel, vllm_lmcache_layout="TP4x2", vllm_lmcache_local_disk=disks,
                  vllm_lmcache_max_local_disk_size=10, vllm_lmcache_disk_io_threads=16,
                  vllm_lmcache_use_odirect=True)  # fmt: skip
    CODE.validate(v)
    assert CODE.workers_per_path(v) == [4, 2, 2]  # devices 0,3 | 1 | 2 of each instance
    config = CODE.lmcache_config(v)
    assert (
        config["local_disk"] == "file:///mnt/nvme0/kv/,file:///mnt/nvme1/kv/,file:///mnt/nvme2/kv/"
    )
    assert config["local_disk_path_sharding"] == "by_gpu"
    assert config["extra_config"] == {"disk_io_threads": 16, "use_odirect": True}
    mounts = unit_setting(CODE.unit_text(v), "RequiresMountsFor").split()
    assert mounts == [MODEL, "/mnt/nvme0/kv/", "/mnt/nvme1/kv/", "/mnt/nvme2/kv/"]
    # One path, as a string, is a list of one; without a disk tier nothing of it is written.
    one = host_vars(wheel, vllm_lmcache_local_disk="/mnt/fx/kv", vllm_lmcache_max_local_disk_size=1)
    assert one.vllm_lmcache_local_disk == ["/mnt/fx/kv"]
    assert CODE.workers_per_path(one) == [8]
    assert "extra_config" not in CODE.lmcache_config(host_vars(wheel))
    assert CODE.workers_per_path(host_vars(wheel)) == []  # no disk tier (the default)


class Fleet:
    """Other roles' typed values, as the runner hands them to validate_all."""

    def __init__(self, initiators: dict[str, Any]) -> None:
        self.initiators = initiators

    def of(self, role: str) -> dict[str, Any]:
        return self.initiators if role == "nvmeof_initiator" else {}


def initiator(host: str, *filesystems: dict[str, Any]) -> Any:
    """roles/nvmeof_initiator's typed values of ``host`` (its real Vars)."""
    role = RoleLoader(roles_path(None)).load("nvmeof_initiator")
    values = {"nvmeof_initiator_filesystems": list(filesystems)}
    layers = [Layer("role defaults", role.defaults), Layer("inventory", values)]
    return role.typed(HostVars(host, layers))


MODELS = "nqn.2026-01.io.fxkit:models"


def test_a_disk_folder_on_the_shared_model_namespace_is_refused(wheel: str) -> None:
    """docs/storage.md's layout: the model namespace shared (gpu01 owns it, read-write there),
    each node's own namespace at /mnt/local. The disk tier belongs on the latter."""
    shared = {"nqn": MODELS, "nsid": 1, "path": "/mnt/models", "owner": "gpu01"}
    fleet = Fleet({
        host: initiator(host, shared, {"nqn": f"nqn.2026-01.io.fxkit:node-{host}", "nsid": 1,
                                       "path": "/mnt/local"})
        for host in ("gpu01", "gpu02")
    })  # fmt: skip
    own = host_vars(wheel, vllm_lmcache_local_disk=["/mnt/local/kv0", "/mnt/local/kv1"],
                    vllm_lmcache_max_local_disk_size=1)  # fmt: skip
    CODE.validate_all({"gpu01": own}, fleet)
    wrong = host_vars(wheel, vllm_lmcache_local_disk=["/mnt/local/kv", "/mnt/models/kv"],
                      vllm_lmcache_max_local_disk_size=1)  # fmt: skip
    with pytest.raises(VarError) as caught:
        CODE.validate_all({"gpu01": wrong}, fleet)
    assert caught.value.where.startswith("gpu01: vllm_lmcache_local_disk[1] (inventory)")
    assert (
        f"/mnt/models/kv is on /mnt/models, nsid 1 of {MODELS}, which gpu01, gpu02 mount "
        "(owner gpu01): a shared namespace is no place for LMCache's disk tier"
    ) in caught.value.message
    assert caught.value.hint is not None and "/mnt/local/lmcache" in caught.value.hint
    # A namespace only this host mounts, but another host owns (a reader's view), too.
    alone = Fleet({"gpu01": initiator("gpu01", shared)})
    with pytest.raises(VarError, match="owner gpu01"):
        CODE.validate_all({"gpu02": wrong}, Fleet({"gpu02": initiator("gpu02", shared)}))
    CODE.validate_all({"gpu01": own}, alone)  # /mnt/local is no fabric mount there: not checked


# -- a venv per set of pins -------------------------------------------------------------------


def test_each_set_of_pins_has_its_venv_and_flags_share_one(wheel: str) -> None:
    base = host_vars(wheel)
    assert re.fullmatch(r"/opt/fxkit/venvs/default\.venvs/v-[0-9a-f]{12}", CODE.venv(base))
    assert CODE.current_venv(base) == "/opt/fxkit/venvs/default"
    same = host_vars(wheel, vllm_lmcache_extra_args=["--max-num-seqs=8"])
    assert CODE.venv(same) == CODE.venv(base)  # another revision, the same venv
    assert CODE.revision_plan(same).inputs != CODE.revision_plan(base).inputs
    for other in (
        {"vllm_lmcache_vllm_version": "0.20.2+rocm721"},
        {"vllm_lmcache_packages": ["numpy"]},
        {"vllm_lmcache_python": "/usr/bin/python3.12"},
    ):
        assert CODE.venv(host_vars(wheel, **other)) != CODE.venv(base), other


def test_pruning_removes_the_venvs_no_kept_revision_names(wheel: str, tmp_path: Path) -> None:
    """The role's prune op through a LocalConnection: three revisions on two venvs, keep 1."""
    folder, venvs, env_dir = tmp_path / "revisions", tmp_path / "d.venvs", tmp_path / "env"
    env_dir.mkdir()
    plans = [
        CODE.revision_plan(host_vars(wheel, **more))
        for more in ({"vllm_lmcache_packages": ["numpy"]}, {}, {"vllm_lmcache_extra_args": ["-x"]})
    ]
    ids = [f"r-00000000000{i}" for i in range(3)]
    made = [CODE.venv_path(str(venvs), dict(plan.inputs["venv"])) for plan in plans]
    conn = LocalConnection("localhost")
    for i, (rev, plan) in enumerate(zip(ids, plans, strict=True)):
        record = record_json(rev, plan.inputs, "").encode()
        assert conn.run(write_command(str(folder), rev), stdin=record).ok
        os.utime(folder / f"{rev}.json", (1_700_000_000 + i, 1_700_000_000 + i))
        Path(made[i]).mkdir(parents=True, exist_ok=True)
    assert made[1] == made[2] != made[0]
    (venvs / "notes").mkdir()  # not a venv's name: never removed
    (env_dir / "tp4-0.env").write_text(f"FXKIT_REVISION='{ids[1]}'\n")  # r1 in use
    rev = replace(plans[2], folder=str(folder), keep=1, env_dirs=(str(env_dir),))
    ctx = OpContext(conn, FactCache(conn))
    done = CODE.prune(ctx, rev, str(venvs))
    assert done.status is Status.CHANGED, done
    assert done.data == {"removed": [ids[0]], "venvs": [made[0]]}
    assert sorted(p.name for p in venvs.iterdir()) == sorted(["notes", Path(made[1]).name])
    assert CODE.prune(ctx, rev, str(venvs)).status is Status.OK
