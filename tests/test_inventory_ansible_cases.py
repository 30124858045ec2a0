"""Inventories, host patterns and errors, compared with what real ansible-core printed for them.

Source: tests/data/inventory/cases/ansible/, recorded by cases/record.py with the ansible-core
version in ansible/VERSION (2.19.14); each case is cases/CASE.json (its -i sources, hosts,
patterns and --limit pairs).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from inventory_helpers import DATA

from fxkit.errors import InventoryError
from fxkit.inventory import Inventory
from fxkit.inventory.views import as_graph, as_list

CASES = DATA / "cases"
RECORDED = CASES / "ansible"
NAMES = sorted(path.stem for path in CASES.glob("*.json"))


def spec(name: str) -> dict[str, Any]:
    return json.loads((CASES / f"{name}.json").read_text())


def load(name: str) -> Inventory:
    sources = [str(CASES / s) if (CASES / s).exists() else s for s in spec(name)["sources"]]
    return Inventory.load(sources)


def recorded(name: str, file: str) -> Any:
    return json.loads((RECORDED / name / file).read_text())


def names(inv: Inventory, pattern: str, limit: str | None = None) -> list[str] | dict[str, str]:
    try:
        return [host.name for host in inv.select(pattern, limit)]
    except InventoryError as exc:
        return {"error": exc.message}


def test_recorded_with_the_named_ansible_version() -> None:
    assert (RECORDED / "VERSION").read_text().startswith("ansible [core 2.19.14]")


@pytest.mark.parametrize("name", NAMES)
def test_list_and_graph_match_ansible_inventory(name: str) -> None:
    # Source: ansible-inventory -i SOURCE... --list / --graph
    inv = load(name)
    expected = recorded(name, "list.json")
    expected["_meta"].pop("profile")
    assert as_list(inv) == expected
    assert as_graph(inv) + "\n" == (RECORDED / name / "graph.txt").read_text()


@pytest.mark.parametrize("name", NAMES)
def test_host_vars_match_ansible_inventory_host(name: str) -> None:
    # Source: ansible-inventory -i SOURCE... --host NAME
    inv = load(name)
    for host, expected in recorded(name, "hosts.json").items():
        (selected,) = [inv.hosts[host]] if host in inv.hosts else inv.select(host)
        if selected.name not in inv.hosts:  # the implicit localhost: Ansible adds its own python
            expected.pop("ansible_python_interpreter")
        assert selected.vars == expected, host


@pytest.mark.parametrize("name", NAMES)
def test_patterns_select_what_ansible_lists_in_its_order(name: str) -> None:
    # Source: ansible PATTERN -i SOURCE... --list-hosts (the hosts it printed, in order), each
    # pattern in a fresh ansible process: so a fresh inventory here (the implicit localhost
    # takes the name of the first pattern that asks for it).
    set_order = spec(name).get("set_order", [])
    refused = spec(name).get("refused", [])
    for pattern, expected in recorded(name, "patterns.json").items():
        got = names(load(name), pattern)
        if isinstance(expected, dict):  # Ansible refused the pattern: so does fxkit
            assert isinstance(got, dict), (pattern, expected, got)
        elif pattern in refused:
            # Ansible's inventory raises for a subscript past the end or a bad regex, which
            # `ansible --list-hosts` prints as "hosts (0)" (ansible-playbook fails the play);
            # it reads an empty pattern (or term) as all hosts, or as no name. fxkit refuses.
            assert isinstance(got, dict) and expected in ([], names(load(name), "all")), pattern
        elif pattern in set_order:
            # Where two groups at the same depth below the pattern's group both have child
            # groups, Ansible takes those children in the order a Python set of Group objects
            # iterates (their memory addresses); fxkit takes them in their parents' order.
            # The same hosts, or as many where a subscript picks from that order.
            assert len(got) == len(expected), pattern
            assert "[" in pattern or sorted(got) == sorted(expected), pattern
        else:
            assert got == expected, pattern


@pytest.mark.parametrize("name", NAMES)
def test_limit_narrows_as_ansible_does(name: str) -> None:
    # Source: ansible PATTERN -i SOURCE... --limit LIMIT --list-hosts
    inv = load(name)
    for pattern, limit, expected in recorded(name, "limits.json"):
        assert names(inv, pattern, limit) == expected, (pattern, limit)


ERRORS = {
    # file: (line, fxkit's message, what Ansible said in ansible/errors/FILE.txt)
    "undefined_child.ini": (3, "names group 'db', which is never defined", "undefined group 'db'"),
    "child_only_vars.ini": (2, "names group 'c', which is never defined", "undefined group 'c'"),
    "vars_undefined.ini": (3, "[gpo:vars] is for a group that is never defined", "[gpo:vars]"),
    "uneven_width.ini": (2, "begin and end must have the same width", "equal-length"),
    "uneven_width.yml": (3, "begin and end must have the same width", "equal-length"),
    "no_end.ini": (2, "range [1:] has no end", "must specify end value"),
    "mixed.ini": (2, "needs two numbers or two letters", "invalid literal for int()"),
    "letters_backwards.ini": (2, "runs backwards", "must have begin <= end"),
    "ipv6_no_port.ini": (2, "cannot parse section header", "Invalid section entry"),
    "ipv6_no_port.yml": (3, "is not a range", "must be begin:end or begin:end:step"),
    "ends_colon.ini": (2, "ends in ':' without a port", "ending in ':' is not allowed"),
    "cycle.ini": (4, "'a' is its own ancestor", "recursive dependency loop"),
}


@pytest.mark.parametrize("file", sorted(ERRORS))
def test_refused_as_ansible_refuses_with_file_line_and_hint(file: str) -> None:
    line, message, ansible_said = ERRORS[file]
    assert ansible_said in (RECORDED / "errors" / f"{file}.txt").read_text()
    path = CASES / "errors" / file
    with pytest.raises(InventoryError) as err:
        Inventory.load(path)
    assert str(err.value).startswith(f"{path}:{line}: "), str(err.value)
    assert message in err.value.message and err.value.hint


def test_a_backwards_numeric_range_is_refused_where_ansible_reads_no_hosts() -> None:
    # Ansible read web[3:1] as no host at all, silently (ansible/errors/backwards.ini.txt);
    # fxkit refuses it, as a host list that is quietly empty is never what was meant.
    assert (RECORDED / "errors" / "backwards.ini.txt").read_text() == "rc=0\n"
    with pytest.raises(InventoryError, match=r"runs backwards") as err:
        Inventory.load(CASES / "errors" / "backwards.ini")
    assert err.value.where == f"{CASES / 'errors' / 'backwards.ini'}:2"
