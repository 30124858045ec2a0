"""vllm_lmcache: vLLM with LMCache, a virtualenv per set of pins, one systemd instance per GPU set.

1. the virtualenv ``<prefix>/<deployment>.venvs/v-<digest of the pins>``, linked from
   ``<prefix>/<deployment>``: vLLM (pinned, from a wheel, a folder or an index),
   LMCache (a pinned wheel, or built from a pinned git commit for HIP), fxkit (its loader and vLLM
   plugin) from a wheel built on the controller; every install after vLLM's is constrained to the
   torch vLLM brought, and torch's version is read back: a change fails the host;
2. LMCache's configuration file, rendered from variables (``local_disk`` must lie on a mounted
   filesystem other than / with room for the budget of every GPU worker);
3. the template unit ``vllm@.service``, and per instance an environment file and its own unit
   file with the template's text (the layout ``TP4x2`` or explicit GPU sets, ports from a base
   port; a rollback pins an instance to its revision's unit through its own file);
4. :func:`start_instances` (the rollout's part).

A serving role (:class:`fxkit.engine.serving.ServingRole`): :func:`instance_specs` is pure, the
rollout reads each instance's argv, environment, unit and health URLs from it without touching
a host, and names the instances of a batch in :data:`SELECT`.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import posixpath
import re
from dataclasses import dataclass, replace
from pathlib import Path
from shlex import quote
from typing import Annotated, Any, Literal, cast, get_args

import yaml
from pydantic import AfterValidator, BeforeValidator, Field

from fxkit import nvme_fabric
from fxkit.engine.role import Host
from fxkit.engine.rolevars import (
    FleetVars,
    IpAddress,
    Number,
    RoleVars,
    Rule,
    Text,
    Whole,
    pattern,
)
from fxkit.facts.commands import CommandOutput
from fxkit.facts.files import FileStat
from fxkit.facts.python import VenvPackages
from fxkit.facts.system import Mount, Mounts
from fxkit.ops.base import OpContext, Result, changed, combine, failed, ok, skipped
from fxkit.ops.files import file as write_file
from fxkit.ops.files import link as make_link
from fxkit.ops.instances import STATE_DIR, instance, instance_ready
from fxkit.ops.systemd import UNIT_DIR, systemd_missing
from fxkit.ops.transfer import copy
from fxkit.rollout.revision import (
    ENV_VAR,
    ID_LENGTH,
    REVISIONS_DIR,
    RevisionPlan,
    list_command,
    model_digest,
    parse_list,
    prune_command,
    record_json,
    revision_id,
    write_command,
)
from fxkit.rollout.rollback import env_assignment

#: Filesystems that hold no files of their own: never a place for LMCache's disk tier.
PSEUDO_FS = frozenset(
    {
        "proc", "sysfs", "devtmpfs", "devpts", "cgroup", "cgroup2", "debugfs", "tracefs",
        "securityfs", "configfs", "bpf", "mqueue", "hugetlbfs", "pstore", "efivarfs", "autofs",
        "fusectl", "binfmt_misc", "rpc_pipefs", "nsfs",
    }
)  # fmt: skip
_LAYOUT = re.compile(r"\s*TP([1-9][0-9]*)(?:x([1-9][0-9]*))?\s*", re.IGNORECASE)
_WHEEL = re.compile(r"([A-Za-z0-9_.]+)-([0-9][^-]*)-.+\.whl")
_URL = re.compile(r"(https?|file)://\S+")
#: A venv's folder name (:func:`venv_path`).
_VENV = re.compile(rf"v-[0-9a-f]{{{ID_LENGTH}}}")
#: What systemd's ExecStart takes as the program itself, written as it is (no shell).
_PROGRAM = re.compile(r"/[^\s%\\\"'$;]*")
#: The variable the rollout sets to the instances a batch acts on (``HOST/NAME`` each).
SELECT = "vllm_lmcache_rollout_instances"
#: The variable that makes a run prepare the selected instances' revision without starting or
#: stopping any (``fxkit rollout``, before it drains a batch; :func:`switch_instance` then).
PREPARE = "vllm_lmcache_rollout_prepare"


# -- the types of the variables ---------------------------------------------------------------


def _off(value: object) -> object:
    """``false`` and ``""`` mean "not installed", as null does."""
    return None if value is False or value == "" else value


def _tp_layout(value: object) -> object:
    """``TP<n>x<m>``: m instances of n GPUs, in order, as GPU sets (a list of them is as given)."""
    if not isinstance(value, str):
        return value
    match = _LAYOUT.fullmatch(value)
    if not match:
        raise ValueError(f"unknown layout {value!r}")
    size, instances = int(match[1]), int(match[2] or 1)
    return [list(range(i * size, (i + 1) * size)) for i in range(instances)]


def _overlap(sets: list[tuple[int, ...]]) -> str:
    seen: dict[int, int] = {}
    for i, gpus in enumerate(sets):
        for gpu in gpus:
            if gpu in seen:
                if seen[gpu] == i:
                    return f"GPU {gpu} is listed twice in instance {i}"
                return (
                    f"GPU {gpu} is in instance {seen[gpu]} and instance {i}: GPU sets must "
                    "not overlap"
                )
            seen[gpu] = i
    return ""


def _program(words: list[str]) -> str:
    if words and not _PROGRAM.fullmatch(words[0]):
        return (
            f"{words[0]!r} is not an absolute path (without white space, %, \\, quotes, $ or ;): "
            "systemd runs it without a shell, written as it is in ExecStart"
        )
    return ""


#: A name: the deployment's, a load format's, a KV connector's.
Name = Annotated[
    str, pattern(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", "a name (letters, digits, _ . -)")
]
#: A folder on the node, one word in pip's and systemd's command lines.
Folder = Annotated[str, pattern(r"/\S*", "an absolute path without white space")]
#: A pinned version; null, ``false`` or ``""``: not installed.
Pin = Annotated[
    Annotated[str, pattern(r"[0-9][A-Za-z0-9.+!_-]*", "a version")] | None,
    BeforeValidator(_off),
]
#: Where pip finds a package: a wheel file or a folder on the node, or an index URL.
Source = Annotated[
    str, pattern(r"(/\S*|(https?|file)://\S+)?", "a path on the node or an index URL")
]
#: One word of a command line that systemd splits at white space, from a single-quoted value.
Word = Annotated[str, pattern(r"[^\s'\x00-\x1f\x7f]+", "a word (no white space, ' or control)")]


def _paths(value: object) -> object:
    """One path as a list of one; ``""``, ``false`` and null: none."""
    value = _off(value)
    if value is None:
        return []
    return [value] if isinstance(value, str) else value


def _folder(path: str) -> str:
    """A ``local_disk`` entry as LMCache's folder: without ``file://``, one trailing slash."""
    return posixpath.normpath(path.removeprefix("file://")) + "/"


def _distinct(paths: list[str]) -> str:
    folders = [_folder(p) for p in paths]
    twice = sorted({f for f in folders if folders.count(f) > 1})
    return f"{twice[0]} is listed twice" if twice else ""


#: One folder of LMCache's disk tier (LMCache splits ``local_disk`` at commas).
DiskPath = Annotated[
    str,
    pattern(
        r"(file://)?/[^\s,%\\']*",
        "an absolute path or file:// URL (no white space, ',', %, \\ or ')",
    ),
]
#: The folders of the disk tier: one, or a list (one per namespace or mount).
DiskPaths = Annotated[
    list[DiskPath],
    BeforeValidator(_paths),
    AfterValidator(Rule("a folder, or a list of distinct folders", _distinct)),
]

