"""``fxkit lab``: a fleet of real SSH hosts on this machine (see :mod:`fxkit.lab`)."""

from __future__ import annotations

import time

import click
from rich.console import Console
from rich.table import Table

from fxkit.cli.loader import Size
from fxkit.lab import DEFAULT_DIR, DIR_ENV, PORT_ENV, PREFIX_ENV, Fleet
from fxkit.lab import profile as profiles
from fxkit.lab.like import up_like
from fxkit.lab.resources import MIN_MEMORY, MIN_PIDS, GiB, Limits

console = Console()

dir_option = click.option(
    "--dir", "state_dir", envvar=DIR_ENV, default=DEFAULT_DIR, show_default=True,
    type=click.Path(file_okay=False), help=f"The fleet's state directory (or ${DIR_ENV}).",
)  # fmt: skip
prefix_option = click.option(
    "--prefix", envvar=PREFIX_ENV, default=None,
    help=f"Addresses PREFIX.1, PREFIX.2, ... in 127/8 (or ${PREFIX_ENV}); default 127.77.0.",
)  # fmt: skip
port_option = click.option(
    "--port",
    envvar=PORT_ENV,
    default=None,
    type=int,
    help=f"sshd port (or ${PORT_ENV}); default 22.",
)


@click.group()
def lab() -> None:
    """Real, isolated SSH hosts on this machine, to try playbooks without hardware (needs root)."""


def _known_profiles(values: tuple[str, ...]) -> tuple[str, ...]:
    for value in values:
        name = value.rpartition("=")[2]
        if name not in profiles.names():
            raise click.BadParameter(
                f"there is no lab profile {name!r}; use one of: {', '.join(profiles.names())}",
                param_hint="--profile",
            )
    return values


#: ``lab up --help``'s list of the profiles (a paragraph click leaves as it is: ``\b``).
PROFILES_EPILOG = (
    "\b\nProfiles (--profile; a variant NAME-FAULT is --fault HOST=FAULT):\n"
    + "\n".join(f"  {name}" for name in profiles.names())
)


@lab.command(epilog=PROFILES_EPILOG)
@click.argument("count", type=click.IntRange(1, 254), required=False)
@dir_option
@prefix_option
@port_option
@click.option("--timeout", default=60.0, show_default=True, help="Seconds to wait for logins.")
@click.option(
    "--like",
    "like",
    metavar="INVENTORY",
    multiple=True,
    help="One host per host of INVENTORY (repeatable, as -i), with its names and groups, each "
    "with the profile its groups ask for; writes an overlay inventory to give after it.",
)
@click.option("-l", "--limit", metavar="PATTERN", help="With --like: only hosts matching PATTERN.")
@click.option(
    "--profile",
    "profile_options",
    multiple=True,
    metavar="[GROUP=]PROFILE",
    callback=lambda ctx, param, values: _known_profiles(values),
    help="Simulated hardware (test doubles, see docs/lab.md): PROFILE on every host; with --like "
    "also GROUP=PROFILE (repeatable). The profiles are listed below.",
)
@click.option(
    "--fault",
    "fault_options",
    multiple=True,
    metavar="HOST=FAULT",
    help="With --like: a fault variant of the host's profile (gpu02=gpu-link-x8), repeatable.",
)
@click.option(
    "--memory",
    type=Size(),
    default=None,
    help="Memory of each host: its processes and what it writes in its tmpfs mounts, each of "
    "which holds half of it (e.g. 8GiB; default 6GiB, or the fleet's).",
)
@click.option(
    "--pids",
    type=click.IntRange(min=MIN_PIDS),
    default=None,
    help="Processes and threads of each host (default 2000, or the fleet's).",
)
def up(
    count: int | None,
    state_dir: str,
    prefix: str | None,
    port: int | None,
    timeout: float,
    like: tuple[str, ...],
    limit: str | None,
    profile_options: tuple[str, ...],
    fault_options: tuple[str, ...],
    memory: int | None,
    pids: int | None,
) -> None:
    """Start COUNT hosts lab01..labNN, or with --like INVENTORY one host per inventory host
    (idempotent: running hosts are kept)."""
    if memory is not None and memory < MIN_MEMORY:
        raise click.BadParameter(
            f"a host needs {MIN_MEMORY >> 20} MiB at least", param_hint="--memory"
        )
    if (count is None) == (not like):
        raise click.UsageError("give COUNT or --like INVENTORY (one of them)")
    if not like and (limit or fault_options or len(profile_options) > 1 or
                     any("=" in p for p in profile_options)):  # fmt: skip
        raise click.UsageError("--limit, --fault and --profile GROUP=PROFILE go with --like")
    fleet = Fleet(state_dir, prefix, port)
    limits = None
    if memory is not None or pids is not None:
        limits = Limits(memory or fleet.limits.memory, pids or fleet.limits.pids)
    started = time.monotonic()
    if like:
        new = up_like(fleet, like, limit, profile_options, fault_options, timeout, limits)
    else:
        profile = profile_options[0] if profile_options else None
        new = fleet.up(count or 0, timeout=timeout, profile=profile, limits=limits)
    seconds = time.monotonic() - started
    running = sum(status.pid is not None for status in fleet.status())
    console.print(
        f"{len(new)} host(s) started, {running} running on {fleet.prefix}.x port {fleet.port} "
        f"({seconds:.1f} s); every host accepts logins"
    )
    if fleet.profile:
        console.print(f"profile:     {fleet.profile} (simulated hardware: test doubles)")
    if fleet.without_cgroups:
        console.print(f"[yellow]limits:      none but tmpfs sizes: {fleet.without_cgroups}[/]")
    else:
        console.print(f"limits:      {fleet.limits} a host (cgroups)")
    console.print(f"tmpfs:       {fleet.limits.tmpfs / GiB:.1f} GiB each (/tmp, /run, /dev/shm...)")
    console.print(f"inventory:   {fleet.inventory}")
    console.print(f"known_hosts: {fleet.known_hosts}")
    console.print(f"client key:  {fleet.client_key}")
    if fleet.become_password():
        console.print(f"sudo user:   fxkit, password in {fleet.become_password_file}")
    if like:
        sources = " ".join(f"-i {source}" for source in like)
        console.print(f"try:         fxkit play site {sources} -i {fleet.inventory}")
        console.print(
            "             (`fxkit lab status` lists the hosts, their groups and profiles)"
        )
    else:
        console.print(f"try:         fxkit play PLAYBOOK -i {fleet.inventory}")


