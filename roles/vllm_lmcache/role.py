"""vllm_lmcache: vLLM with LMCache, one virtualenv per deployment, one systemd instance per GPU set.

1. the virtualenv ``<prefix>/<deployment>``: vLLM (pinned, from a wheel, a folder or an index),
   LMCache (a pinned wheel, or built from a pinned git commit for HIP), fxkit (its loader and vLLM
   plugin) from a wheel built on the controller; every install after vLLM's is constrained to the
   torch vLLM brought, and torch's version is read back: a change fails the host;
2. LMCache's configuration file, rendered from variables (``local_disk`` must lie on a mounted
   filesystem other than / with room for the budget of every GPU worker);
3. the template unit ``vllm@.service`` and one environment file per instance (the layout
   ``TP4x2`` or explicit GPU sets, ports from a base port);
4. :func:`start_instances` (the rollout's part).

:func:`instance_specs` is pure: the rollout reads each instance's argv, environment, unit and
health URLs from it without touching a host.
"""

from __future__ import annotations

import ipaddress
import json
import posixpath
import re
from dataclasses import dataclass
from pathlib import Path
from shlex import quote
from typing import Any

import yaml

from fxkit.engine.role import Host
from fxkit.engine.rolevars import var_error, whole_number
from fxkit.engine.variables import HostVars
from fxkit.facts.commands import CommandOutput
from fxkit.facts.python import VenvPackages
from fxkit.facts.system import Mount, Mounts
from fxkit.ops.base import OpContext, Result, changed, combine, failed, ok
from fxkit.ops.files import file as write_file
from fxkit.ops.transfer import copy

SERVERS = ("vllm", "serve-probe")
KV_ROLES = ("kv_both", "kv_producer", "kv_consumer")  # vLLM's KVTransferConfig.kv_role
#: Filesystems that hold no files of their own: never a place for LMCache's disk tier.
PSEUDO_FS = frozenset(
    {
        "proc", "sysfs", "devtmpfs", "devpts", "cgroup", "cgroup2", "debugfs", "tracefs",
        "securityfs", "configfs", "bpf", "mqueue", "hugetlbfs", "pstore", "efivarfs", "autofs",
        "fusectl", "binfmt_misc", "rpc_pipefs", "nsfs",
    }
)  # fmt: skip
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_VERSION = re.compile(r"[0-9][A-Za-z0-9.+!_-]*")
_PIN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(==[A-Za-z0-9.+!_-]+)?")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_LAYOUT = re.compile(r"TP([1-9][0-9]*)(?:x([1-9][0-9]*))?", re.IGNORECASE)
_WHEEL = re.compile(r"([A-Za-z0-9_.]+)-([0-9][^-]*)-.+\.whl")
_URL = re.compile(r"(https?|file)://\S+")
_COMMIT = re.compile(r"[0-9a-f]{40}")
#: What a value in an EnvironmentFile, single-quoted, cannot hold (systemd.exec(5)).
_UNQUOTABLE = re.compile(r"['\x00-\x08\x0a-\x1f\x7f]")


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


# -- variables --------------------------------------------------------------------------------


def deployment_dir(v: HostVars, var: str) -> str:
    return posixpath.join(v[var], v.vllm_lmcache_deployment)


def venv(v: HostVars) -> str:
    return deployment_dir(v, "vllm_lmcache_venv_prefix")


def lmcache_file(v: HostVars) -> str:
    return posixpath.join(deployment_dir(v, "vllm_lmcache_config_dir"), "lmcache.yaml")


