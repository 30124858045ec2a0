"""``fxkit demo`` (``make demo``): both halves of fxkit on one machine, with real numbers.

1. a lab fleet of real SSH hosts (``fxkit lab up``; idempotent);
2. the example playbook in check mode with diffs, then converged, then run again: the second run
   must change nothing, and the line saying so comes from that run's results;
3. the storage check: the storage playbook with every lab host mounting one NVMe-oF namespace
   read-write is refused before any host is touched (docs/storage.md);
4. G1 arrival acceptance (gates/g1.yml) on the lab hosts, reports in ``.cache/demo-g1``: fio
   really reads each host's disk; lab hosts have no GPU or RDMA device, so those checks are ERROR
   (by design: never PASS without a measurement);
5. a synthetic checkpoint (cached), loaded by sequential ``safetensors.torch.load_file`` (what a
   plain loader does, e.g. from NFS) and by ``fxkit.loader.load``; every byte of every tensor is
   read in both, from a cold page cache, and compared.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import click
import yaml
from rich.console import Console
from rich.text import Text

from fxkit.cli.lab import dir_option, port_option, prefix_option
from fxkit.cli.loader import Size
from fxkit.connection import ConnectOptions
from fxkit.engine.console import console_recorder
from fxkit.engine.record import Outcome, PlaybookResult
from fxkit.engine.runner import RunOptions, run_playbook
from fxkit.errors import VarError
from fxkit.lab import DEFAULT_DIR, Fleet, LabError, check_requirements
from fxkit.lab.fleet import host_name

console = Console(highlight=False, soft_wrap=True)
CACHE = ".cache/demo-ckpt"
STAMP = "fxkit-demo.json"
GATE_REPORTS = Path(".cache/demo-g1")
#: G1's storage check on the lab hosts: a short fio run (the thresholds stay G1's own).
GATE_VARS = {"g1_fio_size": "256M", "g1_fio_runtime": 3}
#: The old example layout, on the lab hosts: each would mount one namespace read-write.
MODELS = "nqn.2026-01.io.fxkit:models"
SHARED_RW = {
    "nvmeof_initiator_connections": [
        {"nqn": MODELS, "transport": "rdma", "address": "192.168.100.21", "namespaces": 1}
    ],
    "nvmeof_initiator_filesystems": [{"nqn": MODELS, "nsid": 1, "path": "/mnt/models"}],
}


@click.command()
@click.option("--hosts", type=click.IntRange(1, 254), default=4, show_default=True)
@click.option(
    "--size",
    type=Size(),
    default="1GB",
    show_default=True,
    help="Checkpoint size (e.g. 64MB, 2GB).",
)
@click.option(
    "--cache",
    type=click.Path(file_okay=False, path_type=Path),
    default=CACHE,
    show_default=True,
    help="Where the checkpoint is kept (reused while --size stays the same).",
)
@click.option("--threads", type=click.IntRange(min=1), help="Loader threads [loader's default].")
@click.option("--down", is_flag=True, help="Stop the fleet at the end.")
@dir_option
@prefix_option
@port_option
def demo(
    hosts: int,
    size: int,
    cache: Path,
    threads: int | None,
    down: bool,
    state_dir: str,
    prefix: str | None,
    port: int | None,
) -> None:
    """Provision a lab fleet (check, converge, idempotent re-run), then load a checkpoint fast.

    Needs root and openssh-server for the fleet, and fxkit's loader extra (torch, safetensors).
    """
    try:
        check_requirements()
    except LabError as exc:
        raise LabError(f"the demo's lab fleet cannot start: {exc.message}", hint=exc.hint) from None
    loader = loader_api()
    fleet = Fleet(state_dir, prefix, port)
    step(1, f"lab fleet of {hosts} hosts")
    started = time.monotonic()
    new = fleet.up(hosts)
    console.print(
        f"{len(new)} host(s) started, {hosts} up on {fleet.prefix}.x in "
        f"{time.monotonic() - started:.1f} s; inventory {fleet.inventory}"
    )

    step(2, "playbooks/site.yml in check mode, with diffs: what would change")
    # Only lab01..labNN: a fleet started bigger earlier keeps its other hosts out of the demo.
    limit = ":".join(host_name(i) for i in range(1, hosts + 1))
    play(fleet, limit, check=True, diff=True)
    step(3, "converge")
    first = play(fleet, limit)
    step(4, "run again: nothing left to change")
    second = play(fleet, limit)
    changed = second.counts.changed
    finished = second.hosts_with(Outcome.OK)
    idempotent = changed == 0 and second.exit_code == 0 and len(finished) == hosts
    console.print(
        f"second run: {changed} changed on {len(finished)} hosts in {second.duration_s:.1f} s",
        style="bold green" if idempotent else "bold red",
    )

    step(5, "the storage check: one namespace that every host would mount read-write")
    refused = storage_demo(fleet, limit, hosts)

    step(6, "G1 arrival acceptance (gates/g1.yml) on the lab hosts")
    gate_demo(fleet, limit)

    step(7, "loader: a synthetic checkpoint, every byte loaded, against the plain baseline")
    load_demo(loader, cache, size, threads)

    step(8, "done")
    if down:
        stopped = fleet.down()
        console.print(f"fleet stopped ({len(stopped)} hosts), {fleet.dir} removed")
    else:
        where = "" if Path(state_dir) == Path(DEFAULT_DIR) else f" --dir {state_dir}"
        console.print(
            f"the fleet is still up (`fxkit lab status{where}`); try "
            f"`fxkit play site -i {fleet.inventory} --check --diff`; stop it with "
            f"`fxkit lab down{where}`"
        )
    if first.exit_code or not idempotent or not refused:
        sys.exit(1)


def step(number: int, title: str) -> None:
    console.rule(f"[bold]{number}. {title}", align="left")


def play(fleet: Fleet, limit: str, check: bool = False, diff: bool = False) -> PlaybookResult:
    """Run the built-in site playbook on the fleet (the recap printed); its results."""
    options = RunOptions(
        check=check,
        diff=diff,
        limit=limit,
        connect=ConnectOptions(known_hosts=str(fleet.known_hosts)),
    )
    return run_playbook("site", fleet.inventory, options, console_recorder(console, diff=diff))


def storage_demo(fleet: Fleet, limit: str, hosts: int) -> bool:
    """playbooks/storage.yml with the lab hosts as GPU nodes that would each mount one
    namespace read-write: refused before any host is touched. False when it was not."""
    if hosts < 2:
        console.print("one lab host: no namespace to share (--hosts 2 or more shows it)")
        return True
    nodes = {host_name(i): None for i in range(1, hosts + 1)}
    layout = {"all": {"children": {"gpu_nodes": {"hosts": nodes, "vars": SHARED_RW}}}}
    options = RunOptions(
        check=True, limit=limit, connect=ConnectOptions(known_hosts=str(fleet.known_hosts))
    )
    try:
        with tempfile.TemporaryDirectory(prefix="fxkit-demo-") as folder:
            shared = Path(folder) / "shared-rw.yml"
            shared.write_text(yaml.safe_dump(layout))
            run_playbook("storage", [fleet.inventory, shared], options, console_recorder(console))
    except VarError as exc:
        console.print(Text(str(exc), style="dim"))
        console.print("refused before any host was touched", style="bold green")
        return True
    console.print("the shared read-write namespace was NOT refused", style="bold red")
    return False


# -- the loader -----------------------------------------------------------------------------


def gate_demo(fleet: Fleet, limit: str) -> None:
    """G1 on the fleet's hosts: each host's verdict and counts, the reasons of its ERRORs, the
    report files. Lab hosts have no GPU or RDMA: G1 cannot pass there, and says why."""
    from fxkit.gate.report import write_reports
    from fxkit.gate.run import GateOptions, GateRun
    from fxkit.gate.spec import load as load_gate
    from fxkit.gate.verdicts import CheckStatus

    options = GateOptions(
        limit=limit,
        connect=ConnectOptions(known_hosts=str(fleet.known_hosts)),
        extra_vars=GATE_VARS,
    )
    g1 = load_gate("g1")  # on the lab hosts: G1's own hosts are an inventory's gpu_nodes
    runner = GateRun.load(
        replace(g1, spec=g1.spec.model_copy(update={"hosts": "lab"})), fleet.inventory, options
    )
    result = runner.run()
    for name, host in result.hosts.items():
        counts = ", ".join(f"{n} {s}" for s, n in result.summary_of(name).items() if n)
        console.print(f"{name}: {host.verdict} ({counts})")
    first = next(iter(result.hosts.values()))
    for check in first.checks:
        if check.status in (CheckStatus.ERROR, CheckStatus.FAIL):
            console.print(Text(f"  {check.status} {check.id}: {check.reason}", style="dim"))
    written = write_reports(result, GATE_REPORTS, runner.secrets)
    console.print(f"reports: {', '.join(str(p) for p in written.values())}")


def loader_api() -> SimpleNamespace:
    """fxkit's loader and its benchmark, or a clear error saying what is missing."""
    try:
        from fxkit.loadbench import bench
        from fxkit.loader import make_checkpoint
    except ImportError as exc:
        raise click.ClickException(
            f"the demo's loader step needs fxkit's loader and its extra ({exc}); "
            "install them with: pip install -e '.[loader]' (or run `make demo`)"
        ) from None
    return SimpleNamespace(harness=bench, make=make_checkpoint)


