"""Gates: acceptance checks as data (gates/*.yml), run over SSH on every node, with reports.

:mod:`~fxkit.gate.spec` reads gate files, :mod:`~fxkit.gate.measure` and
:mod:`~fxkit.gate.measures` are what checks measure, :mod:`~fxkit.gate.rules` what they require,
:mod:`~fxkit.gate.run` runs a gate on hosts and :mod:`~fxkit.gate.verdicts` keeps and judges what
it measured.
"""