def gpu_sets(v: HostVars) -> list[tuple[int, ...]]:
    """``vllm_lmcache_layout``: ``TP4x2`` (2 instances of 4 GPUs, in order), ``TP8`` (one), or a
    list of GPU sets ``[[0, 1, 2, 3], [4, 5, 6, 7]]``; each GPU of ``vllm_lmcache_gpus`` at most
    once."""
    var, layout = "vllm_lmcache_layout", v.vllm_lmcache_layout
    count = whole_number(v, "vllm_lmcache_gpus", v.vllm_lmcache_gpus, 1, 1024)
    if isinstance(layout, str):
        match = _LAYOUT.fullmatch(layout.strip())
        if not match:
            raise var_error(
                v,
                var,
                f"unknown layout {layout!r}",
                "TP<n>x<instances> (TP8x1, TP4x2, TP2x4), "
                "or a list of GPU sets: [[0, 1, 2, 3], [4, 5, 6, 7]]",
            )
        size, instances = int(match[1]), int(match[2] or 1)
        sets = [tuple(range(i * size, (i + 1) * size)) for i in range(instances)]
    elif isinstance(layout, list) and layout and all(isinstance(s, list) and s for s in layout):
        sets = []
        for gpus in layout:
            if not all(isinstance(g, int) and not isinstance(g, bool) and g >= 0 for g in gpus):
                raise var_error(v, var, f"GPU set {gpus!r} is not a list of GPU indices")
            sets.append(tuple(gpus))
    else:
        raise var_error(v, var, f"{layout!r} is neither TP<n>x<m> nor a list of GPU sets")
    seen: dict[int, int] = {}
    for i, gpus in enumerate(sets):
        for gpu in gpus:
            if gpu >= count:
                raise var_error(
                    v,
                    var,
                    f"instance {i} wants GPU {gpu}, the host has {count} (0-{count - 1})",
                    "fewer or smaller instances, or set vllm_lmcache_gpus",
                )
            if gpu in seen:
                raise var_error(
                    v,
                    var,
                    f"GPU {gpu} is in instance {seen[gpu]} and instance {i}: GPU sets "
                    "must not overlap"
                    if seen[gpu] != i
                    else f"GPU {gpu} is listed twice in instance {i}",
                )
            seen[gpu] = i
    return sets


def local_disk_path(v: HostVars) -> str:
    """``vllm_lmcache_local_disk`` as a directory path with one trailing slash ("" when off)."""
    disk = v.vllm_lmcache_local_disk or ""
    path = disk.removeprefix("file://")
    return posixpath.normpath(path) + "/" if path else ""


def _is_version(value: object) -> bool:
    return isinstance(value, str) and bool(_VERSION.fullmatch(value))


def _number(v: HostVars, var: str) -> float:
    value = v[var]
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise var_error(v, var, f"{var} is {value!r}: wanted a size in GiB (a number >= 0)")
    return float(value)


def _source(v: HostVars, var: str) -> None:
    value = v[var] or ""
    if re.search(r"\s", value) or (value and not (posixpath.isabs(value) or _URL.fullmatch(value))):
        raise var_error(
            v,
            var,
            f"{value!r} is not a path on the node or a URL",
            "a wheel file or a folder of wheels on the node, or an index URL (http(s)://, file://)",
        )
    if value and _URL.fullmatch(value) and v.vllm_lmcache_wheelhouse:
        raise var_error(
            v,
            var,
            f"an index URL ({value}) beside vllm_lmcache_wheelhouse",
            "air-gapped: the wheelhouse is the only source; put the wheels there",
        )


def fxkit_wheel(v: HostVars) -> Path:
    """The controller's fxkit wheel: ``vllm_lmcache_fxkit_wheel``, else the one wheelhouse
    ``fxkit-*.whl``."""
    given = v.vllm_lmcache_fxkit_wheel
    hint = (
        "build it on the controller (pip wheel --no-deps -w wheels/ <fxkit source>) and give "
        "its path, or put it in vllm_lmcache_wheelhouse"
    )
    if given:
        path = Path(given)
        if not path.is_file():
            raise var_error(v, "vllm_lmcache_fxkit_wheel", f"{given}: no such file here", hint)
        if not path.name.startswith("fxkit-") or path.suffix != ".whl":
            raise var_error(v, "vllm_lmcache_fxkit_wheel", f"{given} is not an fxkit wheel", hint)
        return path
    found = sorted(Path(v.vllm_lmcache_wheelhouse).glob("fxkit-*.whl")) if wheelhouse(v) else []
    if len(found) != 1:
        what = "no fxkit-*.whl" if not found else f"{len(found)} fxkit wheels"
        raise var_error(
            v, "vllm_lmcache_fxkit_wheel", f"not given, and the wheelhouse has {what}", hint
        )
    return found[0]