def load_demo(loader: SimpleNamespace, cache: Path, size: int, threads: int | None) -> None:
    """One cold round of ``fxkit bench load``: the plain baseline against fxkit.loader."""
    files = checkpoint(cache, size, loader.make)
    total = sum(f.stat().st_size for f in files)
    console.print(f"checkpoint: {len(files)} file(s), {total / 1e9:.2f} GB in {cache}")
    report = loader.harness.bench(
        cache,
        methods=("baseline", "fxkit"),
        runs=1,
        fxkit_options={"threads": threads} if threads else {},
    )
    loader.harness.render(report, console)
    baseline, fxkit = report.summary("baseline"), report.summary("fxkit")
    if baseline.errors or fxkit.errors or not fxkit.checksum_ok:
        raise click.ClickException(
            f"the loader step failed: {'; '.join(baseline.errors + fxkit.errors) or 'other bytes'}"
        )
    tensors = next(r.tensors for r in report.runs if r.method == "fxkit")
    console.print(
        f"same {tensors} tensors, byte for byte; speed-up: {fxkit.vs_baseline:.1f}x",
        style="bold green",
    )


def checkpoint(cache: Path, size: int, make: Callable[..., Any]) -> list[Path]:
    """The cached checkpoint's files; made (again) when missing or of another size."""
    stamp = cache / STAMP
    try:
        ready = json.loads(stamp.read_text()).get("size_bytes") == size
    except (OSError, ValueError):
        ready = False
    if not ready:
        if stamp.exists():  # a checkpoint of another size that this demo made
            shutil.rmtree(cache)
        started = time.perf_counter()
        make(cache, size)
        stamp.write_text(json.dumps({"size_bytes": size}) + "\n")
        console.print(f"generated in {time.perf_counter() - started:.1f} s")
    return sorted(cache.glob("*.safetensors"))
