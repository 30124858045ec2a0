"""A model directory staged on the host's fast store by ``fxkit stage``, run on the host.

The host does the copy itself (from its NFS mount, or another node over SSH): nothing passes
through the controller. ``fxkit stage --plan --json`` says first what would be copied: that is
all check mode runs, and a host with everything staged is ok without copying. What the host
prints is read as the models of :mod:`fxkit.staging_report` declare it.
"""

from __future__ import annotations

from collections.abc import Sequence
from shlex import quote

from fxkit.ops.base import OpContext, Result, failed, failed_run, ok, skipped
from fxkit.staging_report import PlanReport, ReportError, Summary

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
    try:
        plan = PlanReport.read(planned.stdout, f"{command} stage --plan --json")
    except ReportError as exc:
        return failed(str(exc), stdout=planned.stdout)
    if not plan.to_copy and not plan.to_check:
        return ok(f"{plan.files} files staged already", plan=plan.to_json())
    todo = f"{len(plan.to_copy)} files ({plan.bytes_to_copy / 1e9:.2f} GB)"
    if plan.to_check:
        todo += f", check {len(plan.to_check)} ({plan.bytes_to_check / 1e9:.2f} GB)"
    result = ctx.change(
        f"{command} stage {words} --json --quiet",
        would=f"stage {todo} from {source}",
        done=f"staged from {source}",
        diff=f"{dest}: {todo} from {source}\n",
        timeout=timeout,
    )
    result.data["plan"] = plan.to_json()
    if result.failed or ctx.check:
        return result
    try:
        summary = Summary.read(result.data.get("stdout", ""), f"{command} stage --json")
    except ReportError as exc:
        return failed(str(exc), **result.data)
    result.data["summary"] = summary.to_json()
    if not summary.copied:
        return ok(
            f"{summary.files} files staged already ({summary.checked} checked)", **result.data
        )
    result.msg = (
        f"staged {summary.copied} files ({summary.gb_copied:.2f} GB) in "
        f"{summary.seconds:.1f} s, {summary.rate_gbps:.2f} GB/s; {summary.skipped} skipped"
    )
    return result