def wheelhouse(v: HostVars) -> Path | None:
    folder = v.vllm_lmcache_wheelhouse
    if not folder:
        return None
    if not Path(folder).is_dir():
        raise var_error(v, "vllm_lmcache_wheelhouse", f"{folder} is not a folder on the controller")
    return Path(folder)


def command(v: HostVars) -> list[str]:
    """The server's command: ``vllm_lmcache_command``, else the venv's ``vllm serve`` or
    ``fxkit serve-probe``."""
    if v.vllm_lmcache_command:
        return [str(word) for word in v.vllm_lmcache_command]
    if v.vllm_lmcache_server == "vllm":
        return [f"{venv(v)}/bin/vllm", "serve"]
    return [f"{venv(v)}/bin/fxkit", "serve-probe"]


def validate(v: HostVars) -> None:
    """Every variable, before any host is touched (the mounts and free space are checked on the
    host, before anything is written there)."""
    for var in ("vllm_lmcache_deployment",):
        if not isinstance(v[var], str) or not _NAME.fullmatch(v[var]):
            raise var_error(v, var, f"{v[var]!r} is not a name", "letters, digits, _ . -")
    for var in (
        "vllm_lmcache_venv_prefix",
        "vllm_lmcache_config_dir",
        "vllm_lmcache_wheel_dir",
        "vllm_lmcache_src_dir",
    ):
        if not isinstance(v[var], str) or not posixpath.isabs(v[var]) or re.search(r"\s", v[var]):
            raise var_error(v, var, f"{v[var]!r} is not an absolute path without white space")
    for var in (
        "vllm_lmcache_vllm_version",
        "vllm_lmcache_torch_version",
        "vllm_lmcache_lmcache_version",
    ):
        if v[var] not in (None, False, "") and not _is_version(v[var]):
            raise var_error(v, var, f"{v[var]!r} is not a version", "e.g. 0.20.1+rocm721, or null")
    for var in ("vllm_lmcache_vllm_source", "vllm_lmcache_lmcache_source"):
        _source(v, var)
    if not v.vllm_lmcache_vllm_version and not v.vllm_lmcache_torch_version:
        raise var_error(
            v,
            "vllm_lmcache_torch_version",
            "neither vLLM nor torch is to be installed: fxkit's loader needs torch",
            "set vllm_lmcache_vllm_version, or vllm_lmcache_torch_version",
        )
    git, git_version = v.vllm_lmcache_lmcache_git, v.vllm_lmcache_lmcache_git_version
    if git and not (isinstance(git_version, str) and _COMMIT.fullmatch(git_version)):
        raise var_error(
            v,
            "vllm_lmcache_lmcache_git_version",
            f"{git_version!r}: building LMCache from {git} needs a pinned commit",
            "the full 40-digit commit hash (git rev-parse v0.5.6^{commit}): a tag or branch "
            "can move",
        )
    wheelhouse(v)
    fxkit_wheel(v)
    packages = v.vllm_lmcache_packages
    if not isinstance(packages, list) or not all(
        isinstance(p, str) and _PIN.fullmatch(p) for p in packages
    ):
        raise var_error(
            v,
            "vllm_lmcache_packages",
            f"{packages!r} is not a list of pins",
            "name or name==version",
        )
    whole_number(v, "vllm_lmcache_chunk_size", v.vllm_lmcache_chunk_size, 1, 1 << 20)
    if not isinstance(v.vllm_lmcache_local_cpu, bool):
        raise var_error(v, "vllm_lmcache_local_cpu", "wanted true or false")
    _number(v, "vllm_lmcache_max_local_cpu_size")
    disk_size = _number(v, "vllm_lmcache_max_local_disk_size")
    disk = v.vllm_lmcache_local_disk
    if disk:
        path = str(disk).removeprefix("file://")
        if not posixpath.isabs(path) or re.search(r"[\s,%\\']", path):
            raise var_error(
                v,
                "vllm_lmcache_local_disk",
                f"{disk!r} is not an absolute path (or file:// URL)",
                "one folder on the NVMe-oF mount, e.g. /mnt/fx/lmcache (no white space, ',', %, "
                "\\ or ')",
            )
        if disk_size <= 0:
            raise var_error(
                v,
                "vllm_lmcache_max_local_disk_size",
                "is 0 with vllm_lmcache_local_disk set: "
                "LMCache makes no disk backend without a budget",
                "the GiB per GPU worker",
            )
    if not isinstance(v.vllm_lmcache_extra_config, dict):
        raise var_error(
            v, "vllm_lmcache_extra_config", "wanted a mapping", "e.g. {use_odirect: true}"
        )
    if v.vllm_lmcache_server not in SERVERS:
        raise var_error(
            v,
            "vllm_lmcache_server",
            f"{v.vllm_lmcache_server!r} is not one of {', '.join(SERVERS)}",
        )
    words = v.vllm_lmcache_command
    if not isinstance(words, list) or any(
        not isinstance(w, str) or not w or _UNQUOTABLE.search(w) or (i and re.search(r"\s", w))
        for i, w in enumerate(words)
    ):
        raise var_error(
            v,
            "vllm_lmcache_command",
            f"{words!r} is not a command as a list",
            "[/path/to/program, subcommand]: words after the first without spaces",
        )
    if words and (not posixpath.isabs(words[0]) or re.search(r"[\s%\\\"'$;]", words[0])):
        raise var_error(
            v,
            "vllm_lmcache_command",
            f"{words[0]!r} is not an absolute path (without white space, %, \\, quotes, $ or ;)",
            "systemd runs it without a shell, written as it is in ExecStart",
        )
    if v.vllm_lmcache_server == "vllm" and not v.vllm_lmcache_vllm_version and not words:
        raise var_error(
            v,
            "vllm_lmcache_command",
            "vLLM is not installed (vllm_lmcache_vllm_version is off) and no command is given",
            "give the command, or vllm_lmcache_server: serve-probe",
        )
    model = v.vllm_lmcache_model
    if not isinstance(model, str) or not model or re.search(r"[\s%\\']", model):
        raise var_error(
            v,
            "vllm_lmcache_model",
            f"{model!r}: wanted the model's path on the node",
            "e.g. /mnt/models/Llama-3.1-8B (no white space, %, \\ or ')",
        )
    source = v.vllm_lmcache_model_source
    if source and (not isinstance(source, str) or not model.startswith("/")):
        raise var_error(
            v,
            "vllm_lmcache_model_source",
            f"{source!r} staged to {model!r}: wanted a folder or [user@]host:/path, and an "
            "absolute vllm_lmcache_model",
            "e.g. /nfs/models/Llama-3.1-8B, staged to /mnt/fx/models/Llama-3.1-8B",
        )
    name = v.vllm_lmcache_served_name
    if name and (not isinstance(name, str) or re.search(r"[\s']", name)):
        raise var_error(v, "vllm_lmcache_served_name", f"{name!r} is not a name without spaces")
    try:
        ipaddress.ip_address(str(v.vllm_lmcache_bind_host))
    except ValueError:
        raise var_error(
            v,
            "vllm_lmcache_bind_host",
            f"{v.vllm_lmcache_bind_host!r} is not an IP address",
            "0.0.0.0 (all), or the node's address",
        ) from None
    sets = gpu_sets(v)
    base = whole_number(v, "vllm_lmcache_base_port", v.vllm_lmcache_base_port, 1, 65535)
    if base + len(sets) - 1 > 65535:
        raise var_error(v, "vllm_lmcache_base_port", f"{len(sets)} ports from {base} pass 65535")
    for var in ("vllm_lmcache_load_format", "vllm_lmcache_kv_connector"):
        if v[var] is not None and not (isinstance(v[var], str) and _NAME.fullmatch(v[var])):
            raise var_error(v, var, f"{v[var]!r} is not a name")
    if v.vllm_lmcache_kv_role not in KV_ROLES:
        raise var_error(
            v,
            "vllm_lmcache_kv_role",
            f"{v.vllm_lmcache_kv_role!r} is not one of {', '.join(KV_ROLES)}",
        )
    extra = v.vllm_lmcache_extra_args
    if not isinstance(extra, list) or not all(
        isinstance(a, str) and a and not re.search(r"\s", a) and not _UNQUOTABLE.search(a)
        for a in extra
    ):
        raise var_error(
            v,
            "vllm_lmcache_extra_args",
            f"{extra!r}: wanted a list of arguments without white space or '",
            "systemd splits $FXKIT_EXTRA_ARGS at white space: one word per item, "
            "values joined with = (--max-model-len=8192)",
        )
    env = v.vllm_lmcache_env
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and _ENV_NAME.fullmatch(k) and not k.startswith("FXKIT_") for k in env
    ):
        raise var_error(v, "vllm_lmcache_env", f"{env!r}: wanted NAME: value (names not FXKIT_*)")
    unit = v.vllm_lmcache_unit
    if not isinstance(unit, str) or not re.fullmatch(r"[A-Za-z0-9_.:-]+@\.service", unit):
        raise var_error(
            v, "vllm_lmcache_unit", f"{unit!r} is not a template unit name", "e.g. vllm@.service"
        )
    names = [_instance_name(i, gpus) for i, gpus in enumerate(sets)]
    chosen = v.vllm_lmcache_rollout_instances
    if chosen is not None and (
        not isinstance(chosen, list)
        or any(_own(v, entry) not in [*names, None] for entry in chosen)
    ):
        raise var_error(
            v,
            "vllm_lmcache_rollout_instances",
            f"{chosen!r} names instances the layout lacks",
            f"null (all), or some of {', '.join(names)} (or HOST/NAME: fxkit rollout's form)",
        )
    for key, value in env.items():
        if _UNQUOTABLE.search(str(value)):
            raise var_error(
                v,
                f"vllm_lmcache_env.{key}",
                f"{value!r} cannot be written to an EnvironmentFile",
                "no ', newline or control characters",
            )


