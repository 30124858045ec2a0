"""Ansible-compatible inventories: YAML or INI files, directories, ``group_vars/``, ``host_vars/``,
host patterns, read as ansible-core reads them.

``Inventory.load(sources)`` reads one source or several (merged in order); ``.hosts`` maps names
to :class:`InventoryHost` (merged variables, groups) in declaration order; ``.select(pattern,
limit)`` picks hosts for a play's ``hosts:`` and ``--limit``, in Ansible's order.
"""

from fxkit.inventory.model import Inventory, InventoryGroup, InventoryHost

__all__ = ["Inventory", "InventoryGroup", "InventoryHost"]
