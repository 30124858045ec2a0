"""Host patterns (--limit): every operator, checked against real ``ansible --list-hosts``.

More cases, with their recorded Ansible output, are in test_inventory_ansible_cases.py.
"""

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
def test_pattern_selects_what_ansible_selects_in_its_order(fleet: Inventory, pattern: str) -> None:
    # Ansible's order: pattern order, a group's hosts in group-tree order (all: bastion first,
    # from ungrouped, then storage's nvme-tgt01 and gpu02 before zeta's gpu01), not file order.
    assert [host.name for host in fleet.select(pattern)] == ANSIBLE_PATTERNS[pattern]


@pytest.mark.parametrize(
    ("pattern", "limit", "expected"),
    [
        ("all", "gpu", ["gpu02", "gpu01", "gpu03"]),  # --limit keeps the pattern's order
        ("gpu03:gpu01", "gpu:!gpu02", ["gpu03", "gpu01"]),
        ("gpu[0]", "all", ["gpu01"]),
        ("gpu", "nosuch", []),
    ],
)
def test_limit_narrows_in_pattern_order(
    fleet: Inventory, pattern: str, limit: str, expected: list[str]
) -> None:
    assert [host.name for host in fleet.select(pattern, limit)] == expected


def test_selected_hosts_carry_their_vars(fleet: Inventory) -> None:
    (gpu03,) = fleet.select("rack2")
    assert gpu03.vars["ansible_port"] == 2222


@pytest.mark.parametrize(
    "pattern", ["", " ", ",", "gpu:!", "gpu:&", "&!gpu", "gpu:~(", "gpu[3]", "gpu[-4]"]
)
def test_malformed_pattern_is_an_inventory_error(fleet: Inventory, pattern: str) -> None:
    with pytest.raises(InventoryError) as err:
        fleet.select(pattern)
    assert err.value.hint