#: GPU sets, one per instance: ``TP<n>x<m>`` or the sets themselves, no GPU in two.
Layout = Annotated[
    list[Annotated[tuple[Annotated[Whole, Field(ge=0)], ...], Field(min_length=1)]],
    BeforeValidator(_tp_layout),
    AfterValidator(Rule("`TP<n>x<instances>` or a list of GPU sets", _overlap)),
]
KvRole = Literal["kv_both", "kv_producer", "kv_consumer"]  # vLLM's KVTransferConfig.kv_role
KV_ROLES = get_args(KvRole)
EnvName = Annotated[
    str, pattern(r"(?!FXKIT_)[A-Za-z_][A-Za-z0-9_]*", "a variable name (not FXKIT_*)")
]
#: A value an EnvironmentFile holds single-quoted (systemd.exec(5)): no ', newline or control.
EnvValue = Annotated[
    Text,
    pattern(r"[^'\x00-\x08\x0a-\x1f\x7f]*", "a value without ', newline or control characters"),
]


class Vars(RoleVars):
    vllm_lmcache_deployment: Name = Field(
        "default", description="the deployment's name: its venv and config folder"
    )
    vllm_lmcache_venv_prefix: Folder = Field(
        "/opt/fxkit/venvs",
        description="where the virtualenvs are made (`<deployment>.venvs/`, and a link "
        "`<deployment>` to the one in use)",
    )
    vllm_lmcache_config_dir: Folder = Field(
        "/etc/fxkit/vllm",
        description="`<this>/<deployment>/`: lmcache.yaml and the environment files",
    )
    vllm_lmcache_python: str = Field(
        "python3", min_length=1, description="the Python that makes the venv"
    )
    vllm_lmcache_vllm_version: Pin = Field(
        "0.20.1+rocm721",
        description="vLLM's pin; `false`: no vLLM (then give vllm_lmcache_torch_version, and "
        "serve-probe or a command)",
        examples=["0.20.1+rocm721", False],
    )
    vllm_lmcache_vllm_source: Source = Field(
        "",
        description='a wheel file or folder on the node, or an index URL (`""`: pip\'s config)',
        examples=["/srv/wheels/vllm-0.20.1+rocm721-cp312-cp312-linux_x86_64.whl"],
    )
    vllm_lmcache_torch_version: Pin = Field(
        None,
        description="torch installed where vLLM is not (the lab: `2.13.0+cpu`); vLLM's torch is "
        "never replaced",
        examples=["2.13.0+cpu"],
    )
    vllm_lmcache_lmcache_version: Pin = Field(
        "0.5.6", description="LMCache's wheel pin; `false`: none", examples=["0.5.6", False]
    )
    vllm_lmcache_lmcache_source: Source = Field(
        "", description="where that wheel comes from, as for vLLM"
    )
    vllm_lmcache_lmcache_git: str = Field(
        "",
        description="build LMCache from this repository instead (HIP)",
        examples=["https://github.com/LMCache/LMCache"],
    )
    vllm_lmcache_lmcache_git_version: Annotated[
        str, pattern(r"([0-9a-f]{40})?", "a full commit hash")
    ] = Field(
        "",
        description="the pinned commit to build: the full 40-digit hash (`git rev-parse "
        "v0.5.6^{commit}`), as a tag or branch can move",
    )
    vllm_lmcache_src_dir: Folder = Field(
        "/opt/fxkit/src", description="where the checkout goes (`lmcache-<deployment>`)"
    )
    vllm_lmcache_fxkit_wheel: str = Field(
        "",
        description='fxkit\'s wheel on the controller (`""`: the one in the wheelhouse)',
        examples=["wheels/fxkit-0.1.0-py3-none-any.whl"],
    )
    vllm_lmcache_packages: list[
        Annotated[
            str,
            pattern(
                r"[A-Za-z0-9][A-Za-z0-9._-]*(==[A-Za-z0-9.+!_-]+)?", "a pin (name or name==version)"
            ),
        ]
    ] = Field(
        [],
        description="more packages for the venv (`name` or `name==version`)",
        examples=[["uvicorn", "prometheus_client==0.21.1"]],
    )
    vllm_lmcache_wheelhouse: str = Field(
        "", description="a controller folder of wheels: copied, the only source"
    )
    vllm_lmcache_wheel_dir: Folder = Field(
        "/opt/fxkit/wheels", description="`<this>/<deployment>/`: the wheels on the node"
    )
    vllm_lmcache_chunk_size: Whole = Field(
        256, ge=1, le=1 << 20, description="LMCache `chunk_size` (tokens; lmcache/v1/config.py)"
    )
    vllm_lmcache_local_cpu: bool = Field(True, description="LMCache `local_cpu`")
    vllm_lmcache_max_local_cpu_size: Number = Field(
        5.0, ge=0, description="LMCache `max_local_cpu_size`, GiB per GPU worker"
    )
    vllm_lmcache_local_disk: DiskPaths = Field(
        [],
        description="LMCache's disk tier: a folder (or `file://` URL) on a mounted filesystem of "
        "this node alone, or several (one per namespace or mount), each GPU worker using one "
        "(`local_disk`, comma-joined; lmcache/v1/config_base.py `_parse_local_disk`)",
        examples=["/mnt/fx/lmcache", ["/mnt/nvme0/lmcache", "/mnt/nvme1/lmcache"]],
    )
    vllm_lmcache_local_disk_path_sharding: Literal["by_gpu"] = Field(
        "by_gpu",
        description="LMCache `local_disk_path_sharding`: `by_gpu`, worker on device *d* uses "
        "path *d* mod the number of paths (lmcache/v1/storage_backend/path_sharder.py, its one "
        "strategy)",
    )
    vllm_lmcache_max_local_disk_size: Number = Field(
        0.0, ge=0, description="LMCache `max_local_disk_size`, GiB per GPU worker"
    )
    vllm_lmcache_disk_io_threads: Whole = Field(
        4,
        ge=1,
        le=1024,
        description="LMCache `extra_config.disk_io_threads`: threads reading a batch of chunks "
        "at once (`batched_get_blocking`) and writing (lmcache/v1/storage_backend/"
        "local_disk_backend.py, default 4); `fxkit bench kv` measures the best",
    )
    vllm_lmcache_use_odirect: bool = Field(
        False,
        description="LMCache `extra_config.use_odirect`: chunks whose size is a multiple of the "
        "filesystem block read and written with O_DIRECT, past the page cache "
        "(local_disk_backend.py)",
    )
    vllm_lmcache_extra_config: dict[str, object] = Field(
        {},
        description="more of LMCache `extra_config` (not the two above: their variables set them)",
        examples=[{"save_chunk_meta": False}],
    )
    vllm_lmcache_server: Literal["vllm", "serve-probe"] = Field(
        "vllm", description="`vllm`, or `serve-probe` (fxkit's stand-in, its flags)"
    )
    vllm_lmcache_command: Annotated[
        list[Word], AfterValidator(Rule("a command: `[/program, word, ...]`", _program))
    ] = Field(
        [],
        description="the command as a list (`[]`: the venv's `vllm serve` / `fxkit serve-probe`)",
        examples=[["/usr/bin/env", "fxkit", "serve-probe"]],
    )
    vllm_lmcache_model: Annotated[
        str, pattern(r"[^\s%\\']+", "a path without white space, %, \\ or '")
    ] = Field(
        description="the model's path on the node",
        examples=["/mnt/models/Llama-3.1-8B"],
    )
    vllm_lmcache_model_source: str = Field(
        "",
        description="where the model is staged from (a folder on the node such as an NFS mount, "
        "or `[user@]host:/path`), by the venv's `fxkit stage` before the instances start "
        '(verified, resumable, skipped when staged); `""`: the model is there already',
        examples=["/nfs/models/Llama-3.1-8B"],
    )
    vllm_lmcache_served_name: Annotated[
        str, pattern(r"[^\s']*", "a name without white space or '")
    ] = Field("", description='`--served-model-name` (`""`: the model folder\'s name)')
    vllm_lmcache_bind_host: IpAddress = Field(
        "0.0.0.0",
        description="`--host`; the health URLs use 127.0.0.1 for 0.0.0.0",
        examples=["0.0.0.0", "10.1.2.3"],
    )
    vllm_lmcache_base_port: Whole = Field(
        8000, ge=1, le=65535, description="instance *i* listens on this + *i*"
    )
    vllm_lmcache_layout: Layout = Field(
        cast(Any, "TP8x1"),  # as written: validated into GPU sets
        description="`TP<n>x<m>` (TP8x1, TP4x2, TP2x4, TP1x8: m instances of n GPUs, in "
        "order) or a list of GPU sets",
        examples=["TP4x2", [[0, 1, 2, 3], [4, 5, 6, 7]]],
    )
    vllm_lmcache_gpus: Whole = Field(8, ge=1, le=1024, description="the GPUs a node has (0..n-1)")
    vllm_lmcache_load_format: Name | None = Field(
        "fxkit", description="`--load-format` (fxkit's loader)"
    )
    vllm_lmcache_kv_connector: Name | None = Field(
        "LMCacheConnectorV1", description="`--kv-transfer-config`'s connector (`null`: none)"
    )
    vllm_lmcache_kv_role: KvRole = Field(
        "kv_both", description="its `kv_role` (vLLM's KVTransferConfig, vllm/config/kv_transfer.py)"
    )
    vllm_lmcache_extra_args: list[Word] = Field(
        [],
        description="more arguments, one word each: systemd splits `$FXKIT_EXTRA_ARGS` at white "
        "space (systemd.service(5), Command lines)",
        examples=[["--max-model-len=8192"]],
    )
    vllm_lmcache_env: dict[EnvName, EnvValue] = Field(
        {},
        description="more environment variables for every instance (its EnvironmentFile, values "
        "single-quoted: systemd.exec(5))",
        examples=[{"VLLM_RPC_TIMEOUT": "100000"}],
    )
    vllm_lmcache_unit: Annotated[
        str, pattern(r"[A-Za-z0-9_.:-]+@\.service", "a template unit name")
    ] = Field("vllm@.service", description="the template unit's name")
    vllm_lmcache_ready_timeout: Number = Field(
        900,
        gt=0,
        description="seconds an instance may take from its start until `/v1/models` lists it "
        "(loading included)",
    )
    vllm_lmcache_revision_history: Whole = Field(
        2,
        ge=1,
        le=100,
        description="revisions each host keeps (`fxkit rollout history`); an older one is "
        "removed only when no instance uses it",
    )
    vllm_lmcache_unit_options: dict[
        Annotated[str, pattern(r"[A-Z][A-Za-z]*", "a [Service] setting such as Nice")], Word
    ] = Field(
        {},
        description="more `[Service]` settings of the unit (systemd.exec(5)); a change is a new "
        "revision, rolled out",
        examples=[{"Nice": "5", "LimitCORE": "infinity"}],
    )
    vllm_lmcache_rollout_instances: list[str] | None = Field(
        None,
        description="the instances a run acts on (names such as `tp4-0`, or `HOST/NAME` as "
        "`fxkit rollout` passes them; null: all)",
        examples=[["tp4-1"]],
    )
    vllm_lmcache_rollout_prepare: bool = Field(
        False,
        description="prepare the selected instances' revision (venv, model, configuration, "
        "unit, each one's environment file under the revision's name) and start or stop "
        "none: `fxkit rollout` sets it for a batch before draining it",
    )


