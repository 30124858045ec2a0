"""Ansible-compatible inventories: YAML or INI files, ``group_vars/``, ``host_vars/``, patterns.

``Inventory.load(path)`` reads one; ``.hosts`` maps names to :class:`InventoryHost` (merged
variables, groups) in inventory order; ``.select(pattern)`` picks hosts for ``--limit``.
"""

from fxkit.inventory.model import Inventory, InventoryGroup, InventoryHost

__all__ = ["Inventory", "InventoryGroup", "InventoryHost"]
