"""The NVMe-oF fabric as the inventory declares it, checked as a whole before any host is touched
(the ``validate_all`` of roles/nvmeof_initiator and roles/nvmeof_target):

- **who writes a namespace**: a namespace (subsystem NQN + nsid) that carries a filesystem is
  written by one host only. XFS is no cluster filesystem: two hosts that mount it read-write
  corrupt it, and two hosts' mkfs race. A shared namespace names its ``owner`` (the staging host:
  it makes the filesystem and mounts it read-write); every other host mounts it read-only;
- **what targets export against what initiators expect**: every subsystem an initiator connects
  to is exported by a target of the inventory, on the transport, address and service id the
  initiator uses, to the initiator's host NQN, with as many namespaces as the initiator expects
  (and the nsid each filesystem names).

The export checks run when the inventory has targets (hosts with nvmeof_target variables); an
inventory whose targets fxkit does not manage (a storage appliance) gets the first check only.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from fxkit.engine.rolevars import FleetVars
from fxkit.errors import VarError

INITIATOR, TARGET = "nvmeof_initiator", "nvmeof_target"
ALTERNATIVES = (
    "give each host a namespace of its own (a subsystem per node, for LMCache's local_disk and "
    "the node's model copy), or share one read-only: the same owner (the staging host) on "
    "every host's entry, which makes the filesystem and mounts it read-write while the others "
    "mount it read-only (reader_opts: ro,norecovery for XFS); see docs/storage.md"
)


@dataclass(frozen=True)
class Mount:
    """One host's filesystem entry on a namespace of the fabric."""

    host: str
    var: str
    path: str
    owner: str
    v: Any

    @property
    def writes(self) -> bool:
        return self.owner == self.host


def check(fleet: FleetVars) -> None:
    """Every problem of the fabric as one error (each its own line), or nothing."""
    initiators, targets = fleet.of(INITIATOR), fleet.of(TARGET)
    problems = list(_writers(initiators))
    if targets:
        problems += _exports(initiators, targets)
    if len(problems) == 1:
        raise problems[0]
    if problems:
        raise VarError(
            f"the NVMe-oF fabric of the inventory has {len(problems)} problems (nothing was "
            "changed):\n" + "\n".join("  - " + str(p).replace("\n", "\n    ") for p in problems),
            hint="fix them in the inventory: host_vars, group_vars",
        )


def namespace(nqn: str, nsid: int) -> str:
    return f"nsid {nsid} of {nqn}"


def _mounts(initiators: Mapping[str, Any]) -> dict[tuple[str, int], list[Mount]]:
    """Filesystems on fabric namespaces (nqn + nsid), by namespace; a local device is no one
    else's."""
    found: dict[tuple[str, int], list[Mount]] = {}
    for host, v in initiators.items():
        for i, fs in enumerate(v.nvmeof_initiator_filesystems):
            if fs.nqn and fs.nsid:
                mount = Mount(
                    host, f"nvmeof_initiator_filesystems[{i}]", fs.path, fs.owner or host, v
                )
                found.setdefault((fs.nqn, fs.nsid), []).append(mount)
    return found


def _writers(initiators: Mapping[str, Any]) -> Iterator[VarError]:
    """A namespace written by more than one host, whose hosts name different owners, or owned
    by a host that does not mount it."""
    for (nqn, nsid), mounts in _mounts(initiators).items():
        what = namespace(nqn, nsid)
        writers = [m for m in mounts if m.writes]
        hosts = {m.host for m in writers}  # one host mounting it at two paths is one writer
        if len(hosts) > 1:
            second = next(m for m in writers if m.host != writers[0].host)
            who = ", ".join(f"{m.host} ({m.path})" for m in writers)
            yield second.v.wrong(
                second.var,
                f"{what} carries a filesystem that {len(hosts)} hosts would mount read-write "
                f"(and make where it is empty): {who}. XFS is not a cluster filesystem: "
                "concurrent writers corrupt it",
                ALTERNATIVES,
            )
            continue
        owners = {m.owner: m for m in mounts}
        if len(owners) > 1:
            named = ", ".join(f"{m.host} names {m.owner}" for m in mounts)
            last = list(owners.values())[-1]
            yield last.v.wrong(
                f"{last.var}.owner",
                f"the hosts that mount {what} name different owners ({named})",
                "one owner, the staging host, the same on every host's entry",
            )
            continue
        mounting = {m.host for m in mounts}
        for m in mounts:
            if m.owner not in mounting:
                yield m.v.wrong(
                    f"{m.var}.owner",
                    f"owner {m.owner} of {what} does not mount it (it is mounted by "
                    f"{', '.join(sorted(mounting))}): no host would make its filesystem",
                    "name one of the hosts that mount it (the staging host), the same on each",
                )
                break


@dataclass(frozen=True)
class _Finding:
    """One host's share of a problem; hosts with the same ``key`` make one error naming them
    all (``{who}`` in ``msg``), placed at the first one's variable."""

    key: tuple[Any, ...]
    host: str
    v: Any
    var: str
    msg: str
    hint: str