@dataclass(frozen=True)
class InstanceSpec:
    """One server instance on a host: what the rollout starts and probes."""

    name: str  # "tp4-0"
    gpus: tuple[int, ...]
    port: int
    served_name: str
    model: str
    #: The whole command line, the command itself first.
    argv: list[str]
    #: The instance's environment file, as variables.
    env: dict[str, str]
    env_file: str
    unit: str  # "vllm@tp4-0.service"
    #: Readiness: GET lists ``served_name``; liveness: GET answers 200.
    ready_url: str
    health_url: str


# -- what the variables make ------------------------------------------------------------------


def deployment_dir(v: Vars, folder: str) -> str:
    return posixpath.join(folder, v.vllm_lmcache_deployment)


def venv_pins(v: Vars) -> dict[str, Any]:
    """What makes the venv: the Python that makes it and every pin installed in it."""
    return {
        "python": v.vllm_lmcache_python,
        "vllm": v.vllm_lmcache_vllm_version,
        "torch": v.vllm_lmcache_torch_version,
        "lmcache": v.vllm_lmcache_lmcache_version,
        "lmcache_git": v.vllm_lmcache_lmcache_git_version,
        "packages": list(v.vllm_lmcache_packages),
        "fxkit": fxkit_wheel(v).name,
    }


def venvs_dir(v: Vars) -> str:
    """The deployment's venvs, one per distinct :func:`venv_pins`."""
    return deployment_dir(v, v.vllm_lmcache_venv_prefix) + ".venvs"


def venv_path(folder: str, pins: dict[str, Any]) -> str:
    """The venv of ``pins`` in ``folder``: ``v-`` and 12 hex digits of their sha256, so that a
    revision keeps its own venv and the same pins share one."""
    digest = hashlib.sha256(json.dumps(pins, sort_keys=True).encode()).hexdigest()
    return posixpath.join(folder, "v-" + digest[:ID_LENGTH])


def venv(v: Vars) -> str:
    """This run's venv (its instances' programs run from it)."""
    return venv_path(venvs_dir(v), venv_pins(v))


def current_venv(v: Vars) -> str:
    """``<prefix>/<deployment>``: a link to the venv the variables want now, for the commands
    of other plays (the G2 gate's ``fxkit``)."""
    return deployment_dir(v, v.vllm_lmcache_venv_prefix)


def lmcache_file(v: Vars) -> str:
    return posixpath.join(deployment_dir(v, v.vllm_lmcache_config_dir), "lmcache.yaml")


def local_disk_paths(v: Vars) -> list[str]:
    """``vllm_lmcache_local_disk`` as folders, each with one trailing slash (none: off)."""
    return [_folder(path) for path in v.vllm_lmcache_local_disk]


def workers_per_path(v: Vars) -> list[int]:
    """How many GPU workers use each disk folder: LMCache's ``by_gpu`` sharding gives the worker
    on device *d* (its index within the instance, HIP_VISIBLE_DEVICES renumbering) the folder
    *d* mod the number of folders (lmcache/v1/storage_backend/path_sharder.py)."""
    count = len(v.vllm_lmcache_local_disk)
    workers = [0] * count
    if not count:  # no disk tier: no folder, no worker
        return workers
    for gpus in v.vllm_lmcache_layout:
        for device in range(len(gpus)):
            workers[device % count] += 1
    return workers


def fxkit_wheel(v: Vars) -> Path:
    """The controller's fxkit wheel: ``vllm_lmcache_fxkit_wheel``, else the one wheelhouse
    ``fxkit-*.whl``."""
    given, var = v.vllm_lmcache_fxkit_wheel, "vllm_lmcache_fxkit_wheel"
    hint = (
        "build it on the controller (pip wheel --no-deps -w wheels/ <fxkit source>) and give "
        "its path, or put it in vllm_lmcache_wheelhouse"
    )
    if given:
        path = Path(given)
        if not path.is_file():
            raise v.wrong(var, f"{given}: no such file here", hint)
        if not path.name.startswith("fxkit-") or path.suffix != ".whl":
            raise v.wrong(var, f"{given} is not an fxkit wheel", hint)
        return path
    house = wheelhouse(v)
    found = sorted(house.glob("fxkit-*.whl")) if house else []
    if len(found) != 1:
        what = "no fxkit-*.whl" if not found else f"{len(found)} fxkit wheels"
        raise v.wrong(var, f"not given, and the wheelhouse has {what}", hint)
    return found[0]


