"""A model directory staged on the host's fast store by ``fxkit stage``, run on the host.

The host does the copy itself (from its NFS mount, or another node over SSH): nothing passes
through the controller. ``fxkit stage --plan --json`` says first what would be copied: that is
all check mode runs, and a host with everything staged is ok without copying.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from shlex import quote
from typing import Any

from fxkit.ops.base import OpContext, Result, failed, failed_run, ok, skipped

#: The shell's status for a command it cannot find.
NOT_FOUND = 127


def stage(
    ctx: OpContext,
    source: str,
    dest: str,
    command: str = "fxkit",
    args: Sequence[str] = (),
    timeout: float = 7200,
) -> Result:
    """Ensure ``dest`` holds the model directory ``source`` (a folder on the host, or
    ``[user@]host:/path``), copied and verified by ``command stage`` (``command``: how fxkit
    runs on the host, e.g. a virtualenv's ``/opt/vllm/bin/fxkit``); changed only when files were
    copied. In check mode, where ``command`` is not installed yet, it is skipped saying so.

    Example::

        host.stage("/nfs/models/Llama-3.1-70B", "/mnt/fx/models/Llama-3.1-70B",
                   command="/opt/fxkit/venvs/default/bin/fxkit", args=["--jobs=8"])
    """
    words = " ".join(quote(w) for w in (source, dest, *args))
    planned = ctx.read(f"{command} stage {words} --plan --json", timeout=600)
    if ctx.check and planned.rc == NOT_FOUND:
        return skipped(f"check mode: {command} is not on the host yet (this run installs it)")
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
        diff=f"{dest}: {todo} from {source}\n",
        timeout=timeout,
    )
    result.data["plan"] = plan
    if result.failed or ctx.check:
        return result
    summary = _json(result.data.get("stdout", ""))
    if summary is None:
        return failed(f"fxkit stage printed no JSON summary: {result.data.get('stdout')!r:.300}")
    result.data["summary"] = summary
    if not summary["copied"]:
        return ok(
            f"{summary['files']} files staged already ({summary['checked']} checked)",
            **result.data,
        )
    result.msg = (
        f"staged {summary['copied']} files ({summary['gb_copied']:.2f} GB) in "
        f"{summary['seconds']:.1f} s, {summary['rate_gbps']:.2f} GB/s; "
        f"{summary['skipped']} skipped"
    )
    return result


def _json(text: str) -> dict[str, Any] | None:
    """The last line of a command's output, as the JSON object it should be."""
    lines = text.strip().splitlines()
    try:
        data = json.loads(lines[-1]) if lines else None
    except ValueError:
        return None
    return data if isinstance(data, dict) else None