# -- what is written and run ------------------------------------------------------------------


def lmcache_config(v: HostVars) -> dict[str, Any]:
    """LMCache's configuration (LMCACHE_CONFIG_FILE) from the variables."""
    config: dict[str, Any] = {
        "chunk_size": int(v.vllm_lmcache_chunk_size),
        "local_cpu": bool(v.vllm_lmcache_local_cpu),
        "max_local_cpu_size": float(v.vllm_lmcache_max_local_cpu_size),
    }
    disk = local_disk_path(v)
    if disk:
        config["local_disk"] = f"file://{disk}"
        config["max_local_disk_size"] = float(v.vllm_lmcache_max_local_disk_size)
    if v.vllm_lmcache_extra_config:
        config["extra_config"] = dict(v.vllm_lmcache_extra_config)
    return config


def lmcache_yaml(v: HostVars) -> str:
    header = "# Written by fxkit (role vllm_lmcache): LMCache's LMCACHE_CONFIG_FILE.\n"
    return header + yaml.safe_dump(lmcache_config(v), sort_keys=False)


def _instance_name(index: int, gpus: tuple[int, ...]) -> str:
    return f"tp{len(gpus)}-{index}"


def _arguments(v: HostVars, gpus: tuple[int, ...], port: int) -> list[tuple[str, str, str]]:
    """(flag, variable of the env file, value) of one instance, the model (no flag) first.
    serve-probe takes vLLM's spellings of the flags it has: no tensor parallelism, no KV
    transfer."""
    model = v.vllm_lmcache_model
    served = v.vllm_lmcache_served_name or posixpath.basename(model.rstrip("/"))
    vllm = v.vllm_lmcache_server == "vllm"
    args = [
        ("", "FXKIT_MODEL", model),
        ("--served-model-name", "FXKIT_SERVED_NAME", served),
        ("--host", "FXKIT_HOST", str(v.vllm_lmcache_bind_host)),
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


def exec_start(v: HostVars) -> str:
    """The unit's ExecStart (systemd.service(5), "Command lines"): the program itself literal
    (it "may not be a variable"), each value ``${VAR}``, exactly one argument, and the
    command's later words and the extra args ``$VAR``, split at white space."""
    words = [command(v)[0], "$FXKIT_COMMAND_ARGS"]
    for flag, var, _ in _arguments(v, gpu_sets(v)[0], 0):
        words += [flag, f"${{{var}}}"] if flag else [f"${{{var}}}"]
    return " ".join([*words, "$FXKIT_EXTRA_ARGS"])


def _url(host: str, port: int, path: str) -> str:
    address = ipaddress.ip_address(host)
    if address.is_unspecified:
        address = ipaddress.ip_address("::1" if address.version == 6 else "127.0.0.1")
    shown = f"[{address}]" if address.version == 6 else str(address)
    return f"http://{shown}:{port}{path}"


def instance_specs(v: HostVars) -> list[InstanceSpec]:
    """Every instance of the host's layout, in order."""
    cmd = command(v)
    env_dir = deployment_dir(v, "vllm_lmcache_config_dir")
    specs = []
    for i, gpus in enumerate(gpu_sets(v)):
        name, port = _instance_name(i, gpus), int(v.vllm_lmcache_base_port) + i
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
        env.update({k: str(value) for k, value in v.vllm_lmcache_env.items()})
        host = str(v.vllm_lmcache_bind_host)
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
    lines = [f"# Written by fxkit (role vllm_lmcache): instance {spec.name} ({spec.unit})."]
    lines += [f"{name}='{value}'" for name, value in spec.env.items()]
    return "\n".join(lines) + "\n"


def unit_text(v: HostVars) -> str:
    """The template unit: the instance name (%i) picks its environment file."""
    env_dir = deployment_dir(v, "vllm_lmcache_config_dir")
    mounts = [p for p in (v.vllm_lmcache_model, local_disk_path(v)) if posixpath.isabs(p)]
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
            "",
            "[Install]",
            "WantedBy=multi-user.target",
            "",
        ]
    )