def wheelhouse(v: Vars) -> Path | None:
    folder = v.vllm_lmcache_wheelhouse
    if not folder:
        return None
    if not Path(folder).is_dir():
        raise v.wrong(
            "vllm_lmcache_wheelhouse",
            f"{folder} is not a folder on the controller",
            "a folder of wheels on this machine (pip download -d FOLDER ...)",
        )
    return Path(folder)


def command(v: Vars) -> list[str]:
    """The server's command: ``vllm_lmcache_command``, else the venv's ``vllm serve`` or
    ``fxkit serve-probe``."""
    if v.vllm_lmcache_command:
        return list(v.vllm_lmcache_command)
    if v.vllm_lmcache_server == "vllm":
        return [f"{venv(v)}/bin/vllm", "serve"]
    return [f"{venv(v)}/bin/fxkit", "serve-probe"]


def validate(v: Vars) -> None:
    """What the types of :class:`Vars` cannot say: how variables go together, and the
    controller's files (the mounts and free space are checked on the host, before anything is
    written there)."""
    for var in ("vllm_lmcache_vllm_source", "vllm_lmcache_lmcache_source"):
        source = getattr(v, var)
        if _URL.fullmatch(source) and v.vllm_lmcache_wheelhouse:
            raise v.wrong(
                var,
                f"an index URL ({source}) beside vllm_lmcache_wheelhouse",
                "air-gapped: the wheelhouse is the only source; put the wheels there",
            )
    if not v.vllm_lmcache_vllm_version and not v.vllm_lmcache_torch_version:
        raise v.wrong(
            "vllm_lmcache_torch_version",
            "neither vLLM nor torch is to be installed: fxkit's loader needs torch",
            "set vllm_lmcache_vllm_version, or vllm_lmcache_torch_version",
        )
    if v.vllm_lmcache_lmcache_git and not v.vllm_lmcache_lmcache_git_version:
        raise v.wrong(
            "vllm_lmcache_lmcache_git_version",
            f"building LMCache from {v.vllm_lmcache_lmcache_git} needs a pinned commit",
            "the full 40-digit commit hash (git rev-parse v0.5.6^{commit}): a tag or branch "
            "can move",
        )
    wheelhouse(v)
    fxkit_wheel(v)
    typed = {"disk_io_threads", "use_odirect"} & set(v.vllm_lmcache_extra_config)
    if typed:
        key = sorted(typed)[0]
        raise v.wrong(
            "vllm_lmcache_extra_config",
            f"sets {key}, which vllm_lmcache_{key} sets",
            f"set vllm_lmcache_{key} instead (typed, checked, measured by fxkit bench kv)",
        )
    if v.vllm_lmcache_local_disk and v.vllm_lmcache_max_local_disk_size <= 0:
        raise v.wrong(
            "vllm_lmcache_max_local_disk_size",
            "is 0 with vllm_lmcache_local_disk set: LMCache makes no disk backend without a budget",
            "the GiB per GPU worker",
        )
    if (
        v.vllm_lmcache_server == "vllm"
        and not v.vllm_lmcache_vllm_version
        and not v.vllm_lmcache_command
    ):
        raise v.wrong(
            "vllm_lmcache_command",
            "vLLM is not installed (vllm_lmcache_vllm_version is off) and no command is given",
            "give the command, or vllm_lmcache_server: serve-probe",
        )
    source, model = v.vllm_lmcache_model_source, v.vllm_lmcache_model
    if source and not model.startswith("/"):
        raise v.wrong(
            "vllm_lmcache_model_source",
            f"{source!r} staged to {model!r}: wanted an absolute vllm_lmcache_model",
            "e.g. /nfs/models/Llama-3.1-8B, staged to /mnt/fx/models/Llama-3.1-8B",
        )
    sets, count = v.vllm_lmcache_layout, v.vllm_lmcache_gpus
    for i, gpus in enumerate(sets):
        beyond = [gpu for gpu in gpus if gpu >= count]
        if beyond:
            raise v.wrong(
                "vllm_lmcache_layout",
                f"instance {i} wants GPU {beyond[0]}, the host has {count} (0-{count - 1})",
                "fewer or smaller instances, or set vllm_lmcache_gpus",
            )
    base = v.vllm_lmcache_base_port
    if base + len(sets) - 1 > 65535:
        raise v.wrong(
            "vllm_lmcache_base_port",
            f"{len(sets)} ports from {base} pass 65535",
            f"a base port of at most {65536 - len(sets)}",
        )
    names = [_instance_name(i, gpus) for i, gpus in enumerate(sets)]
    wanted = v.vllm_lmcache_rollout_instances or []
    if any(_own(v, entry) not in [*names, None] for entry in wanted):
        raise v.wrong(
            "vllm_lmcache_rollout_instances",
            f"{wanted!r} names instances the layout lacks",
            f"null (all), or some of {', '.join(names)} (or HOST/NAME: fxkit rollout's form)",
        )


def validate_all(hosts: dict[str, Vars], fleet: FleetVars) -> None:
    """No disk folder on a namespace of the NVMe-oF fabric that another host mounts too (the
    shared model namespace: read-write on its owner, read-only elsewhere): LMCache keeps its
    index and budget in the process and evicts by deleting files, so a shared folder loses
    entries (docs/storage.md). The node's own namespace is the place."""
    filesystems = {
        name: list(getattr(v, "nvmeof_initiator_filesystems", []))
        for name, v in fleet.of("nvmeof_initiator").items()
    }
    users: dict[tuple[str, int], set[str]] = {}
    for name, entries in filesystems.items():
        for fs in entries:
            if fs.nqn and fs.nsid:
                users.setdefault((fs.nqn, fs.nsid), set()).add(name)
    for name, v in hosts.items():
        for i, disk in enumerate(local_disk_paths(v)):
            below = [
                f for f in filesystems.get(name, []) if disk.startswith(f.path.rstrip("/") + "/")
            ]
            fs = max(below, key=lambda f: len(f.path), default=None)
            if fs is None or not fs.nqn:
                continue
            sharing, owner = users.get((fs.nqn, fs.nsid), {name}), fs.owner or name
            if len(sharing) > 1 or owner != name:
                several = len(v.vllm_lmcache_local_disk) > 1
                where = nvme_fabric.namespace(fs.nqn, fs.nsid)
                raise v.wrong(
                    "vllm_lmcache_local_disk" + (f"[{i}]" if several else ""),
                    f"{disk.rstrip('/')} is on {fs.path}, {where}, which "
                    f"{', '.join(sorted(sharing))} mount (owner {owner}): a shared namespace is "
                    "no place for LMCache's disk tier, which keeps its index in one process and "
                    "evicts by deleting files",
                    "a folder on the node's own namespace, e.g. /mnt/local/lmcache "
                    "(docs/storage.md, 'Two layouts that work')",
                )


# -- what is written and run ------------------------------------------------------------------


def lmcache_config(v: Vars) -> dict[str, Any]:
    """LMCache's configuration (LMCACHE_CONFIG_FILE) from the variables."""
    config: dict[str, Any] = {
        "chunk_size": v.vllm_lmcache_chunk_size,
        "local_cpu": v.vllm_lmcache_local_cpu,
        "max_local_cpu_size": v.vllm_lmcache_max_local_cpu_size,
    }
    extra = dict(v.vllm_lmcache_extra_config)
    disks = local_disk_paths(v)
    if disks:
        config["local_disk"] = ",".join(f"file://{disk}" for disk in disks)
        config["local_disk_path_sharding"] = v.vllm_lmcache_local_disk_path_sharding
        config["max_local_disk_size"] = v.vllm_lmcache_max_local_disk_size
        # read from extra_config, not the top level (local_disk_backend.py, __init__)
        extra["disk_io_threads"] = v.vllm_lmcache_disk_io_threads
        extra["use_odirect"] = v.vllm_lmcache_use_odirect
    if extra:
        config["extra_config"] = extra
    return config