def _exports(initiators: Mapping[str, Any], targets: Mapping[str, Any]) -> Iterator[VarError]:
    groups: dict[tuple[Any, ...], list[_Finding]] = {}
    for finding in _findings(initiators, targets):
        groups.setdefault(finding.key, []).append(finding)
    for group in groups.values():
        first = group[0]
        who = ", ".join(f.host for f in group)
        yield first.v.wrong(first.var, first.msg.replace("{who}", who), first.hint)


def _findings(initiators: Mapping[str, Any], targets: Mapping[str, Any]) -> Iterator[_Finding]:
    exported = {
        sub.nqn: (host, t, sub) for host, t in targets.items() for sub in t.nvmeof_target_subsystems
    }
    listing = "; ".join(f"{exported[n][0]} exports {n}" for n in sorted(exported)) or "none"
    for host, v in initiators.items():
        for i, conn in enumerate(v.nvmeof_initiator_connections):
            var = f"nvmeof_initiator_connections[{i}]"
            if conn.nqn not in exported:
                yield _Finding(
                    ("exported", conn.nqn),
                    host,
                    v,
                    f"{var}.nqn",
                    f"{{who}} connect(s) to {conn.nqn}, which no target of the inventory "
                    f"exports ({listing})",
                    "fix the NQN, or export the subsystem in a target's nvmeof_target_subsystems",
                )
                continue
            target, t, sub = exported[conn.nqn]
            yield from _offered(host, v, var, conn, target, t)
            yield from _allowed(host, v, conn.nqn, target, sub)
            yield from _count(host, v, var, conn, target, sub)
        for i, fs in enumerate(v.nvmeof_initiator_filesystems):
            if fs.nqn in exported and fs.nsid:
                target, _, sub = exported[fs.nqn]
                nsids = sorted(ns.nsid for ns in sub.namespaces if ns.enable)
                if fs.nsid not in nsids:
                    yield _Finding(
                        ("nsid", fs.nqn, fs.nsid),
                        host,
                        v,
                        f"nvmeof_initiator_filesystems[{i}].nsid",
                        f"{{who}} put(s) a filesystem on {namespace(fs.nqn, fs.nsid)}, but "
                        f"{target} exports nsid {', '.join(map(str, nsids)) or 'none'} of it",
                        "name an nsid the target exports",
                    )


def _offered(host: str, v: Any, var: str, conn: Any, target: str, t: Any) -> Iterator[_Finding]:
    """The target listens on the connection's transport, address and service id, and offers the
    subsystem there."""
    where = (conn.transport, conn.address, conn.service_id)
    offered = [
        (p.transport, p.address, p.service_id)
        for p in t.nvmeof_target_ports
        if p.subsystems is None or conn.nqn in p.subsystems
    ]
    if where not in offered:
        shown = ", ".join(f"{tr} {a}:{s}" for tr, a, s in offered) or "no port"
        yield _Finding(
            ("offered", conn.nqn, *where),
            host,
            v,
            f"{var}.address",
            f"{{who}} connect(s) to {conn.nqn} over {conn.transport} {conn.address}:"
            f"{conn.service_id}, where {target} does not offer it (it does on: {shown})",
            "use the transport, address and service id of one of the target's nvmeof_target_ports",
        )


def _allowed(host: str, v: Any, nqn: str, target: str, sub: Any) -> Iterator[_Finding]:
    hostnqn = v.nvmeof_initiator_hostnqn
    if sub.allow_any_host or hostnqn in sub.allowed_hosts:
        return
    if not hostnqn:
        msg = f"{{who}} set(s) no host NQN, so {target} cannot allow it to connect to {nqn}"
        hint = "set nvmeof_initiator_hostnqn, and list it in the subsystem's allowed_hosts"
    else:
        msg = f"{{who}} (host NQN {hostnqn}) is not in the allowed_hosts of {nqn} on {target}"
        hint = f"add {hostnqn} to allowed_hosts of {nqn} in {target}'s nvmeof_target_subsystems"
    yield _Finding(("allowed", nqn, host), host, v, "nvmeof_initiator_hostnqn", msg, hint)


def _count(host: str, v: Any, var: str, conn: Any, target: str, sub: Any) -> Iterator[_Finding]:
    nsids = [ns.nsid for ns in sub.namespaces if ns.enable]
    wanted = conn.namespaces
    if (wanted is None and not nsids) or (wanted is not None and wanted != len(nsids)):
        shown = f"nsid {', '.join(map(str, nsids))}" if nsids else "no namespace"
        yield _Finding(
            ("count", conn.nqn, wanted),
            host,
            v,
            f"{var}.namespaces",
            f"{{who}} expect(s) {'at least 1' if wanted is None else wanted} namespace(s) of "
            f"{conn.nqn}, {target} exports {len(nsids)} ({shown})",
            f"namespaces: {len(nsids)}, or change what {target} exports",
        )
