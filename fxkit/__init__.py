"""fxkit: provision MI308X inference nodes Ansible-style in Python, and load models fast.

What a Python user calls is in :mod:`fxkit.api` (and the loader alone, :mod:`fxkit.loader`):
run a playbook, run a gate, roll out, stage, load, and write a role. Every other module is
fxkit's inside (the engine in :mod:`fxkit.engine`, the features beside it) and may change.
"""

__version__ = "0.1.0"
