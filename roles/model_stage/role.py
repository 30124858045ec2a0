"""model_stage: the model directory staged on each node's fast store by ``fxkit stage``.

The node runs the copy itself (from its NFS mount, or from another node over SSH), so nothing
passes through the controller. ``fxkit stage --plan --json`` says first what would be copied:
that is all check mode runs, and a node with everything staged reports ok without copying.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence

from fxkit.ops.base import OpContext, Result, failed, failed_run, ok
from fxkit.role import Host
from fxkit.rolevars import var_error, whole_number
from fxkit.variables import HostVars


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
    host.call(
        model_staged,
        v.model_stage_dest,
        v.model_stage_source,
        command=v.model_stage_command,
        args=args,
        timeout=float(v.model_stage_timeout),
    )


def model_staged(
    ctx: OpContext,
    dest: str,
    source: str,
    *,
    command: str = "fxkit",
    args: Sequence[str] = (),
    timeout: float = 7200,
) -> Result:
    """``source`` staged in ``dest`` on the host: changed only when files were copied."""
    words = " ".join(shlex.quote(w) for w in (source, dest, *args))
    planned = ctx.read(f"{command} stage {words} --plan --json", timeout=600)
    if not planned.ok:
        return failed_run(f"plan staging {source}", planned)
    plan = _json(planned.stdout)
    if plan is None:
        return failed(f"fxkit stage --plan printed no JSON: {planned.stdout[-300:]!r}")
    if not plan["copy"] and not plan["check"]:
        return ok(f"{plan['files']} files staged already", plan=plan)
    todo = f"{len(plan['copy'])} files ({plan['bytes_to_copy'] / 1e9:.2f} GB)"
    if plan["check"]:
        todo += f", check {len(plan['check'])} ({plan['bytes_to_check'] / 1e9:.2f} GB)"
    result = ctx.change(
        f"{command} stage {words} --json --quiet",
        would=f"stage {todo} from {source}",
        done=f"staged from {source}",
        timeout=timeout,
    )
    result.data["plan"] = plan
    if result.failed or ctx.check:
        return result
    summary = _json(result.data.get("stdout", ""))
    if summary is None:
        return failed(f"fxkit stage printed no JSON summary: {result.data.get('stdout')!r:.300}")
    result.data["summary"] = summary
    copied = (
        f"{summary['copied']} files ({summary['gb_copied']:.2f} GB) in {summary['seconds']:.1f} s,"
        f" {summary['rate_gbps']:.2f} GB/s; {summary['skipped']} skipped"
    )
    if not summary["copied"]:
        return ok(f"{summary['files']} files staged already ({summary['checked']} checked)",
                  **result.data)  # fmt: skip
    result.msg = f"staged {copied}"
    return result


def _json(text: str) -> dict | None:
    """The last line of a command's output, as the JSON object it should be."""
    lines = text.strip().splitlines()
    try:
        data = json.loads(lines[-1]) if lines else None
    except ValueError:
        return None
    return data if isinstance(data, dict) else None