def lmcache_yaml(v: Vars) -> str:
    header = "# Written by fxkit (role vllm_lmcache): LMCache's LMCACHE_CONFIG_FILE.\n"
    return header + yaml.safe_dump(lmcache_config(v), sort_keys=False)


def _instance_name(index: int, gpus: tuple[int, ...]) -> str:
    return f"tp{len(gpus)}-{index}"


def _arguments(v: Vars, gpus: tuple[int, ...], port: int) -> list[tuple[str, str, str]]:
    """(flag, variable of the env file, value) of one instance, the model (no flag) first.
    serve-probe takes vLLM's spellings of the flags it has: no tensor parallelism, no KV
    transfer."""
    model = v.vllm_lmcache_model
    served = v.vllm_lmcache_served_name or posixpath.basename(model.rstrip("/"))
    vllm = v.vllm_lmcache_server == "vllm"
    args = [
        ("", "FXKIT_MODEL", model),
        ("--served-model-name", "FXKIT_SERVED_NAME", served),
        ("--host", "FXKIT_HOST", v.vllm_lmcache_bind_host),
        ("--port", "FXKIT_PORT", str(port)),
    ]
    if vllm:
        args.append(("--tensor-parallel-size", "FXKIT_TENSOR_PARALLEL_SIZE", str(len(gpus))))
    if v.vllm_lmcache_load_format:
        args.append(("--load-format", "FXKIT_LOAD_FORMAT", v.vllm_lmcache_load_format))
    if vllm and v.vllm_lmcache_kv_connector:
        kv = {"kv_connector": v.vllm_lmcache_kv_connector, "kv_role": v.vllm_lmcache_kv_role}
        args.append(("--kv-transfer-config", "FXKIT_KV_TRANSFER_CONFIG", json.dumps(kv)))
    return args


def exec_start(v: Vars) -> str:
    """The unit's ExecStart (systemd.service(5), "Command lines"): the program itself literal
    (it "may not be a variable"), each value ``${VAR}``, exactly one argument, and the
    command's later words and the extra args ``$VAR``, split at white space."""
    words = [command(v)[0], "$FXKIT_COMMAND_ARGS"]
    for flag, var, _ in _arguments(v, v.vllm_lmcache_layout[0], 0):
        words += [flag, f"${{{var}}}"] if flag else [f"${{{var}}}"]
    return " ".join([*words, "$FXKIT_EXTRA_ARGS"])


def _url(host: str, port: int, path: str) -> str:
    address = ipaddress.ip_address(host)
    if address.is_unspecified:
        address = ipaddress.ip_address("::1" if address.version == 6 else "127.0.0.1")
    shown = f"[{address}]" if address.version == 6 else str(address)
    return f"http://{shown}:{port}{path}"


def instance_specs(v: Vars) -> list[InstanceSpec]:
    """Every instance of the host's layout, in order."""
    cmd = command(v)
    env_dir = deployment_dir(v, v.vllm_lmcache_config_dir)
    specs = []
    for i, gpus in enumerate(v.vllm_lmcache_layout):
        name, port = _instance_name(i, gpus), v.vllm_lmcache_base_port + i
        args = _arguments(v, gpus, port)
        argv = cmd[:]
        for flag, _, value in args:
            argv += [flag, value] if flag else [value]
        argv += v.vllm_lmcache_extra_args
        env = {
            "FXKIT_COMMAND_ARGS": " ".join(cmd[1:]),
            **{var: value for _, var, value in args},
            "FXKIT_EXTRA_ARGS": " ".join(v.vllm_lmcache_extra_args),
            "HIP_VISIBLE_DEVICES": ",".join(map(str, gpus)),
        }
        if v.vllm_lmcache_kv_connector:
            env["LMCACHE_CONFIG_FILE"] = lmcache_file(v)
        env.update(v.vllm_lmcache_env)
        host = v.vllm_lmcache_bind_host
        specs.append(
            InstanceSpec(
                name=name,
                gpus=gpus,
                port=port,
                served_name=args[1][2],
                model=v.vllm_lmcache_model,
                argv=argv,
                env=env,
                env_file=posixpath.join(env_dir, f"{name}.env"),
                unit=v.vllm_lmcache_unit.replace("@.", f"@{name}.", 1),
                ready_url=_url(host, port, "/v1/models"),
                health_url=_url(host, port, "/health"),
            )
        )
    return specs


def env_file_text(spec: InstanceSpec) -> str:
    """An EnvironmentFile: every value single-quoted, which systemd.exec(5) reads as POSIX shell
    single-quoted text (nothing expanded; values with ' or newlines are refused by validate)."""
    head = f"# Written by fxkit (role vllm_lmcache): instance {spec.name} ({spec.unit}).\n"
    return head + "".join(env_assignment(name, value) for name, value in spec.env.items())


def unit_text(v: Vars) -> str:
    """The template unit: the instance name (%i) picks its environment file."""
    env_dir = deployment_dir(v, v.vllm_lmcache_config_dir)
    paths = [v.vllm_lmcache_model, *local_disk_paths(v)]
    mounts = [p for p in paths if posixpath.isabs(p)]
    return "\n".join(
        [
            "# Written by fxkit (role vllm_lmcache). One instance per GPU set: vllm@<name>.service",
            "[Unit]",
            f"Description=vLLM instance %i ({v.vllm_lmcache_deployment}, fxkit)",
            "Wants=network-online.target",
            "After=network-online.target remote-fs.target",
            *([f"RequiresMountsFor={' '.join(mounts)}"] if mounts else []),
            "",
            "[Service]",
            "Type=simple",
            f"EnvironmentFile={env_dir}/%i.env",
            f"ExecStart={exec_start(v)}",
            "Restart=on-failure",
            "RestartSec=10",
            "TimeoutStopSec=60",
            "LimitMEMLOCK=infinity",
            "LimitNOFILE=1048576",
            *(f"{key}={value}" for key, value in v.vllm_lmcache_unit_options.items()),
            "",
            "[Install]",
            "WantedBy=multi-user.target",
            "",
        ]
    )


def pip_source_args(v: Vars, source: str = "") -> list[str]:
    """pip arguments for where a package comes from (``source``): the node's wheel folder
    (wheelhouse: nothing else), a wheel file's folder, a folder, or an index URL."""
    args = ["--no-index", "--find-links", wheel_dir(v)] if wheelhouse(v) else []
    if not source:
        return args
    if _URL.fullmatch(source):  # (validate refuses one beside a wheelhouse)
        return ["--index-url", source]
    folder = posixpath.dirname(source) if source.endswith(".whl") else source
    return [*args, "--find-links", folder]


def wheel_dir(v: Vars) -> str:
    return deployment_dir(v, v.vllm_lmcache_wheel_dir)


# -- operations of this role ------------------------------------------------------------------


def torch_pin(ctx: OpContext, path: str, version: str | None) -> Result:
    """pip's constraints file that keeps the torch installed now (the one vLLM brought)."""
    if version is None:
        if ctx.check:
            return changed(f"would pin torch in {path} to the version just installed")
        return failed(f"torch is not installed in {posixpath.dirname(path)}: nothing to pin")
    return write_file(ctx, path, f"torch=={version}\n", mode="0644")


