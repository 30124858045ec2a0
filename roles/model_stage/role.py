"""model_stage: the model directory staged on each node's fast store by ``fxkit stage`` (the
``stage`` operation: the node copies it itself, from its NFS mount or another node over SSH)."""

from __future__ import annotations

from fxkit.engine.role import Host
from fxkit.engine.rolevars import var_error, whole_number
from fxkit.engine.variables import HostVars


def validate(v: HostVars) -> None:
    for var in ("model_stage_source", "model_stage_dest", "model_stage_command"):
        value = v.get(var)
        if not isinstance(value, str) or not value.strip():
            raise var_error(v, var, f"{var} is not set", "give it in the inventory or with -e")
    if not v.model_stage_dest.startswith("/"):
        raise var_error(v, "model_stage_dest", "model_stage_dest must be an absolute path")
    args = v.model_stage_args
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise var_error(v, "model_stage_args", "model_stage_args must be a list of strings")
    whole_number(v, "model_stage_jobs", v.model_stage_jobs, 1, 256)
    whole_number(v, "model_stage_timeout", v.model_stage_timeout, 1, 7 * 86400)


def apply(host: Host, v: HostVars) -> None:
    args = [f"--jobs={int(v.model_stage_jobs)}", *v.model_stage_args]
    if v.model_stage_verify:
        args.append("--verify")
    host.stage(
        v.model_stage_source,
        v.model_stage_dest,
        command=v.model_stage_command,
        args=args,
        timeout=float(v.model_stage_timeout),
    )
