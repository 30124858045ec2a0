"""The Linux NVMe target (nvmet) as configfs shows it, read back into nvmetcli's config.json
structure, so that a role can compare what it asked for with what the kernel holds, key by key.

configfs (``/sys/kernel/config/nvmet``; attribute files are ``<group>_<attr>``, links are
symlinks) maps to nvmetcli's ``dump()`` (linux-nvme/nvmetcli, nvmet/nvme.py)::

    hosts/<nqn>/                      {"nqn": ..., "dhchap": {...}}    (keys left out: secrets)
    ports/<id>/addr_*, param_*        {"portid": id, "addr": {...}, "param": {...},
    ports/<id>/subsystems/<nqn> ->     "subsystems": [nqn], "ana_groups": [{"grpid", "ana"}],
    ports/<id>/ana_groups/<g>/ana_*    "referrals": [{"name", "addr"}]}
    subsystems/<nqn>/attr_*           {"nqn": ..., "attr": {...}, "allowed_hosts": [nqn],
    subsystems/<nqn>/allowed_hosts/.   "namespaces": [{"nsid", "enable", "ana_grpid",
    subsystems/<nqn>/namespaces/<n>/   "device": {"path", "nguid", "uuid"}, "resv": {...}}]}

Values are strings as the files say (stripped), except ``portid``, ``nsid``, ``grpid``,
``ana_grpid`` and ``enable``, which nvmetcli writes as numbers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from shlex import quote
from typing import Any

from fxkit.connection.base import RunResult
from fxkit.facts.base import Fact, FactError
from fxkit.facts.lab import marked, split_marked
from fxkit.facts.nvme import MISSING, missing_reason

NVMET = "/sys/kernel/config/nvmet"
#: Separates the list of directories and links from the attribute files' contents.
_FILES = "--- fxkit: nvmet files ---"
#: Attribute groups of each kind of object (nvmetcli's ``attr_groups``).
_GROUPS = {
    "host": ("dhchap",),
    "port": ("addr", "param"),
    "ana_group": ("ana",),
    "referral": ("addr",),
    "subsystem": ("attr",),
    "namespace": ("device", "ana", "resv"),
}


@dataclass(frozen=True)
class NvmetState:
    """The running target, as nvmetcli's config.json would hold it."""

    config: dict[str, Any] = field(default_factory=dict)
    #: Why configfs could not be read (not mounted, nvmet not loaded); empty when it was.
    missing: str = ""
    simulated: bool = False


class NvmetConfig(Fact[NvmetState]):
    """The nvmet configfs tree in one command: its directories and links, then every readable
    attribute file (``grep -r`` prints each with its name; DH-HMAC-CHAP keys are not read)."""

    become = True

    def command(self, root: str = NVMET) -> str:
        q = quote(root)
        return marked(
            f"if [ ! -d {q} ]; then echo '{MISSING}{root} does not exist (configfs is not "
            f"mounted or the nvmet module is not loaded)'; exit 0; fi; cd {q} && "
            "find . -mindepth 1 \\( -type d -o -type l -o \\( -type f -perm -u=r "
            "! -name 'dhchap_*key' \\) \\) "
            "-printf '%y %P\\n' && "
            f"echo '{_FILES}' && {{ grep -rsHZ --exclude='dhchap_*key' '' . ; true; }}"
        )

    def parse(self, result: RunResult, root: str = NVMET) -> NvmetState:
        lab, out = split_marked(result, "nvmet configfs")
        why = missing_reason(out)
        if why:
            return NvmetState(missing=why, simulated=lab.simulated)
        listing, sep, contents = out.partition(f"{_FILES}\n")
        if not result.ok or not sep:
            raise FactError.from_result(f"nvmet configfs at {root}", result)
        return NvmetState(read_tree(listing, contents), simulated=lab.simulated)