def copy_wheels(ctx: OpContext, wheels: list[Path], folder: str) -> Result:
    """The controller's wheels into ``folder`` on the node (each skipped where its sha256 is
    there already); in check mode, a folder still to be made is reported as such."""
    if ctx.check and not ctx.read(f"test -d {quote(folder)}").ok:
        return changed(f"would copy {len(wheels)} wheel(s) to {folder} (made in this run)")
    done = [copy(ctx, str(wheel), f"{folder}/{wheel.name}", mode="0644") for wheel in wheels]
    result = combine(*done)
    if not result.failed:
        copied = sum(1 for r in done if r.changed)
        there = f", {len(wheels) - copied} there already" if copied < len(wheels) else ""
        result.msg = f"{copied} of {len(wheels)} wheel(s) copied to {folder}{there}"
    return result


def verify_venv(ctx: OpContext, path: str, torch: str | None) -> Result:
    """torch is the version pinned before the later installs, and fxkit's loader imports."""
    if torch is None and ctx.check:
        return ok(f"{path}: not made yet (check mode)")
    packages = ctx.fresh(VenvPackages, path) or {}
    now = packages.get("torch")
    if now != torch:
        return failed(
            f"torch in {path} changed from {torch} to {now}: a later install replaced the torch "
            "vLLM brought; install that package with --no-deps, or a build made for this torch"
        )
    python = f"{path}/bin/python"
    probe = ctx.read(f"{quote(python)} -c 'import fxkit.loader, torch; print(torch.__version__)'")
    if not probe.ok:
        return failed(f"fxkit's loader does not import in {path}: {probe.stderr.strip()[-300:]}")
    return ok(f"{path}: torch {now}, fxkit {packages.get('fxkit', '?')}, fxkit.loader imports")


def apply(host: Host, v: Vars) -> None:
    specs = instance_specs(v)
    check_local_disk(host, v)
    environment(host, v)
    if v.vllm_lmcache_model_source:
        host.stage(v.vllm_lmcache_model_source, v.vllm_lmcache_model, f"{venv(v)}/bin/fxkit")
    config_dir = deployment_dir(v, v.vllm_lmcache_config_dir)
    host.directory(config_dir, mode="0755")
    host.task(f"file {lmcache_file(v)}").file(lmcache_file(v), lmcache_yaml(v), mode="0644")
    for disk in local_disk_paths(v):
        host.directory(disk.rstrip("/"), mode="0750")
    host.unit(v.vllm_lmcache_unit, unit_text(v))
    specs = stamp_revision(host, v, specs)
    if v.vllm_lmcache_rollout_prepare:
        prepare_instances(host, v, specs)
    else:
        start_instances(host, v, specs)
    prune_revisions(host, v)


def environment(host: Host, v: Vars) -> None:
    """The revision's virtualenv (vLLM or torch, a torch pin, LMCache, fxkit; torch verified),
    beside those of earlier revisions, and the deployment's link to it."""
    path = venv(v)
    host.directory(venvs_dir(v), mode="0755")
    house = wheelhouse(v)
    if house is not None:
        host.directory(wheel_dir(v), mode="0755")
        wheels = sorted(house.glob("*.whl"))
        host.task(f"copy wheelhouse to {wheel_dir(v)}").call(copy_wheels, wheels, wheel_dir(v))
    vllm = v.vllm_lmcache_vllm_version
    # (validate: without vLLM, torch has a pin)
    base = {"vllm": vllm} if vllm else {"torch": v.vllm_lmcache_torch_version or ""}
    first = v.vllm_lmcache_vllm_source if vllm else ""
    python = v.vllm_lmcache_python
    host.virtualenv(path, base, python=python, pip_args=pip_source_args(v, first))
    torch = (host.fact(VenvPackages, path) or {}).get("torch")
    pin = f"{path}/fxkit-constraints.txt"
    host.task(f"pin torch in {pin}").call(torch_pin, pin, torch)
    constrained = ["-c", pin]
    if v.vllm_lmcache_lmcache_git:
        lmcache_from_git(host, v, constrained)
    elif v.vllm_lmcache_lmcache_version:
        host.virtualenv(
            path,
            {"lmcache": v.vllm_lmcache_lmcache_version},
            python=python,
            pip_args=[*pip_source_args(v, v.vllm_lmcache_lmcache_source), *constrained],
        )
    wheel = fxkit_wheel(v)
    if house is None:
        host.directory(wheel_dir(v), mode="0755")
        host.task(f"copy {wheel.name}").call(copy_wheels, [wheel], wheel_dir(v))
    match = _WHEEL.fullmatch(wheel.name)
    fxkit = {"fxkit": match[2] if match else "", "safetensors": "", "numpy": ""}
    for pin_spec in v.vllm_lmcache_packages:
        name, _, version = pin_spec.partition("==")
        fxkit[name] = version
    args = pip_source_args(v) if house else ["--find-links", wheel_dir(v)]
    host.virtualenv(path, fxkit, python=python, pip_args=[*args, *constrained])
    host.task(f"verify {path}").call(verify_venv, path, torch)
    link = current_venv(v)
    target = posixpath.relpath(path, posixpath.dirname(link))
    host.task(f"link {link}").call(link_current, link, target)


def link_current(ctx: OpContext, link: str, target: str) -> Result:
    """:func:`fxkit.ops.files.link`, except over the venv an fxkit before revisions' venvs
    made at ``link`` (a folder, its instances may still run from it): left as it is."""
    done = make_link(ctx, link, target)
    if done.failed and ctx.fresh(FileStat, link).type == "directory":  # (a stat on failure only)
        return skipped(
            f"{link} is the venv of an earlier fxkit, left as it is (instances may run from it); "
            f"this revision's is {target}: remove {link} once none runs from it, and the next "
            "run links it"
        )
    return done


def lmcache_from_git(host: Host, v: Vars, constrained: list[str]) -> None:
    """LMCache built from a pinned commit for HIP (hipify, CXX=hipcc), without build isolation:
    its extensions compile against the venv's own (ROCm) torch."""
    version = v.vllm_lmcache_lmcache_git_version
    src = posixpath.join(v.vllm_lmcache_src_dir, f"lmcache-{v.vllm_lmcache_deployment}")
    host.directory(v.vllm_lmcache_src_dir, mode="0755")
    host.task(f"git {src}").git(v.vllm_lmcache_lmcache_git, src, version)
    # The venv records the commit it was built from: a new pin rebuilds, nothing else does.
    stamp = f"{venv(v)}/.fxkit-lmcache-commit"
    pip = f"{quote(venv(v))}/bin/python -m pip install -q --no-build-isolation"
    args = " ".join(quote(a) for a in [*pip_source_args(v), *constrained, src])
    host.task(f"build LMCache {version[:12]} for HIP").command(
        f"{pip} {args} && echo {version} > {quote(stamp)}",
        unless=f'[ "$(cat {quote(stamp)} 2>/dev/null)" = {version} ]',
        env={"LMCACHE_TARGET_DEVICE": "HIP", "CXX": "hipcc"},
    )


def _mount_of(path: str, mounts: list[Mount]) -> Mount | None:
    """The filesystem ``path`` lies on: the longest mount point above it (of equal ones, the
    last mounted, which hides the others)."""
    best: Mount | None = None
    for mount in mounts:
        point = mount.path.rstrip("/")
        above = path == point or path.startswith(point + "/")
        if above and (best is None or len(point) >= len(best.path.rstrip("/"))):
            best = mount
    return best


