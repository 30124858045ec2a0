"""``fxkit demo`` (``make demo``): fxkit's jobs on one machine, with real numbers.

1. lab hosts shaped like the example inventory (``fxkit lab up --like inventory/mi308x.yml``:
   two GPU nodes, one with an injected fault, and both storage targets; idempotent);
2. site.yml with the inventory and the lab's overlay, in check mode with diffs, then converged,
   then run again: the second run must change nothing, and the line saying so comes from that
   run's results;
3. the storage check: the storage playbook with every GPU node mounting one NVMe-oF namespace
   read-write is refused before any host is touched (docs/storage.md);
4. G1's health stage (gates/g1.yml) on the GPU nodes: the healthy node passes, the faulty one
   fails the checks of its fault, each named with its reason and source; the HTML report's path
   and the command that opens it;
5. the rollout (fxkit.cli.demo_rollout): a small model in the lab's NFS stand-in, staged onto
   each GPU node with ``fxkit stage``, and the example's instances brought up with
   ``fxkit rollout --canary``, serve-probe in vLLM's place, from a wheelhouse made of what is
   installed here; one instance asked for a completion;
6. a synthetic checkpoint (cached), loaded by sequential ``safetensors.torch.load_file`` (what a
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
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import click
import yaml
from rich.console import Console
from rich.text import Text

from fxkit.cli.demo_rollout import rollout_demo
from fxkit.cli.lab import dir_option, port_option, prefix_option
from fxkit.cli.loader import Size
from fxkit.connection import ConnectOptions
from fxkit.engine.console import console_recorder
from fxkit.engine.record import Outcome, PlaybookResult
from fxkit.engine.runner import RunOptions, run_playbook
from fxkit.errors import VarError
from fxkit.lab import DEFAULT_DIR, Fleet, LabError, check_requirements
from fxkit.lab.like import up_like
from fxkit.paths import builtin

console = Console(highlight=False, soft_wrap=True)
CACHE = ".cache/demo-ckpt"
STAMP = "fxkit-demo.json"
GATE_REPORTS = Path(".cache/demo-g1")
#: The lab hosts the demo rehearses: two GPU nodes and both storage targets of the example.
LIMIT = "gpu01:gpu02:nvme-tgt01:nvme-tgt02"
FAULT = "gpu02=gpu-link-x8"
#: What a site sets for G1's health stage, here the lab's simulated node's figures (its
#: profile: fxkit/lab/profiles/mi308x): memory online, idle power and clock.
GATE_SITE = {
    "g1_memory_online_min_gib": 2048,
    "g1_idle_power_max_w": 300,
    "g1_idle_gfx_clock_max_mhz": 200,
}
#: What only a real node shows: the lab's kernel is this machine's and never reboots into the
#: arguments rocm_host wrote, and its /proc/sys is this machine's.
KERNEL_CHECKS = ("kernel_cmdline", "kernel_args_amd", "sysctl")
#: The old example layout, on the lab hosts: each would mount one namespace read-write.
MODELS = "nqn.2026-01.io.fxkit:models"
SHARED_RW = {
    "nvmeof_initiator_connections": [
        {"nqn": MODELS, "transport": "rdma", "address": "192.168.100.21", "namespaces": 1}
    ],
    "nvmeof_initiator_filesystems": [{"nqn": MODELS, "nsid": 1, "path": "/mnt/models"}],
}


@click.command()
@click.option(
    "--like",
    "inventory",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="The inventory the lab hosts are shaped like [the example: inventory/mi308x.yml].",
)
@click.option("--limit", default=LIMIT, show_default=True, help="Its hosts the lab brings up.")
@click.option(
    "--fault",
    "faults",
    multiple=True,
    default=[FAULT],
    show_default=True,
    help="HOST=FAULT: a host's fault variant (repeatable; see `fxkit lab up --help`).",
)
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
    inventory: Path | None,
    limit: str,
    faults: tuple[str, ...],
    size: int,
    cache: Path,
    threads: int | None,
    down: bool,
    state_dir: str,
    prefix: str | None,
    port: int | None,
) -> None:
    """Rehearse the example site on lab hosts shaped like it (check, converge, idempotent
    re-run, the storage check, G1 passing a healthy node and failing a faulty one), then load a
    checkpoint fast.

    Needs root and openssh-server for the fleet, and fxkit's loader extra (torch, safetensors).
    """
    try:
        check_requirements()
    except LabError as exc:
        raise LabError(f"the demo's lab fleet cannot start: {exc.message}", hint=exc.hint) from None
    loader = loader_api()
    source = inventory or builtin("inventories") / "mi308x.yml"
    fleet = Fleet(state_dir, prefix, port)
    step(1, f"lab hosts shaped like {source} ({limit}; fault {', '.join(faults) or 'none'})")
    started = time.monotonic()
    new = up_like(fleet, [str(source)], limit, fault_options=faults)
    console.print(
        f"{len(new)} host(s) started, {len(fleet.hosts)} up on {fleet.prefix}.x in "
        f"{time.monotonic() - started:.1f} s; overlay {fleet.inventory}"
    )
    for name in fleet.hosts:
        groups = ", ".join(fleet.hosts[name].get("groups") or [])
        console.print(f"  {name}: {groups}; {fleet.profile_of(name) or 'plain'}")
    sources = [source, fleet.inventory]
    limit = ":".join(fleet.hosts)

    step(2, f"playbooks/site.yml -i {source} -i {fleet.inventory}, check mode with diffs")
    play(fleet, sources, limit, check=True, diff=True)
    step(3, "converge")
    first = play(fleet, sources, limit)
    step(4, "run again: nothing left to change")
    second = play(fleet, sources, limit)
    changed = second.counts.changed
    finished = second.hosts_with(Outcome.OK)
    idempotent = changed == 0 and second.exit_code == 0 and len(finished) == len(fleet.hosts)
    console.print(
        f"second run: {changed} changed on {len(finished)} hosts in {second.duration_s:.1f} s",
        style="bold green" if idempotent else "bold red",
    )

    nodes = [n for n in fleet.hosts if "gpu_nodes" in (fleet.hosts[n].get("groups") or [])]
    step(5, "the storage check: one namespace that every GPU node would mount read-write")
    refused = storage_demo(fleet, nodes)

    step(6, "G1 arrival acceptance, health stage (gates/g1.yml), on the GPU nodes")
    judged = gate_demo(fleet, sources, nodes)

    step(7, "rollout: the model staged from the lab's NFS, serve-probe for vLLM, canary first")
    served = rollout_demo(console, fleet, sources, nodes, partial(checkpoint, make=loader.make))

    step(8, "loader: a synthetic checkpoint, every byte loaded, against the plain baseline")
    load_demo(loader, cache, size, threads)

    step(9, "done")
    if down:
        stopped = fleet.down()
        console.print(f"fleet stopped ({len(stopped)} hosts), {fleet.dir} removed")
    else:
        where = "" if Path(state_dir) == Path(DEFAULT_DIR) else f" --dir {state_dir}"
        console.print(
            f"the fleet is still up (`fxkit lab status{where}`); try "
            f"`fxkit play site -i {source} -i {fleet.inventory} --limit '{limit}' --check "
            f"--diff`; stop it with `fxkit lab down{where}`"
        )
    if first.exit_code or not idempotent or not refused or not judged or not served:
        sys.exit(1)


def step(number: int, title: str) -> None:
    console.rule(f"[bold]{number}. {title}", align="left")


def play(
    fleet: Fleet, sources: list[Path], limit: str, check: bool = False, diff: bool = False
) -> PlaybookResult:
    """Run the built-in site playbook on the fleet (the recap printed); its results."""
    options = RunOptions(
        check=check,
        diff=diff,
        limit=limit,
        connect=ConnectOptions(known_hosts=str(fleet.known_hosts)),
    )
    return run_playbook("site", sources, options, console_recorder(console, diff=diff))


def storage_demo(fleet: Fleet, nodes: list[str]) -> bool:
    """playbooks/storage.yml with the GPU nodes each mounting one namespace read-write:
    refused before any host is touched. False when it was not."""
    if len(nodes) < 2:
        console.print("one GPU node: no namespace to share (two or more show it)")
        return True
    layout = {
        "all": {"children": {"gpu_nodes": {"hosts": dict.fromkeys(nodes), "vars": SHARED_RW}}}
    }
    options = RunOptions(
        check=True,
        limit=":".join(nodes),
        connect=ConnectOptions(known_hosts=str(fleet.known_hosts)),
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


def gate_demo(fleet: Fleet, sources: list[Path], nodes: list[str]) -> bool:
    """G1's health stage on the GPU nodes, the site's figures the lab's: each node's verdict;
    what did not pass, with its reason and source; the report. True when every healthy node
    passes and every faulty one fails (the kernel checks a lab cannot show set aside)."""
    from fxkit.gate.report import write_reports
    from fxkit.gate.run import GateOptions, GateRun
    from fxkit.gate.verdicts import CheckStatus

    options = GateOptions(
        limit=":".join(nodes),
        connect=ConnectOptions(known_hosts=str(fleet.known_hosts)),
        extra_vars=GATE_SITE,
        stages=["health"],
    )
    runner = GateRun.load("g1", sources, options)
    result = runner.run()
    console.print(
        f"(the lab's kernel is this machine's and never reboots: {', '.join(KERNEL_CHECKS)} "
        "show what only a real node can)",
        style="dim",
    )
    judged = True
    for name, host in result.hosts.items():
        wrong = [
            c for c in host.checks
            if c.status not in (CheckStatus.PASS, CheckStatus.SKIP) and c.id not in KERNEL_CHECKS
        ]  # fmt: skip
        faulty = bool(fleet.hosts[name].get("fault"))
        verdict = "FAIL" if wrong else "PASS"
        console.print(
            f"{name}: {verdict} ({len(host.checks)} checks; fault: "
            f"{fleet.hosts[name].get('fault') or 'none'})",
            style="bold red" if wrong else "bold green",
        )
        for check in wrong:
            console.print(Text(f"  {check.status} {check.id}: {check.reason}"))
            console.print(Text(f"      source: {check.source}", style="dim"))
        judged &= bool(wrong) == faulty
    written = write_reports(result, GATE_REPORTS, runner.secrets)
    html = written.get("html") or next(iter(written.values()))
    console.print(f"reports: {', '.join(str(p) for p in written.values())}")
    console.print(f"open it: python3 -m webbrowser -t file://{Path(html).resolve()}")
    return judged


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
