"""model_stage: the model directory staged on each node's fast store by ``fxkit stage`` (the
``stage`` operation: the node copies it itself, from its NFS mount or another node over SSH)."""

from __future__ import annotations

from pydantic import Field

from fxkit.engine.role import Host
from fxkit.engine.rolevars import AbsolutePath, RoleVars, Whole


class Vars(RoleVars):
    model_stage_source: str = Field(
        min_length=1,
        description="the model folder as the node sees it: a local path (NFS mount) or "
        "`[user@]host:/path` (SSH, the node's ssh config and known_hosts)",
        examples=["/mnt/nfs/models/Qwen2.5-32B", "store1:/models/Qwen2.5-32B"],
    )
    model_stage_dest: AbsolutePath = Field(
        description="the folder on the node's fast store (absolute)",
        examples=["/mnt/models/Qwen2.5-32B"],
    )
    model_stage_command: str = Field(
        "fxkit",
        min_length=1,
        description="how to run fxkit on the node, a command line as written "
        "(`/opt/vllm/venv/bin/fxkit`)",
    )
    model_stage_jobs: Whole = Field(4, ge=1, le=256, description="files copied at once (`--jobs`)")
    model_stage_verify: bool = Field(
        False,
        description="read every file back from the store after writing it, and hash what is "
        "there (`--verify`)",
    )
    model_stage_args: list[str] = Field(
        [],
        description='more arguments, one word each (`["--ssh-config", '
        '"/etc/fxkit/ssh_config"]`, `["--checksum", "sha256"]`)',
    )
    model_stage_timeout: Whole = Field(
        7200,
        ge=1,
        le=7 * 86400,
        description="seconds the copy may run; the partials stay for the next run",
    )


def apply(host: Host, v: Vars) -> None:
    args = [f"--jobs={v.model_stage_jobs}", *v.model_stage_args]
    if v.model_stage_verify:
        args.append("--verify")
    host.stage(
        v.model_stage_source,
        v.model_stage_dest,
        command=v.model_stage_command,
        args=args,
        timeout=float(v.model_stage_timeout),
    )
