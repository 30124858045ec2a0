"""The engine: playbooks and roles run over inventories (runner, role and its Host API,
variables, results and the console). :mod:`fxkit.api` is its front door."""