def check_local_disk(host: Host, v: Vars) -> None:
    """Each folder of LMCache's disk tier lies on a mounted filesystem other than / (the
    NVMe-oF mount: if it failed, a folder on / would fill the root disk), writable, that holds
    files, with room for the budget of every GPU worker that uses a folder on it (each keeps up
    to max_local_disk_size GiB) beside what the cache already holds there."""
    disks = [disk.rstrip("/") for disk in local_disk_paths(v)]
    mounts = host.fact(Mounts) if disks else []
    on: dict[str, tuple[Mount, list[str], int]] = {}
    for i, (path, workers) in enumerate(zip(disks, workers_per_path(v), strict=True)):
        var = "vllm_lmcache_local_disk" + (f"[{i}]" if len(disks) > 1 else "")
        mount = _mount_of(path, mounts)
        where = f"{host.name}: {var}"
        if mount is None or mount.path == "/":
            host.fail(
                f"{where}: {path} is not on a mounted filesystem (it would land on /): mount the "
                "NVMe-oF filesystem first (role nvmeof_initiator), or fix the path"
            )
            return
        if mount.fstype in PSEUDO_FS or mount.read_only:
            host.fail(
                f"{where}: {path} is on {mount.path} ({mount.fstype}, "
                f"{'read-only' if mount.read_only else 'no files'}): not a cache disk"
            )
            return
        _, paths, before = on.get(mount.path, (mount, [], 0))
        on[mount.path] = (mount, [*paths, path], before + workers)
    for mount, paths, workers in on.values():
        _check_room(host, v, mount, paths, workers)


def _check_room(host: Host, v: Vars, mount: Mount, paths: list[str], workers: int) -> None:
    """``workers`` budgets fit in the free space of ``mount`` with what ``paths`` hold."""
    budget = int(v.vllm_lmcache_max_local_disk_size * workers * 1024**3)
    held = "".join(f"du -s -B1 -- {quote(path)} 2>/dev/null | cut -f1; " for path in paths)
    df = host.fact(
        CommandOutput, f"df -P -B1 -- {quote(mount.path)} | awk 'NR==2 {{print $4}}'; {held}"
    )
    numbers = [int(w) for w in df.stdout.split() if w.isdigit()]
    if not df.ok or not numbers:
        host.fail(
            f"{host.name}: vllm_lmcache_local_disk: cannot read the free space of {mount.path}: "
            f"{df.stderr.strip()}"
        )
        return
    free = sum(numbers)
    if budget > free:
        gib = 1024**3
        host.fail(
            f"{host.name}: vllm_lmcache_max_local_disk_size: {workers} GPU workers x "
            f"{v.vllm_lmcache_max_local_disk_size:g} GiB = {budget / gib:.1f} GiB, but "
            f"{mount.path} has {free / gib:.1f} GiB free (with what the cache holds): lower the "
            "budget"
        )


def _own(v: Vars, entry: str) -> str | None:
    """The instance an entry of ``vllm_lmcache_rollout_instances`` names on this host: ``NAME``
    or ``HOST/NAME`` (None: another host's)."""
    host, _, name = entry.rpartition("/")
    return name if host in ("", v.host) else None


def chosen(v: Vars, specs: list[InstanceSpec]) -> list[InstanceSpec]:
    """The instances this run acts on (``vllm_lmcache_rollout_instances``; null: all)."""
    names = v.vllm_lmcache_rollout_instances
    if names is None:
        return specs
    wanted = {_own(v, entry) for entry in names}
    return [spec for spec in specs if spec.name in wanted]


def start_instances(host: Host, v: Vars, specs: list[InstanceSpec]) -> None:
    """The chosen instances: each one's environment file and own unit file (the template's
    text: a rollback may have pinned the instance to another revision's), then each started
    (restarted only when its command or environment changed) and, once all are starting,
    awaited in turn."""
    specs = chosen(v, specs)
    for spec in specs:
        host.task(f"env file {spec.name}").file(
            spec.env_file, env_file_text(spec), mode="0600", secret=bool(v.vllm_lmcache_env)
        )
        host.unit(spec.unit, unit_text(v))
        host.instance(spec.unit, spec.argv, spec.env)
    for spec in specs:
        host.instance_ready(
            spec.unit, spec.ready_url, spec.served_name, timeout=v.vllm_lmcache_ready_timeout
        )


def prepared_env_file(v: Vars, name: str, revision: str) -> str:
    """Where a revision's environment file of instance ``name`` is prepared: beside the
    revision's record (pruned with it)."""
    folder = posixpath.join(REVISIONS_DIR, v.vllm_lmcache_deployment)
    return posixpath.join(folder, f"{revision}.env", f"{name}.env")


def prepared_unit_file(v: Vars, revision: str) -> str:
    """Where a revision's unit text is prepared, beside its environment files (pruned with
    them): what a switch makes each instance's own unit file."""
    folder = posixpath.dirname(prepared_env_file(v, "", revision))
    return posixpath.join(folder, v.vllm_lmcache_unit)


def prepare_instances(host: Host, v: Vars, specs: list[InstanceSpec]) -> None:
    """The chosen instances' environment files of this revision and its unit text, under its
    name; nothing started or stopped (:func:`switch_instance` points each instance at them)."""
    specs = chosen(v, specs)
    if not specs:
        return
    revision = specs[0].env[ENV_VAR]
    host.directory(posixpath.dirname(prepared_env_file(v, "", revision)), mode="0700")
    host.task(f"unit of {revision}").file(
        prepared_unit_file(v, revision), unit_text(v), mode="0644"
    )
    for spec in specs:
        path = prepared_env_file(v, spec.name, revision)
        host.task(f"env file {spec.name} of {revision}").file(
            path, env_file_text(spec), mode="0600", secret=bool(v.vllm_lmcache_env)
        )


def switch_instance(ctx: OpContext, v: Vars, spec: InstanceSpec, revision: str) -> Result:
    """Point the instance at ``revision`` and start it (restarted when it runs another): its
    environment file replaced, in one rename, by the one the revision's preparation wrote (a
    surge copy's, which is not prepared, written from ``spec``), and its own unit file
    (``/etc/systemd/system/vllm@NAME.service``, which systemd prefers to the template) by the
    revision's prepared unit text (systemd reloaded), in the same command; then
    :func:`~fxkit.ops.instances.instance`. Fails when the revision was not prepared."""
    spec = replace(spec, env={**spec.env, ENV_VAR: revision})
    q = quote(spec.env_file)
    if spec.name in {s.name for s in instance_specs(v)}:
        src = quote(prepared_env_file(v, spec.name, revision))
        write = f"test -r {src} && (umask 077 && cp -f -- {src} {q}.tmp) && mv -f -- {q}.tmp {q}"
        stdin = None
    else:
        write = f"(umask 077 && cat > {q}.tmp) && mv -f -- {q}.tmp {q}"
        stdin = env_file_text(spec).encode()
    own, unit_src = quote(f"{UNIT_DIR}/{spec.unit}"), quote(prepared_unit_file(v, revision))
    # Both prepared files are there before either is put in place.
    write = f"test -r {unit_src} && mkdir -p -- {quote(UNIT_DIR)} && {write}"
    write += f" && cp -f -- {unit_src} {own}.tmp && chmod 0644 -- {own}.tmp"
    write += f" && mv -f -- {own}.tmp {own}"
    if not systemd_missing(ctx):
        write += " && systemctl daemon-reload"
    pointed = ctx.change(
        write,
        would=f"point {spec.name} at {revision}",
        done=f"pointed {spec.name} at {revision}",
        stdin=stdin,
    )
    if pointed.failed:
        return failed(
            f"{spec.unit}: cannot point it at {revision} (prepared by the batch's run?): "
            f"{pointed.msg}"
        )
    return instance(ctx, spec.unit, spec.argv, spec.env)


def switch_ready(ctx: OpContext, v: Vars, spec: InstanceSpec) -> Result:
    """Wait until the switched instance serves (``vllm_lmcache_ready_timeout``), polled every
    0.2 s: the rollout's time out of service ends with it."""
    return instance_ready(
        ctx, spec.unit, spec.ready_url, spec.served_name,
        timeout=v.vllm_lmcache_ready_timeout, interval=0.2,
    )  # fmt: skip