def read_tree(listing: str, contents: str) -> dict[str, Any]:
    """nvmetcli's config structure from ``find -printf '%y %P'`` lines and ``grep -rHZ ''``
    output (``./path\\0line`` for every line of every file)."""
    kinds: dict[str, str] = {}
    for line in listing.splitlines():
        kind, _, path = line.partition(" ")
        if kind not in ("d", "l", "f") or not path:
            raise FactError(f"nvmet configfs: cannot read the listing line {line!r}")
        kinds[path] = kind
    text: dict[str, list[str]] = {}
    for record in contents.splitlines():
        name, nul, value = record.partition("\0")
        if not nul:
            raise FactError(f"nvmet configfs: cannot read the attribute line {record!r:.80}")
        text.setdefault(name.removeprefix("./"), []).append(value)
    files = {p: "\n".join(text.get(p, [])).strip() for p, k in kinds.items() if k == "f"}
    tree = _Tree(kinds, files)
    return {
        "hosts": [tree.node("host", f"hosts/{n}", nqn=n) for n in tree.children("hosts", "d")],
        "ports": [tree.port(p) for p in tree.children("ports", "d")],
        "subsystems": [tree.subsystem(n) for n in tree.children("subsystems", "d")],
    }


@dataclass
class _Tree:
    kinds: dict[str, str]
    files: dict[str, str]

    def children(self, folder: str, kind: str) -> list[str]:
        prefix = f"{folder}/"
        return sorted(
            p[len(prefix) :]
            for p, k in self.kinds.items()
            if k == kind and p.startswith(prefix) and "/" not in p[len(prefix) :]
        )

    def node(self, kind: str, path: str, **identity: Any) -> dict[str, Any]:
        """An object's attribute groups and ``enable``, as nvmetcli's ``CFSNode.dump``."""
        out: dict[str, Any] = dict(identity)
        for group in _GROUPS[kind]:
            out[group] = {
                name[len(group) + 1 :]: self.files[f"{path}/{name}"]
                for name in self.children(path, "f")
                if name.startswith(f"{group}_")
            }
        if f"{path}/enable" in self.files:
            out["enable"] = _number(self.files[f"{path}/enable"], f"{path}/enable")
        return out

    def port(self, portid: str) -> dict[str, Any]:
        path = f"ports/{portid}"
        out = self.node("port", path, portid=_number(portid, path))
        out["subsystems"] = self.children(f"{path}/subsystems", "l")
        out["ana_groups"] = [
            self.node("ana_group", f"{path}/ana_groups/{g}", grpid=_number(g, path))
            for g in self.children(f"{path}/ana_groups", "d")
        ]
        out["referrals"] = [
            self.node("referral", f"{path}/referrals/{r}", name=r)
            for r in self.children(f"{path}/referrals", "d")
        ]
        return out

    def subsystem(self, nqn: str) -> dict[str, Any]:
        path = f"subsystems/{nqn}"
        out = self.node("subsystem", path, nqn=nqn)
        out["allowed_hosts"] = self.children(f"{path}/allowed_hosts", "l")
        out["namespaces"] = []
        for nsid in sorted(self.children(f"{path}/namespaces", "d"), key=_sort_number):
            at = f"{path}/namespaces/{nsid}"
            namespace = self.node("namespace", at, nsid=_number(nsid, at))
            if f"{at}/ana_grpid" in self.files:
                namespace["ana_grpid"] = _number(self.files[f"{at}/ana_grpid"], at)
            out["namespaces"].append(namespace)
        return out


