"""Host patterns (--limit): every operator, checked against real ``ansible --list-hosts``."""

from __future__ import annotations

import json

import pytest
from inventory_helpers import ANSIBLE, FLEET

from fxkit.errors import InventoryError
from fxkit.inventory import Inventory

# Source: `ansible PATTERN -i fleet.yml --list-hosts` (ansible-core 2.19.14), see ansible/README.md
ANSIBLE_PATTERNS: dict[str, list[str]] = json.loads((ANSIBLE / "patterns.json").read_text())


@pytest.fixture(scope="module")
def fleet() -> Inventory:
    return Inventory.load(FLEET / "fleet.yml")


@pytest.mark.parametrize("pattern", list(ANSIBLE_PATTERNS))
def test_pattern_selects_what_ansible_selects(fleet: Inventory, pattern: str) -> None:
    names = [host.name for host in fleet.select(pattern)]
    assert sorted(names) == sorted(ANSIBLE_PATTERNS[pattern])
    order = list(fleet.hosts)
    assert names == sorted(names, key=order.index), "result is in inventory order"


@pytest.mark.parametrize(
    ("pattern", "expected"),
    [
        ("gpu01:gpu03,nvme-tgt01", ["gpu01", "gpu03", "nvme-tgt01"]),  # ':' and ',' both unite
        ("gpu0?", ["gpu01", "gpu02", "gpu03"]),
        ("gpu0[13]", ["gpu01", "gpu03"]),  # a glob character class keeps its brackets
        ("~(gpu|nvme)-?t?g?t?0[13]", ["gpu01", "gpu03", "nvme-tgt01"]),
        ("gpu:!rack1:!gpu03", []),
        (" gpu : & storage ", ["gpu02"]),
        ("storage,", ["gpu02", "nvme-tgt01"]),  # a trailing separator is ignored
        ("nosuch:gpu03", ["gpu03"]),
    ],
)
def test_more_patterns(fleet: Inventory, pattern: str, expected: list[str]) -> None:
    assert [host.name for host in fleet.select(pattern)] == expected


def test_selected_hosts_carry_their_vars(fleet: Inventory) -> None:
    (gpu03,) = fleet.select("rack2")
    assert gpu03.vars["ansible_port"] == 2222


@pytest.mark.parametrize("pattern", ["", " ", ",", "gpu:!", "gpu:&", "&!gpu", "~gpu[", "gpu:~("])
def test_malformed_pattern_is_an_inventory_error(fleet: Inventory, pattern: str) -> None:
    with pytest.raises(InventoryError) as err:
        fleet.select(pattern)
    assert err.value.hint