@lab.command()
@dir_option
def status(state_dir: str) -> None:
    """Show the fleet's hosts: address, groups (a fleet shaped like an inventory), profile and
    fault, PID, up or down, memory (its processes' PSS), what its cgroup counts (memory, with what
    it holds in tmpfs; processes) and the limits."""
    fleet = Fleet(state_dir)
    # A fleet shaped like an inventory shows each host's groups, profile and fault; a fleet of
    # one profile, its profile in the caption.
    shaped = ("groups", "profile", "fault") if fleet.like else ()
    table = Table()
    for title in ("host", "address", *shaped, "pid", "state", "memory", "cgroup", "processes"):
        table.add_column(title, overflow="fold")
    table.caption = f"limits: {fleet.limits} a host"
    if fleet.profile:
        table.caption += f"; profile {fleet.profile}"
    if fleet.like:
        table.title = f"shaped like {fleet.like}"
    for host in fleet.status():
        state = "[green]up[/]" if host.up else "[red]down[/]"
        memory = f"{host.memory_bytes / 2**20:.1f} MiB" if host.pid else "-"
        charged = f"{host.used['memory'] / 2**20:.1f} MiB" if "memory" in host.used else "-"
        info = fleet.hosts.get(host.name, {})
        columns = {
            "groups": ", ".join(info.get("groups") or ["-"]),
            "profile": fleet.profile_of(host.name) or "plain",
            "fault": info.get("fault") or "-",
        }
        table.add_row(
            host.name, f"{host.address}:{host.port}", *(columns[c] for c in shaped),
            str(host.pid or "-"), state, memory, charged, str(host.used.get("pids", "-")),
        )  # fmt: skip
    if not table.rows:
        console.print(f"no lab fleet in {fleet.dir}")
        return
    console.print(table)


@lab.command()
@dir_option
def down(state_dir: str) -> None:
    """Stop the fleet's hosts (only the processes it started) and remove its state."""
    fleet = Fleet(state_dir)
    stopped = fleet.down()
    console.print(f"{len(stopped)} host(s) stopped; {fleet.dir} cleaned up")