def _number(text: str, where: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise FactError(f"nvmet configfs: {where} is {text!r}, not a number") from None


def _sort_number(text: str) -> tuple[int, str]:
    return (int(text), "") if text.isdigit() else (1 << 30, text)


# -- desired against applied ----------------------------------------------------------------------


def differences(desired: dict[str, Any], applied: dict[str, Any]) -> list[str]:
    """Where ``applied`` (read from configfs) differs from ``desired`` (a config.json), one line
    each: every key the desired config sets, compared as text, and objects that are in one and
    not the other (``nvmetcli restore`` clears what the file does not name)."""
    found: list[str] = []
    for kind, key, compare in (
        ("hosts", "nqn", _compare_keys),
        ("subsystems", "nqn", _compare_subsystem),
        ("ports", "portid", _compare_port),
    ):
        _objects(found, kind, key, desired.get(kind, []), applied.get(kind, []), compare)
    return found


Compare = Callable[[list[str], str, dict[str, Any], dict[str, Any]], None]


def _objects(
    found: list[str], where: str, key: str, want: list[Any], have: list[Any], compare: Compare
) -> None:
    wanted = {str(o[key]): o for o in want}
    seen = {str(o[key]): o for o in have}
    for name, obj in wanted.items():
        if name in seen:
            compare(found, f"{where}[{name}]", obj, seen[name])
        else:
            found.append(f"{where}[{name}]: not in configfs")
    found.extend(
        f"{where}[{name}]: in configfs, not in the config" for name in seen if name not in wanted
    )


_LISTS = ("subsystems", "allowed_hosts", "namespaces", "ana_groups", "referrals")


def _compare_keys(found: list[str], where: str, want: dict[str, Any], have: dict[str, Any]) -> None:
    """Scalars and attribute groups (one level of dicts); lists are compared by the callers."""
    for key, value in want.items():
        if key in _LISTS:
            continue
        if isinstance(value, dict):
            group = have.get(key) or {}
            for name, wanted in value.items():
                _same(found, f"{where}.{key}.{name}", wanted, group.get(name))
        else:
            _same(found, f"{where}.{key}", value, have.get(key))


def _same(found: list[str], where: str, wanted: object, seen: object) -> None:
    if seen is None:
        found.append(f"{where}: wanted {wanted!r}, configfs has none")
    elif _text(wanted) != _text(seen):
        found.append(f"{where}: wanted {wanted!r}, configfs has {seen!r}")


def _text(value: object) -> str:
    """UUIDs print in lower case; numbers and strings compare as the file's text."""
    return str(value).strip().lower()


def _compare_set(found: list[str], where: str, want: list[Any], have: list[Any]) -> None:
    wanted, seen = sorted(map(str, want)), sorted(map(str, have))
    if wanted != seen:
        found.append(f"{where}: wanted {wanted}, configfs has {seen}")


def _compare_subsystem(
    found: list[str], where: str, want: dict[str, Any], have: dict[str, Any]
) -> None:
    _compare_keys(found, where, want, have)
    hosts = f"{where}.allowed_hosts"
    _compare_set(found, hosts, want.get("allowed_hosts", []), have["allowed_hosts"])
    namespaces = f"{where}.namespaces"
    _objects(
        found, namespaces, "nsid", want.get("namespaces", []), have["namespaces"], _compare_keys
    )


def _compare_port(found: list[str], where: str, want: dict[str, Any], have: dict[str, Any]) -> None:
    _compare_keys(found, where, want, have)
    _compare_set(found, f"{where}.subsystems", want.get("subsystems", []), have["subsystems"])
    if want.get("ana_groups"):
        groups = f"{where}.ana_groups"
        _objects(found, groups, "grpid", want["ana_groups"], have["ana_groups"], _compare_keys)


# -- what backs the namespaces --------------------------------------------------------------------


class PathKinds(Fact[dict[str, str]]):
    """For each path: ``block`` (a block device), ``file`` (a regular file), ``other`` or
    ``absent`` (links followed), in one command."""

    become = True

    def command(self, *paths: str) -> str:
        words = " ".join(quote(p) for p in paths)
        return (
            f'for p in {words}; do if [ -b "$p" ]; then k=block; elif [ -f "$p" ]; then k=file; '
            'elif [ -e "$p" ]; then k=other; else k=absent; fi; printf \'%s\\n\' "$k"; done'
        )

    def parse(self, result: RunResult, *paths: str) -> dict[str, str]:
        kinds = result.stdout.split()
        if not result.ok or len(kinds) != len(paths):
            raise FactError.from_result("kinds of the backing paths", result)
        return dict(zip(paths, kinds, strict=True))