def pip_source_args(v: HostVars, var: str) -> list[str]:
    """pip arguments for where a package comes from: the node's wheel folder (wheelhouse:
    nothing else), a wheel file's folder, a folder, or an index URL."""
    args = ["--no-index", "--find-links", wheel_dir(v)] if wheelhouse(v) else []
    source = v[var] if var else ""
    if not source:
        return args
    if _URL.fullmatch(source):  # (validate refuses one beside a wheelhouse)
        return ["--index-url", source]
    folder = posixpath.dirname(source) if source.endswith(".whl") else source
    return [*args, "--find-links", folder]


def wheel_dir(v: HostVars) -> str:
    return deployment_dir(v, "vllm_lmcache_wheel_dir")


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


def apply(host: Host, v: HostVars) -> None:
    specs = instance_specs(v)
    check_local_disk(host, v)
    environment(host, v)
    if v.vllm_lmcache_model_source:
        host.stage(v.vllm_lmcache_model_source, v.vllm_lmcache_model, f"{venv(v)}/bin/fxkit")
    config_dir = deployment_dir(v, "vllm_lmcache_config_dir")
    host.directory(config_dir, mode="0755")
    host.task(f"file {lmcache_file(v)}").file(lmcache_file(v), lmcache_yaml(v), mode="0644")
    disk = local_disk_path(v)
    if disk:
        host.directory(disk.rstrip("/"), mode="0750")
    host.unit(v.vllm_lmcache_unit, unit_text(v))
    start_instances(host, v, specs)


