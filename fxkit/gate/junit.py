"""A gate run as JUnit XML, the test report CI systems read (Jenkins, GitLab, GitHub actions).

One ``<testsuite>`` per host, one ``<testcase>`` per check: a FAIL is a ``<failure>``, an ERROR
an ``<error>`` ("could not run: why"), a SKIP ``<skipped>``; a WARN passes, with the warning in
its ``<system-out>``. The message is the check's reason; the text (of the failure or error, else
the ``<system-out>``) gives the value, the rule, why the check exists, its source and stage. A
check that passes but is a fleet outlier (:mod:`fxkit.gate.outliers`) passes, its
``<system-out>`` starting ``OUTLIER``, and the host's suite lists its outliers in the property
``outliers``. A check's time is its measurement's (a measurement that several checks share
counts once, at the first). The file is valid against the JUnit schema of Jenkins' xUnit
plugin (tests/data/junit/junit-10.xsd).
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

from fxkit.gate.report import full_value_text, outlier_text, outliers, printable, stages_text
from fxkit.gate.verdicts import CheckResult, CheckStatus, GateResult, HostChecks, Outlier


def render(result: GateResult) -> str:
    """The JUnit XML document of ``result``."""
    root = ET.Element("testsuites", name=f"fxkit gate {result.gate}: {result.title}")
    totals = dict.fromkeys(("tests", "failures", "errors"), 0)
    seconds = 0.0
    for index, (name, host) in enumerate(result.hosts.items()):
        suite, counts, took = _suite(result, name, host, index)
        root.append(suite)
        for key in totals:
            totals[key] += counts[key]
        seconds += took
    root.attrib.update({key: str(n) for key, n in totals.items()})
    root.set("time", _seconds(seconds))
    _clean(root)
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def _suite(
    result: GateResult, name: str, host: HostChecks, index: int
) -> tuple[ET.Element, dict[str, int], float]:
    statuses = [c.status for c in host.checks]
    counts = {
        "tests": len(statuses),
        "failures": statuses.count(CheckStatus.FAIL),
        "errors": statuses.count(CheckStatus.ERROR),
        "skipped": statuses.count(CheckStatus.SKIP),
    }
    suite = ET.Element(
        "testsuite",
        {
            "name": f"{result.gate} {name}",
            **{key: str(n) for key, n in counts.items()},
            "timestamp": result.started_at,
            "hostname": name,
            "id": str(index),
            "package": f"fxkit.gate.{result.gate}",
        },
    )
    flagged = {check: found for (where, check), found in outliers(result).items() if where == name}
    properties = ET.SubElement(suite, "properties")
    for key, value in _properties(result, host, flagged):
        ET.SubElement(properties, "property", name=key, value=value)
    timed: set[int] = set()
    took = 0.0
    for check in host.checks:
        seconds = 0.0
        if check.measurement is not None and check.measurement not in timed:
            timed.add(check.measurement)
            seconds = host.measurements[check.measurement].duration_s
        took += seconds
        suite.append(_case(result, name, check, seconds, flagged.get(check.id, [])))
    suite.set("time", _seconds(took))
    return suite, counts, took


def _properties(
    result: GateResult, host: HostChecks, flagged: dict[str, list[Outlier]]
) -> list[tuple[str, str]]:
    found = [
        ("gate", result.gate),
        ("gate_title", result.title),
        ("gate_file", result.gate_file),
        ("gate_sha256", result.gate_sha256),
        ("verdict", host.verdict),
        ("inventory", ", ".join(result.inventory)),
        ("started_at", result.started_at),
        ("finished_at", result.finished_at),
        ("baseline", result.baseline or ""),
        ("reevaluated_from", result.reevaluated_from or ""),
        ("unreachable", host.unreachable or ""),
        ("stages_run", stages_text(result) or ""),
        ("outliers", "; ".join(_outlier(c, o) for c, found in flagged.items() for o in found)),
    ]
    return [(key, value) for key, value in found if value]


def _case(
    result: GateResult, host: str, check: CheckResult, seconds: float, flagged: list[Outlier]
) -> ET.Element:
    case = ET.Element(
        "testcase", name=check.id, classname=f"{result.gate}.{host}", time=_seconds(seconds)
    )
    details = _details(check)
    if check.status is CheckStatus.FAIL:
        ET.SubElement(case, "failure", message=check.reason, type=str(check.status)).text = details
        return case
    if check.status is CheckStatus.ERROR:
        message = f"could not run: {check.reason}"
        ET.SubElement(case, "error", message=message, type=str(check.status)).text = details
        return case
    if check.status is CheckStatus.SKIP:
        ET.SubElement(case, "skipped", message=check.reason)
    if check.status is CheckStatus.WARN:
        details = f"WARN (severity warning, does not fail the gate): {check.reason}\n{details}"
    if check.status is CheckStatus.PASS and flagged:
        why = "; ".join(_outlier(check.id, o) for o in flagged)
        details = f"OUTLIER (passes; does not fail the gate): {why}\n{details}"
    ET.SubElement(case, "system-out").text = details
    return case


def _details(check: CheckResult) -> str:
    lines = [
        f"{check.title} [{check.severity}]: {check.status}",
        f"value: {full_value_text(check.value, check.unit)}",
        f"rule: {check.expected or '-'}",
    ]
    if check.baseline_value is not None:
        lines.append(f"baseline: {full_value_text(check.baseline_value, check.unit)}")
    if check.change is not None:
        lines.append(f"change: {check.change:+.1%}")
    lines += [f"reason: {check.reason}", f"why: {check.why}", f"check: {check.where}"]
    shown = {"source": check.source, "stage": check.stage}
    lines += [f"{name}: {value}" for name, value in shown.items() if value]
    return "\n".join(lines)


def _outlier(check_id: str, outlier: Outlier) -> str:
    return f"{check_id} ({outlier_text(outlier)}): {outlier.why}"


def _clean(root: ET.Element) -> None:
    """Every text and attribute made XML (see :func:`~fxkit.gate.report.printable`)."""
    for element in root.iter():
        if element.text:
            element.text = printable(element.text)
        for key, value in element.attrib.items():
            element.set(key, printable(value))


def _seconds(value: float) -> str:
    return f"{value:.3f}"
