"""``fxkit stage SRC DEST``: copy a model directory to the fast store (:mod:`fxkit.staging`)."""

from __future__ import annotations

import json

import click
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from fxkit.cli.loader import Size
from fxkit.connection import ConnectOptions
from fxkit.staging import (
    CHECKSUM,
    CHECKSUMS,
    CHUNK,
    JOBS,
    Plan,
    Stager,
    open_source,
    plan,
    prepare,
)
from fxkit.staging_report import Summary


@click.command()
@click.argument("source")
@click.argument("dest")
@click.option(
    "-j",
    "--jobs",
    type=click.IntRange(min=1),
    default=JOBS,
    show_default=True,
    help="Files copied at once (from a remote source: over up to as many SSH connections).",
)
@click.option(
    "--chunk-size",
    type=Size(),
    default=CHUNK,
    show_default=f"{CHUNK >> 20}MiB",
    help="Bytes per read and write.",
)
@click.option(
    "--checksum",
    type=click.Choice(sorted(CHECKSUMS)),
    default=CHECKSUM,
    show_default=True,
    help="Hash of the bytes read that each copy is checked with: blake3 (about three times "
    "faster), or sha256 (the digest Hugging Face publishes for LFS files).",
)
@click.option(
    "--verify",
    is_flag=True,
    help="Also read every file back from the store after writing it (and every file "
    "already there) and compare its checksum with the source's.",
)
@click.option(
    "--plan",
    "plan_only",
    is_flag=True,
    help="Only say what would be copied, checked and skipped; change nothing.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the summary (or plan) as JSON.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar.")
@click.option(
    "--ssh-key",
    type=click.Path(exists=True, dir_okay=False),
    help="Private key for a remote SOURCE (else the ssh config's, the agent's).",
)
@click.option(
    "--ssh-config",
    type=click.Path(exists=True, dir_okay=False),
    help="ssh config file to read (default: $FXKIT_SSH_CONFIG, ~/.ssh/config).",
)
@click.option(
    "--accept-new-host-keys",
    is_flag=True,
    help="Accept and record the key of a remote SOURCE seen for the first time "
    "(a changed key is always refused).",
)
@click.option("--connect-timeout", type=float, default=10.0, show_default=True)
def stage(
    source: str,
    dest: str,
    jobs: int,
    chunk_size: int,
    checksum: str,
    verify: bool,
    plan_only: bool,
    as_json: bool,
    quiet: bool,
    ssh_key: str | None,
    ssh_config: str | None,
    accept_new_host_keys: bool,
    connect_timeout: float,
) -> None:
    """Copy the model directory SOURCE into DEST, verified and resumable.

    SOURCE is a local folder (an NFS mount) or [user@]host:/path (SFTP, host keys verified).
    Files are written under a temporary name, checked (size, a BLAKE3 or sha256 checksum of
    the bytes read) and renamed into place; a re-run skips what is staged and resumes what was
    cut off. One run at a time per DEST; nothing is written outside it (a link planted in it
    is replaced, never followed). Links in SOURCE are followed only to files of the model's
    folder (or of a Hugging Face snapshot's blobs): others are skipped with a warning. Exit
    code 2 on a bad source, a full destination, a checksum mismatch or another run on DEST,
    130 when interrupted.
    """
    options = ConnectOptions(
        connect_timeout=connect_timeout,
        accept_new_host_keys=accept_new_host_keys,
        ssh_config=ssh_config,
    )
    src = open_source(source, options, key_file=ssh_key, connections=jobs)
    try:
        if plan_only:
            _print_plan(plan(src, dest, verify, checksum), as_json)
            return
        with prepare(src, dest, verify, checksum) as (planned, manifest):
            _warn(planned.warnings)
            with Progress(
                TextColumn("staging"),
                BarColumn(),
                DownloadColumn(),
                TransferSpeedColumn(),
                TimeRemainingColumn(),
                console=Console(stderr=True),
                disable=quiet,
                transient=True,
            ) as bar:
                task = bar.add_task("staging", total=planned.bytes_to_copy + planned.bytes_to_check)
                stager = Stager(
                    src, manifest, jobs=jobs, chunk=chunk_size, verify=verify, checksum=checksum,
                    progress=lambda n: bar.advance(task, n),
                )  # fmt: skip
                summary = stager.run(planned)
    finally:
        src.close()
    _print_summary(summary, as_json)


def _warn(warnings: list[str]) -> None:
    for line in warnings:
        click.echo(f"warning: {line}", err=True)


def _print_plan(plan: Plan, as_json: bool) -> None:
    _warn(plan.warnings)
    report = plan.report()
    if as_json:
        click.echo(json.dumps(report.to_json()))
        return
    click.echo(
        f"{report.source} -> {report.dest}: {report.files} files; "
        f"copy {len(report.to_copy)} ({report.bytes_to_copy / 1e9:.2f} GB), "
        f"check {len(report.to_check)}, skip {report.skip}"
    )
    for path in report.to_copy:
        click.echo(f"  copy   {path}")
    for path in report.to_check:
        click.echo(f"  check  {path}")


def _print_summary(summary: Summary, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(summary.to_json()))
        return
    resumed = f", {summary.resumed} resumed" if summary.resumed else ""
    click.echo(
        f"staged {summary.source} -> {summary.dest}: {summary.copied} files copied "
        f"({summary.gb_copied:.2f} GB{resumed}), {summary.skipped} skipped "
        f"({summary.gb_skipped:.2f} GB) in {summary.seconds:.2f} s, "
        f"{summary.rate_gbps:.2f} GB/s"
    )