def surge_copies(v: Vars, specs: list[InstanceSpec]) -> list[InstanceSpec | None]:
    """A copy of each of ``specs``, in order, where it fits beside the layout: on the next free
    GPUs of the node (``vllm_lmcache_gpus`` that no set of the layout takes; as many as the
    instance has, lowest first) and the next port after the layout's; named ``NAME-surge``.
    None for an instance for which the GPUs left do not suffice (a later, smaller one may
    still get a copy)."""
    taken = {gpu for gpus in v.vllm_lmcache_layout for gpu in gpus}
    free = [gpu for gpu in range(v.vllm_lmcache_gpus) if gpu not in taken]
    port = v.vllm_lmcache_base_port + len(v.vllm_lmcache_layout)
    copies: list[InstanceSpec | None] = []
    for spec in specs:
        if len(spec.gpus) > len(free):
            copies.append(None)
            continue
        gpus, free = tuple(free[: len(spec.gpus)]), free[len(spec.gpus) :]
        name = f"{spec.name}-surge"
        argv = [
            str(port) if spec.argv[i - 1 : i] == ["--port"] else a for i, a in enumerate(spec.argv)
        ]
        env = {**spec.env, "FXKIT_PORT": str(port), "HIP_VISIBLE_DEVICES": ",".join(map(str, gpus))}
        host = v.vllm_lmcache_bind_host
        copies.append(
            replace(
                spec, name=name, gpus=gpus, port=port, argv=argv, env=env,
                env_file=posixpath.join(posixpath.dirname(spec.env_file), f"{name}.env"),
                unit=v.vllm_lmcache_unit.replace("@.", f"@{name}.", 1),
                ready_url=_url(host, port, "/v1/models"), health_url=_url(host, port, "/health"),
            )
        )  # fmt: skip
        port += 1
    return copies


def surge_memory(v: Vars, spec: InstanceSpec) -> int:
    """Bytes of host memory a copy of ``spec`` takes by its variables: LMCache's CPU buffer,
    ``max_local_cpu_size`` GiB per GPU worker, allocated whole when each worker's engine starts,
    ``local_cpu`` or not (LMCache 0.5.6: lmcache/v1/storage_backend/__init__.py creates the
    LocalCPUBackend "always ... because other backends might need it as a buffer" unless
    ``enable_pd``, which the role never sets; local_cpu_backend.py
    ``LocalCPUBackend.initialize_allocator``: ``MixedMemoryAllocator(int(cpu_size *
    1024**3))``). serve-probe loads no LMCache: 0."""
    if v.vllm_lmcache_server != "vllm" or not v.vllm_lmcache_kv_connector:
        return 0
    return int(v.vllm_lmcache_max_local_cpu_size * 2**30) * len(spec.gpus)


# -- revisions (fxkit.rollout.revision) -------------------------------------------------------


def revision_plan(v: Vars) -> RevisionPlan:
    """What defines this deployment's instances: the venv's pins, the model, the flags, the
    environment, LMCache's configuration and the unit. The bind address is left out (it differs
    per host, nothing else does): the same variables give the same revision on every host."""
    manifest = posixpath.join(v.vllm_lmcache_model, ".fxkit-stage.json")
    first = v.vllm_lmcache_layout[0]
    flags = [(flag, value) for flag, var, value in _arguments(v, first, 0) if var != "FXKIT_HOST"]
    inputs = {
        "venv": venv_pins(v),
        "model": v.vllm_lmcache_model,
        "command": command(v),
        "flags": [list(pair) for pair in flags[:2] + flags[3:]] + list(v.vllm_lmcache_extra_args),
        "layout": [list(gpus) for gpus in v.vllm_lmcache_layout],
        "base_port": v.vllm_lmcache_base_port,
        "env": dict(v.vllm_lmcache_env),
        "lmcache": lmcache_config(v) if v.vllm_lmcache_kv_connector else None,
        "unit": unit_text(v),
    }
    return RevisionPlan(
        folder=posixpath.join(REVISIONS_DIR, v.vllm_lmcache_deployment),
        manifest=manifest if v.vllm_lmcache_model.startswith("/") else "",
        inputs=inputs,
        keep=v.vllm_lmcache_revision_history,
        env_dirs=(deployment_dir(v, v.vllm_lmcache_config_dir), STATE_DIR),
    )


def stamp_revision(host: Host, v: Vars, specs: list[InstanceSpec]) -> list[InstanceSpec]:
    """The revision of this run (the model's digest read from its stage manifest on the host),
    recorded on the host, and ``specs`` with it in their environment (``FXKIT_REVISION``)."""
    rev = revision_plan(v)
    found = host.fact(CommandOutput, f"cat -- {quote(rev.manifest)} 2>/dev/null || true")
    digest = model_digest(found.stdout.encode()) if rev.manifest else ""
    revision = revision_id(rev.inputs, digest)
    host.task(f"revision {revision}").call(record_revision, rev.folder, revision, rev, digest)
    return [replace(spec, env={**spec.env, ENV_VAR: revision}) for spec in specs]


def record_revision(
    ctx: OpContext, folder: str, revision: str, rev: RevisionPlan, digest: str
) -> Result:
    """The revision's record on the host, written once (its mtime: when it was first wanted)."""
    path = f"{folder}/{revision}.json"
    if ctx.read(f"test -e {quote(path)}").ok:
        return ok(f"revision {revision} is recorded in {path}", revision=revision)
    result = ctx.change(
        write_command(folder, revision),
        would=f"record revision {revision}",
        done=f"recorded revision {revision} in {path}",
        diff=f"revisions: + {revision}\n",
        stdin=record_json(revision, rev.inputs, digest).encode(),
    )
    result.data["revision"] = revision
    return result


def prune_revisions(host: Host, v: Vars) -> None:
    """The host keeps ``vllm_lmcache_revision_history`` revisions, and those in use; and the
    venvs of those it keeps."""
    rev = revision_plan(v)
    host.task(f"prune revisions in {rev.folder}").call(prune, rev, venvs_dir(v))


def prune(ctx: OpContext, rev: RevisionPlan, venvs: str) -> Result:
    if ctx.check:
        return skipped("check mode: revisions are pruned after a run")
    done = ctx.read(prune_command(rev.folder, rev.keep, rev.env_dirs))
    if not done.ok:
        return failed(f"cannot prune {rev.folder}: {done.stderr.strip()[-300:]}")
    removed = done.stdout.split()
    stale = unused_venvs(ctx, rev.folder, venvs) if removed else []  # (else none became unused)
    if stale:
        gone = ctx.read("rm -rf -- " + " ".join(quote(path) for path in stale))
        if not gone.ok:
            return failed(f"cannot remove {', '.join(stale)}: {gone.stderr.strip()[-300:]}")
    what = [f"revision(s) {', '.join(removed)}"] if removed else []
    what += [f"venv(s) {', '.join(stale)}"] if stale else []
    if not what:
        return ok(f"{rev.folder}: nothing to prune (keeps {rev.keep})")
    return changed(f"removed {' and '.join(what)} (keeps {rev.keep})", removed=removed, venvs=stale)


def unused_venvs(ctx: OpContext, folder: str, venvs: str) -> list[str]:
    """The venvs of ``venvs`` that no revision record kept in ``folder`` names (none when the
    records cannot be read: a venv is never removed on a guess)."""
    listed = ctx.read(list_command(folder))
    records = parse_list(listed.stdout) if listed.ok else []
    pins = [k.inputs["venv"] for k in records if isinstance(k.inputs.get("venv"), dict)]
    used = {venv_path(venvs, p) for p in pins}
    if not used:
        return []
    present = ctx.read(f"ls -A -- {quote(venvs)} 2>/dev/null || true").stdout.split()
    paths = [posixpath.join(venvs, name) for name in present if _VENV.fullmatch(name)]
    return [path for path in paths if path not in used]