def environment(host: Host, v: HostVars) -> None:
    """The virtualenv: vLLM (or torch), a torch pin, LMCache, fxkit; torch verified."""
    path = venv(v)
    host.directory(posixpath.dirname(path), mode="0755")
    house = wheelhouse(v)
    if house is not None:
        host.directory(wheel_dir(v), mode="0755")
        wheels = sorted(house.glob("*.whl"))
        host.task(f"copy wheelhouse to {wheel_dir(v)}").call(copy_wheels, wheels, wheel_dir(v))
    base = (
        {"vllm": v.vllm_lmcache_vllm_version}
        if v.vllm_lmcache_vllm_version
        else {"torch": v.vllm_lmcache_torch_version}
    )
    first = "vllm_lmcache_vllm_source" if v.vllm_lmcache_vllm_version else ""
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
            pip_args=[*pip_source_args(v, "vllm_lmcache_lmcache_source"), *constrained],
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
    args = pip_source_args(v, "") if house else ["--find-links", wheel_dir(v)]
    host.virtualenv(path, fxkit, python=python, pip_args=[*args, *constrained])
    host.task(f"verify {path}").call(verify_venv, path, torch)


def lmcache_from_git(host: Host, v: HostVars, constrained: list[str]) -> None:
    """LMCache built from a pinned commit for HIP (hipify, CXX=hipcc), without build isolation:
    its extensions compile against the venv's own (ROCm) torch."""
    version = v.vllm_lmcache_lmcache_git_version
    src = posixpath.join(v.vllm_lmcache_src_dir, f"lmcache-{v.vllm_lmcache_deployment}")
    host.directory(v.vllm_lmcache_src_dir, mode="0755")
    host.task(f"git {src}").git(v.vllm_lmcache_lmcache_git, src, version)
    # The venv records the commit it was built from: a new pin rebuilds, nothing else does.
    stamp = f"{venv(v)}/.fxkit-lmcache-commit"
    pip = f"{quote(venv(v))}/bin/python -m pip install -q --no-build-isolation"
    args = " ".join(quote(a) for a in [*pip_source_args(v, ""), *constrained, src])
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


