"""The gate reports (junit.xml, report.md, report.html) of real gate runs on lab hosts.

A small gate of ``command`` checks runs with :class:`GateRun` on two plain lab hosts, with one
check of every status: PASS (uname -r, /proc/meminfo), WARN (a warning's minimum no host has),
FAIL (nproc against 100000), ERROR (amd-smi missing, a command that exits 3, output that is not
JSON, a change rule without a baseline), SKIP (a ``when`` that is false), per-item values
(``parse: json`` + ``value: "*.x"``: /proc/loadavg by period), a host printing ``<script>`` and
terminal escapes, and a secret host variable echoed by a command. It runs a second time with the
first as its baseline (its change rule passes), and the second run is re-evaluated with an edited
threshold. The JUnit XML is read by junitparser and validated against the JUnit schema of
Jenkins' xUnit plugin (tests/data/junit/junit-10.xsd, from jenkinsci/xunit-plugin); the Markdown
is rendered by markdown-it (rich's parser); the HTML is read by html.parser.
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

import junitparser
import pytest
import xmlschema
import yaml
from markdown_it import MarkdownIt

from fxkit.engine.runner import load_inventory
from fxkit.gate import spec
from fxkit.gate.markdown import text as markdown_text
from fxkit.gate.report import write_reports
from fxkit.gate.run import GateOptions, GateRun, rule_renderer
from fxkit.gate.verdicts import GateResult, reevaluate
from fxkit.redaction import maskable, redact

pytestmark = pytest.mark.lab

SCHEMA = Path(__file__).parent / "data" / "junit" / "junit-10.xsd"
TOKENS = {"lab01": "tok-lab01-9f8e7d6c5b", "lab02": "tok-lab02-1a2b3c4d5e"}
HOSTILE = "<script>alert(1)</script> | *x* `y` [z](#)"
HOSTILE_KEY = "<img src=x onerror=alert(2)>"
LOADAVG = (
    "python3 -c \"import json, os; print(json.dumps({p: {'x': v} for p, v in "
    "zip(('1m', '5m', '15m'), os.getloadavg())}))\""
)
MEMINFO = "awk '/^{}:/ {{printf \"%.3f\", $2 / 1048576}}' /proc/meminfo"


def check(id, measure, rule, **more):
    return {
        "id": id,
        "title": more.pop("title", id.replace("_", " ")),
        "why": more.pop("why", f"the report test's {id}"),
        "measure": {"command": measure},
        "rule": rule,
        **more,
    }


GATE = {
    "gate": "labreport",
    "title": "Lab report test gate",
    "about": "Command checks on plain lab hosts, one of every status (tests/test_gate_report.py).",
    "hosts": "lab",
    "vars": {"mem_min_gib": 0.05, "mem_available_min_gib": 100000},
    "checks": [
        check("kernel_release", {"run": "uname -r"}, {">=": "3.0"}, title="Kernel version"),
        check(
            "mem_total",
            {"run": MEMINFO.format("MemTotal"), "parse": "number"},
            {">=": "{{ mem_min_gib }}"},
            unit="GiB",
            title="Memory",
        ),
        check(
            "mem_available",
            {"run": MEMINFO.format("MemAvailable"), "parse": "number"},
            {">=": "{{ mem_available_min_gib }}"},
            unit="GiB",
            severity="warning",
        ),
        check("cpu_count", {"run": "nproc", "parse": "number"}, {">=": 100000}, unit="CPUs"),
        check("load_average", {"run": LOADAVG, "parse": "json"}, {"<=": 1000}, value="*.x"),
        check(
            "mem_total_change",
            {"run": MEMINFO.format("MemTotal"), "parse": "number"},
            {"change": {"min": "-50%", "max": "50%", "of": "mem_total"}},
            unit="GiB",
        ),
        check(
            "gpu_count",
            {"run": "amd-smi list --json", "parse": "json", "tool": "amd-smi"},
            {"==": 8},
            unit="GPUs",
        ),
        check(
            "rdma_bandwidth",
            {"run": "ib_write_bw --report_gbits", "tool": "ib_write_bw"},
            {">=": 350},
            when="{{ rdma_peer | default('') != '' }}",
            unit="Gb/s",
        ),
        check("hostile_text", {"run": f"printf '%s' '{HOSTILE}'"}, {"==": "plain"}),
        check(
            "hostile_items",
            {"run": f"printf '%s' '{{\"{HOSTILE_KEY}\": 1}}'", "parse": "json"},
            {"==": 1},
            value="*",
        ),
        check("escapes", {"run": "printf 'a\\033[31mred\\033[0m\\001'"}, {"contains": "red"}),
        check("secret_echo", {"run": "echo token={{ registry_token }}"}, {"==": "none"}),
        check("secret_error", {"run": "echo {{ registry_token }} >&2; exit 3"}, {"==": "x"}),
        check("parse_error", {"run": "echo not-json", "parse": "json"}, {"==": 1}),
    ],
}
#: The statuses on each host: the first run (no baseline), then the second (with one).
FIRST = {
    "kernel_release": "PASS",
    "mem_total": "PASS",
    "mem_available": "WARN",
    "cpu_count": "FAIL",
    "load_average": "PASS",
    "mem_total_change": "ERROR",
    "gpu_count": "ERROR",
    "rdma_bandwidth": "SKIP",
    "hostile_text": "FAIL",
    "hostile_items": "PASS",
    "escapes": "PASS",
    "secret_echo": "FAIL",
    "secret_error": "ERROR",
    "parse_error": "ERROR",
}
SECOND = {**FIRST, "mem_total_change": "PASS"}


@dataclass
class Run:
    result: GateResult
    secrets: set[str]
    files: dict[str, Path] = field(default_factory=dict)

    def text(self, kind: str) -> str:
        return self.files[kind].read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def runs(lab_fleet, tmp_path_factory) -> dict[str, Run]:
    return make_runs(lab_fleet(2), tmp_path_factory.mktemp("gate-report"))


def make_runs(fleet, folder: Path) -> dict[str, Run]:
    """The gate run on lab01 and lab02, run again against the first, and re-evaluated (with
    ``mem_available_min_gib`` lowered); each with its report files written in ``folder``."""
    gate_file = folder / "labreport.yml"
    gate_file.write_text(yaml.safe_dump(GATE, sort_keys=False))
    inv = yaml.safe_load(fleet.inventory.read_text())
    hosts = inv["all"]["children"]["lab"]["hosts"]
    for name, token in TOKENS.items():
        hosts[name]["registry_token"] = token
    inv_file = folder / "inventory.yml"
    inv_file.write_text(yaml.safe_dump(inv))
    gate = spec.load(gate_file)

    def run(baseline: GateResult | None = None) -> Run:
        options = GateOptions(
            limit="lab01:lab02", baseline=baseline, inventory_sources=[str(inv_file)]
        )
        runner = GateRun(gate, load_inventory([inv_file]), options)
        return Run(runner.run(), runner.secrets)

    first = run()
    second = run(baseline=first.result)
    edited = reevaluate(second.result, gate, rule_renderer(gate, {"mem_available_min_gib": 0.01}))
    edited.reevaluated_from = str(folder / "second" / "result.json")
    found = {"first": first, "second": second, "reevaluated": Run(edited, second.secrets)}
    for name, item in found.items():
        item.files = write_reports(item.result, folder / name, item.secrets)
    return found


def statuses(result: GateResult, host: str) -> dict[str, str]:
    return {c.id: c.status for c in result.hosts[host].checks}


def test_the_runs_have_one_check_of_every_status(runs):
    for host in TOKENS:
        assert statuses(runs["first"].result, host) == FIRST
        assert statuses(runs["second"].result, host) == SECOND
        assert statuses(runs["reevaluated"].result, host) == {**SECOND, "mem_available": "PASS"}
    first = runs["first"].result.hosts["lab01"]
    assert "amd-smi not found on lab01" in first.check("gpu_count").reason
    assert "no baseline" in first.check("mem_total_change").reason
    assert set(runs["first"].secrets) >= set(TOKENS.values())


@pytest.mark.parametrize("name", ["first", "second", "reevaluated"])
def test_every_report_file_is_written(runs, name):
    files = runs[name].files
    assert {k: p.name for k, p in files.items()} == {
        "json": "result.json",
        "junit": "junit.xml",
        "markdown": "report.md",
        "html": "report.html",
    }
    folder = files["json"].parent
    assert sorted(p.name for p in folder.iterdir()) == sorted(p.name for p in files.values())


@pytest.mark.parametrize("name", ["first", "second", "reevaluated"])
def test_junit_is_valid_for_jenkins_and_counts_match(runs, name):
    run = runs[name]
    path = run.files["junit"]
    xmlschema.XMLSchema(SCHEMA).validate(path)
    xml = junitparser.JUnitXml.fromfile(str(path))
    masks = maskable(run.secrets)
    suites = {suite.hostname: suite for suite in xml}
    assert set(suites) == set(run.result.hosts)
    total = 0
    for host, suite in suites.items():
        expected = statuses(run.result, host)
        counts = {s: list(expected.values()).count(s) for s in ("FAIL", "ERROR", "SKIP")}
        assert (suite.tests, suite.failures, suite.errors, suite.skipped) == (
            len(expected),
            counts["FAIL"],
            counts["ERROR"],
            counts["SKIP"],
        )
        kinds = {
            "FAIL": junitparser.Failure,
            "ERROR": junitparser.Error,
            "SKIP": junitparser.Skipped,
        }
        cases = {case.name: case for case in suite}
        assert set(cases) == set(expected)
        for check_id, status in expected.items():
            case = cases[check_id]
            assert case.classname == f"labreport.{host}"
            if status in kinds:
                [outcome] = case.result
                assert isinstance(outcome, kinds[status])
                reason = redact(run.result.hosts[host].check(check_id).reason, masks)
                prefix = "could not run: " if status == "ERROR" else ""
                assert outcome.message == prefix + reason
            else:
                assert case.is_passed, (check_id, case.result)
        if expected["mem_available"] == "WARN":
            assert cases["mem_available"].system_out.startswith("WARN (severity warning")
        assert suite.time == pytest.approx(
            sum(m.duration_s for m in run.result.hosts[host].measurements), abs=0.01
        )
        total += suite.tests
    assert xml.tests == total


def test_junit_failure_text_has_value_rule_and_why(runs):
    xml = junitparser.JUnitXml.fromfile(str(runs["first"].files["junit"]))
    suite = next(s for s in xml if s.hostname == "lab01")
    case = next(c for c in suite if c.name == "cpu_count")
    [failure] = case.result
    assert failure.type == "FAIL"
    assert "is not >= 100000" in failure.message
    assert "rule: >= 100000" in failure.text and "why: the report test's cpu_count" in failure.text
    error = next(c for c in suite if c.name == "gpu_count").result[0]
    assert error.message.startswith("could not run: amd-smi not found on lab01")
    skipped = next(c for c in suite if c.name == "rdma_bandwidth").result[0]
    assert "is false on this host" in skipped.message


def test_junit_keeps_hostile_and_binary_output_as_text(runs):
    root = ET.parse(runs["first"].files["junit"]).getroot()
    texts = [e.text or "" for e in root.iter()] + [
        v for e in root.iter() for v in e.attrib.values()
    ]
    assert any(HOSTILE in t for t in texts)
    assert any("a\\x1b[31mred\\x1b[0m\\x01" in t for t in texts)


@pytest.mark.parametrize("name", ["first", "second", "reevaluated"])
def test_markdown_has_every_failure_every_check_and_the_sign_off(runs, name):
    run = runs[name]
    text = run.text("markdown")
    result = run.result
    assert text.startswith(f"# Lab report test gate (labreport): {result.verdict}\n")
    assert result.gate_sha256 in text and result.gate_file in text
    failures = text.split("## Failures and errors")[1].split("\n## ")[0]
    rows = [line for line in failures.splitlines() if line.startswith("| ") and "`" in line]
    for host, host_result in result.hosts.items():
        for c in host_result.checks:
            found = [
                r for r in rows if f"| `{c.id}` " in r and host in r.split(" | ")[2].split(", ")
            ]
            assert bool(found) == (c.status in ("FAIL", "ERROR", "WARN")), (host, c.id)
            assert all(f"| **{c.status}** |" in r or f"| {c.status} |" in r for r in found)
    errors = [r for r in rows if r.startswith("| **ERROR**")]
    hosts = sum(len(r.split(" | ")[2].split(", ")) for r in errors)
    assert hosts == result.summary["ERROR"]  # hosts with the same reason share a row
    assert all("could not run:" in r for r in errors)
    assert "| `gpu_count` gpu count | lab01 | could not run: amd-smi not found on lab01" in failures
    for c in result.hosts["lab01"].checks:
        block = text.split(f"<summary><code>{c.id}</code>")[1].split("</details>")[0]
        host_rows = [line for line in block.splitlines() if line.startswith("| lab0")]
        assert len(host_rows) == len(result.hosts)
    assert "## Thresholds" in text and "`mem_available_min_gib`" in text
    signoff = text.split("## Sign-off")[1]
    assert "| Name | Role | Date | Signature |" in signoff
    assert (
        HOSTILE not in text
        and "\\<script>alert(1)\\</script> \\| \\*x\\* \\`y\\` \\[z\\](#)" in text
    )
    if name == "reevaluated":
        assert "**Re-evaluated from:**" in text


def markdown_tables(text: str) -> list[list[list[str]]]:
    """Every table of the Markdown, as markdown-it renders it: rows of cell texts."""
    rendered = MarkdownIt("commonmark").enable("table").render(text)
    tables = []
    for table in re.findall(r"<table>(.*?)</table>", rendered, re.S):
        rows = re.findall(r"<tr>(.*?)</tr>", table, re.S)
        tables.append([re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", row, re.S) for row in rows])
    return tables


@pytest.mark.parametrize("name", ["first", "reevaluated"])
def test_markdown_renders_as_written(runs, name):
    """markdown-it (CommonMark with tables; rich's own Markdown parser) renders the report with
    the host x check matrix (a row per host, a cell per check), a table per check of one row
    per host, four cells each, host text shown as written."""
    run = runs[name]
    rendered = MarkdownIt("commonmark").enable("table").render(run.text("markdown"))
    parsed = Page()
    parsed.feed(rendered)
    tags = [t for t, _ in parsed.tags]
    assert not {"script", "img", "a", "em"} & set(tags)
    tables = markdown_tables(run.text("markdown"))
    hosts, checks = len(run.result.hosts), len(GATE["checks"])
    [matrix] = [t for t in tables if t[0][0] == "host" and len(t[0]) == checks + 1]
    assert len(matrix) == hosts + 1 and all(len(row) == checks + 1 for row in matrix)
    per_check = [t for t in tables if t[0] == ["host", "status", "value", "rule", "reason"]]
    assert len(per_check) == checks and all(len(t) == hosts + 1 for t in per_check)
    assert tags.count("details") == checks
    text = " ".join(parsed.text)
    assert HOSTILE in text and HOSTILE_KEY in text
    assert "token=********" in text


class Page(HTMLParser):
    """Every start tag with its attributes, and the text, of an HTML page."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []
        self.open: list[str] = []
        self.styles: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        if tag not in ("meta", "br", "col"):  # void elements
            self.open.append(tag)

    def handle_startendtag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_endtag(self, tag):
        assert self.open and self.open[-1] == tag, (tag, self.open[-3:])
        self.open.pop()

    def handle_data(self, data):
        (self.styles if self.open and self.open[-1] == "style" else self.text).append(data)


def page(run: Run) -> Page:
    return page_of(run.files["html"])


def page_of(path: Path) -> Page:
    parsed = Page()
    parsed.feed(path.read_text(encoding="utf-8"))
    parsed.close()
    return parsed


@pytest.mark.parametrize("name", ["first", "second", "reevaluated"])
def test_html_parses_and_has_no_external_reference(runs, name):
    html = runs[name].text("html")
    parsed = page(runs[name])
    assert html.startswith("<!DOCTYPE html>")
    assert parsed.open == [], "every element is closed"
    assert {t for t, _ in parsed.tags} >= {"html", "head", "style", "body", "table", "svg", "rect"}
    assert not {"script", "link", "img", "iframe", "object", "embed"} & {t for t, _ in parsed.tags}
    for tag, attrs in parsed.tags:
        assert not {"src", "href", "srcset", "action", "xlink:href"} & set(attrs), (tag, attrs)
        assert not any(k.startswith("on") for k in attrs), (tag, attrs)
    for needle in ("http:", "https:", "@import", "url(", "file:"):
        assert needle not in html
    assert "".join(parsed.styles).strip(), "the CSS is inline"


def test_html_has_the_matrix_and_a_strip_of_each_numeric_check(runs):
    run = runs["second"]
    parsed = page(run)
    text = " ".join(parsed.text)
    tables = [a.get("class") for t, a in parsed.tags if t == "table"]
    outliers = ["outliers"] * any(f.outliers for f in run.result.fleet.values())
    assert tables == [
        *("problems", "matrix", *outliers, "stages", "facts"),
        *["hosts"] * len(GATE["checks"]),
        *("thresholds", "signoff"),
    ]
    rows = [a for t, a in parsed.tags if t == "th" and "host" in (a.get("class") or "")]
    assert {a["title"].split(":")[0] for a in rows if "title" in a} == set(TOKENS)
    for host_result in run.result.hosts.values():
        for c in host_result.checks:
            assert c.id in text
    dots = [t for t in parsed.text if re.search(r"\((PASS|FAIL|WARN)\)(, fleet outlier)?$", t)]
    charted = {t.split(": ")[0] for t in dots}
    assert {"lab01", "lab02", "lab01 · 5m", f"lab02 · {HOSTILE_KEY}"} <= charted
    for host in TOKENS:
        assert f"{host} · 1m" in charted  # a dot per item (load_average)
    titles = [t for t in parsed.text if ": baseline " in t]
    assert len(titles) == 2, "the change rule's strip shows each host's baseline"
    assert "could not run: amd-smi not found on lab01" in text


def test_html_escapes_hostile_values(runs):
    run = runs["first"]
    html = run.text("html")
    parsed = page(run)
    assert HOSTILE not in html and HOSTILE_KEY not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert any(HOSTILE in t for t in parsed.text)
    assert any(HOSTILE_KEY in t for t in parsed.text)
    assert not [t for t, _ in parsed.tags if t in ("script", "img")]


@pytest.mark.parametrize("name", ["first", "second", "reevaluated"])
def test_no_secret_in_any_report_file(runs, name):
    run = runs[name]
    for token in TOKENS.values():
        for kind, path in run.files.items():
            assert token not in path.read_text(encoding="utf-8"), (kind, token)
    data = json.loads(run.text("json"))
    echoed = data["hosts"]["lab01"]["checks"]
    assert next(c for c in echoed if c["id"] == "secret_echo")["value"] == "token=********"
    assert "token=" + "\\*" * 8 in run.text("markdown")
    assert "token=********" in run.text("html")
    junit = run.text("junit")
    assert "value: token=********" in junit


def test_reports_of_an_unreachable_host_say_why(lab_fleet, tmp_path):
    fleet = lab_fleet(2)
    gate_file = tmp_path / "labreport.yml"
    gate_file.write_text(yaml.safe_dump(GATE, sort_keys=False))
    inv = yaml.safe_load(fleet.inventory.read_text())
    hosts = inv["all"]["children"]["lab"]["hosts"]
    address = fleet.address("lab01").rsplit(".", 1)[0] + ".250"  # nothing listens there
    hosts["gone01"] = {"ansible_host": address, "ansible_port": fleet.port}
    inv["all"]["vars"]["registry_token"] = "tok-gone-0a1b2c3d4e"
    (tmp_path / "inventory.yml").write_text(yaml.safe_dump(inv))
    options = GateOptions(limit="lab01:gone01", inventory_sources=["inventory.yml"])
    runner = GateRun(spec.load(gate_file), load_inventory([tmp_path / "inventory.yml"]), options)
    result = runner.run()
    files = write_reports(result, tmp_path / "out", runner.secrets)
    gone = result.hosts["gone01"]
    assert gone.unreachable
    assert {c.status for c in gone.checks} == {"ERROR", "SKIP"}
    xmlschema.XMLSchema(SCHEMA).validate(files["junit"])
    suite = next(
        s for s in junitparser.JUnitXml.fromfile(str(files["junit"])) if s.name.endswith("gone01")
    )
    assert suite.errors == len(GATE["checks"]) - 1 and suite.skipped == 1
    props = {p.name: p.value for p in suite.properties()}
    assert props["unreachable"] == gone.unreachable
    markdown = files["markdown"].read_text()
    assert f"Unreachable: {markdown_text(gone.unreachable)}" in markdown
    assert "could not run: unreachable: " in markdown
    assert "Unreachable: " in " ".join(page_of(files["html"]).text)