def check_local_disk(host: Host, v: HostVars) -> None:
    """LMCache's disk tier lies on a mounted filesystem other than / (the NVMe-oF mount: if it
    failed, a folder on / would fill the root disk), writable, that holds files, with room for
    every GPU worker's budget (each keeps up to max_local_disk_size GiB) beside what the cache
    already holds there."""
    disk = local_disk_path(v)
    if not disk:
        return
    var = "vllm_lmcache_local_disk"
    path = disk.rstrip("/")
    mount = _mount_of(path, host.fact(Mounts))
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
    workers = sum(len(gpus) for gpus in gpu_sets(v))
    budget = int(float(v.vllm_lmcache_max_local_disk_size) * workers * 1024**3)
    df = host.fact(
        CommandOutput,
        f"df -P -B1 -- {quote(mount.path)} | awk 'NR==2 {{print $4}}'; "
        f"du -s -B1 -- {quote(path)} 2>/dev/null | cut -f1",
    )
    numbers = [int(w) for w in df.stdout.split() if w.isdigit()]
    if not df.ok or not numbers:
        host.fail(f"{where}: cannot read the free space of {mount.path}: {df.stderr.strip()}")
        return
    free = numbers[0] + (numbers[1] if len(numbers) > 1 else 0)
    if budget > free:
        gib = 1024**3
        host.fail(
            f"{host.name}: vllm_lmcache_max_local_disk_size: {workers} GPU workers x "
            f"{v.vllm_lmcache_max_local_disk_size} GiB = {budget / gib:.1f} GiB, but {mount.path} "
            f"has {free / gib:.1f} GiB free (with what the cache holds): lower the budget"
        )


def _own(v: HostVars, entry: object) -> str | None:
    """The instance an entry of ``vllm_lmcache_rollout_instances`` names on this host: ``NAME``
    or ``HOST/NAME`` (None: another host's)."""
    host, _, name = str(entry).rpartition("/")
    return name if host in ("", v.host) else None


def chosen(v: HostVars, specs: list[InstanceSpec]) -> list[InstanceSpec]:
    """The instances this run acts on (``vllm_lmcache_rollout_instances``; null: all)."""
    names = v.vllm_lmcache_rollout_instances
    if names is None:
        return specs
    wanted = {_own(v, entry) for entry in names}
    return [spec for spec in specs if spec.name in wanted]


def start_instances(host: Host, v: HostVars, specs: list[InstanceSpec]) -> None:
    """The chosen instances: each one's environment file, then each started (restarted only
    when its command or environment changed) and, once all are starting, awaited in turn."""
    specs = chosen(v, specs)
    for spec in specs:
        host.task(f"env file {spec.name}").file(
            spec.env_file, env_file_text(spec), mode="0600", secret=bool(v.vllm_lmcache_env)
        )
        host.instance(spec.unit, spec.argv, spec.env)
    timeout = float(v.vllm_lmcache_ready_timeout)
    for spec in specs:
        host.instance_ready(spec.unit, spec.ready_url, spec.served_name, timeout=timeout)
