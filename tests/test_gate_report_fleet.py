"""The gate reports at the size of a rack: 64 simulated nodes (tests/gate_fleet.py).

The gate really runs (:class:`GateRun`, 64 hosts of ``ansible_connection: local``, each stage's
measurement a command reading the node's simulated values, judged by fxkit's rules); the
reports are read back: result.json, the HTML page (html.parser), the Markdown (markdown-it,
rich's parser), the JUnit XML (validated against Jenkins' xUnit schema, read by junitparser).
They lead with the failures (FAIL, then ERROR, then WARN, each with its reason and source), then
the host x check matrix (the hosts that failed first), then the fleet view, where the node 30 %
slower than the others, which passes, is the one outlier; every check's source is in every
file; each stage's expected and actual duration is shown; ``--stage`` runs one stage alone.
Headless Chromium (Debian's ``chromium``, installed by scripts/install-system-deps.sh) shows the
page at 1280 px: the matrix fits the width, the failures are on the first screen.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

import gate_fleet
import junitparser
import pytest
import xmlschema
from rich.console import Console
from test_gate_report import markdown_tables
from test_gate_report_browser import colours, png_rows
from test_play_lab import FXKIT

from fxkit.engine.runner import load_inventory
from fxkit.errors import FxkitError
from fxkit.gate import spec
from fxkit.gate.html import COLOURS, screenshot
from fxkit.gate.report import stage_table, table, write_reports
from fxkit.gate.run import GateOptions, GateRun, rule_renderer
from fxkit.gate.verdicts import GateResult, load_results, reevaluate

SCHEMA = Path(__file__).parent / "data" / "junit" / "junit-10.xsd"
DOCS_IMAGE = Path(__file__).parent.parent / "docs" / "img" / "gate-report-fleet64.png"
#: The statuses the faults give (every other check on every host PASSes).
FAILED = {
    ("node07", "gpu_pcie_width"): "FAIL",
    ("node23", "dmesg_amdgpu_errors"): "FAIL",
    ("node52", "bios_version"): "FAIL",
    ("node33", "idle_power"): "WARN",
    **{
        ("node60", c[0]): "ERROR"
        for c in gate_fleet.CHECKS
        if c[1] == "performance"
    },
}  # fmt: skip
#: The hosts in the matrix's order: FAIL, ERROR, WARN, the outlier, then the rest.
FIRST = ["node07", "node23", "node52", "node60", "node33", "node41"]


def grouped(gate: spec.Gate) -> list[str]:
    """The gate's check ids as the reports order them: by stage, in the gate's order within."""
    stages = list(gate.spec.stages)
    return [c.id for c in sorted(gate.spec.checks, key=lambda c: stages.index(c.stage))]


@dataclass
class Fleet:
    gate: spec.Gate
    inventory: Path
    result: GateResult
    files: dict[str, Path]

    def text(self, kind: str) -> str:
        return self.files[kind].read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory) -> Fleet:
    folder = tmp_path_factory.mktemp("fleet64")
    gate_file, inventory = gate_fleet.write(folder)
    gate = spec.load(gate_file)
    options = GateOptions(inventory_sources=[str(inventory)])
    result = GateRun(gate, load_inventory([inventory]), options).run()
    return Fleet(gate, inventory, result, write_reports(result, folder / "out"))


def test_the_faults_give_exactly_their_statuses(fleet):
    assert len(fleet.result.hosts) == 64
    found = {
        (name, c.id): c.status
        for name, host in fleet.result.hosts.items()
        for c in host.checks
        if c.status != "PASS"
    }
    assert found == FAILED


def test_the_node_30_percent_slower_passes_and_is_the_one_outlier(fleet):
    slow = fleet.result.hosts["node41"].check("transferbench_a2a")
    assert slow.status == "PASS" and slow.value >= 32.9
    outliers = {
        check_id: [(o.host, o.item) for o in view.outliers]
        for check_id, view in fleet.result.fleet.items()
        if view.outliers
    }
    assert outliers == {"transferbench_a2a": [("node41", None)]}
    view = fleet.result.fleet["transferbench_a2a"]
    assert view.worse == "below" and view.count == 63  # node60 could not run it
    [outlier] = view.outliers
    assert outlier.deviation == pytest.approx(-0.30, abs=0.02)
    assert "below the fleet median" in outlier.why and "robust z-score" in outlier.why
    assert fleet.result.fleet["idle_power"].worse == "above"  # a maximum: higher is worse
    data = json.loads(fleet.text("json"))
    assert data["fleet"]["transferbench_a2a"]["outliers"][0]["host"] == "node41"
    assert data["fleet_settings"] == {"fleet_outlier_fraction": 0.05, "fleet_outlier_mad_k": 3.5}
    assert load_results(fleet.files["json"]).fleet == fleet.result.fleet


def test_the_outlier_settings_are_gate_variables(fleet):
    def again(**extra) -> GateResult:
        return reevaluate(fleet.result, fleet.gate, rule_renderer(fleet.gate, {}), None, extra)

    by_fraction_only = again(fleet_outlier_mad_k=1000)
    assert [o.host for o in by_fraction_only.fleet["transferbench_a2a"].outliers] == ["node41"]
    assert not any(
        v.outliers
        for v in again(fleet_outlier_fraction="40%", fleet_outlier_mad_k=1000).fleet.values()
    )
    with pytest.raises(FxkitError, match="fleet_outlier_fraction: 'fast' is not a number"):
        again(fleet_outlier_fraction="fast")


def test_json_keeps_each_checks_source_and_stage(fleet):
    data = json.loads(fleet.text("json"))
    sources = {c[0]: c[6] for c in gate_fleet.CHECKS}
    for host in data["hosts"].values():
        for check in host["checks"]:
            if check["id"] in sources:
                assert check["source"] == sources[check["id"]]
            assert check["stage"] in gate_fleet.STAGES
    assert data["stages"] == {"prerequisites": 30.0, "health": 120.0, "performance": 1200.0}
    assert data["stages_run"] == []


# -- HTML --------------------------------------------------------------------------------


@dataclass
class Cell:
    tag: str
    attrs: dict[str, str | None]
    text: str = ""


@dataclass
class Html(HTMLParser):
    """The sections (by id, in order) and the tables (by class: rows of cells) of a page."""

    sections: list[str] = field(default_factory=list)
    tables: dict[str, list[list[Cell]]] = field(default_factory=dict)
    _table: list[list[Cell]] | None = None
    _cell: Cell | None = None

    def __post_init__(self):
        super().__init__(convert_charrefs=True)

    def handle_starttag(self, tag, attrs):
        found = dict(attrs)
        if tag == "section" and found.get("id"):
            self.sections.append(found["id"])
        elif tag == "table" and found.get("class"):
            self._table = self.tables.setdefault(found["class"], [])
        elif tag == "tr" and self._table is not None:
            self._table.append([])
        elif tag in ("td", "th") and self._table is not None:
            self._cell = Cell(tag, found)
            self._table[-1].append(self._cell)

    def handle_endtag(self, tag):
        if tag == "table":
            self._table = None
        elif tag in ("td", "th"):
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.text += data


@pytest.fixture(scope="module")
def page(fleet) -> Html:
    parsed = Html()
    parsed.feed(fleet.text("html"))
    return parsed


def test_html_leads_with_the_failures_then_the_matrix(page):
    assert page.sections == ["failures", "matrix", "outliers", "stages", "run", "checks"]
    rows = page.tables["problems"][1:]
    statuses = [row[0].text for row in rows]
    assert statuses == ["FAIL"] * 3 + ["ERROR"] * 4 + ["WARN"]
    checks = [re.match(r"\w+", row[1].text).group() for row in rows]
    assert checks[:3] == ["bios_version", "gpu_pcie_width", "dmesg_amdgpu_errors"]
    sources = {c[0]: c[6] for c in gate_fleet.CHECKS}
    for row, check in zip(rows, checks, strict=True):
        assert f"Source: {sources[check]}" in row[1].text
        hosts = [h for (h, c), status in FAILED.items() if c == check and status == row[0].text]
        assert row[2].text == ", ".join(hosts)
    assert rows[1][3].text == "3: 8 is not >= 16" and rows[1][2].text == "node07"


def test_html_matrix_has_a_row_per_host_and_a_column_per_check(fleet, page):
    matrix = page.tables["matrix"]
    stages, ids, *hosts = matrix
    columns = [cell.text for cell in ids[1:]]
    assert columns == grouped(fleet.gate)
    spans = [(cell.text, int(cell.attrs["colspan"])) for cell in stages[1:]]
    assert spans == [("prerequisites", 3), ("health", 38), ("performance", 4)]
    order = [row[0].text for row in hosts]
    assert order[: len(FIRST)] == FIRST
    assert sorted(order) == gate_fleet.HOSTS
    assert order[len(FIRST) :] == [h for h in gate_fleet.HOSTS if h not in FIRST]
    for row in hosts:
        host, cells = row[0].text, row[1:]
        assert len(cells) == len(columns)
        for check_id, cell in zip(columns, cells, strict=True):
            status = FAILED.get((host, check_id), "PASS")
            if (host, check_id) == ("node41", "transferbench_a2a"):
                assert cell.attrs["class"].startswith("c-OUTLIER") and cell.text == "▼"
                assert "30% below the fleet median" in cell.attrs["title"]
            else:
                assert cell.attrs["class"].split()[0] == f"c-{status}", (host, check_id)


def test_html_lists_the_outlier_and_each_stages_durations(fleet, page):
    outliers = [r for r in fleet.text("html").split('id="outliers"')[1].split("</section>")[:1]]
    assert "node41" in outliers[0] and "TransferBench a2a" in outliers[0]
    rows = stage_table(fleet.result)
    assert [(r[0], r[1], r[2]) for r in rows] == [
        ("prerequisites", "3", "30 s"),
        ("health", "38", "2 min"),
        ("performance", "4", "20 min"),
    ]
    assert all(r[3] != "-" and r[6] == "within" for r in rows)
    stages = fleet.text("html").split('id="stages"')[1].split("</section>")[0]
    for cells in rows:
        assert all(f">{cell}<" in stages for cell in cells)


def test_html_folds_every_check_with_its_source(fleet):
    text = fleet.text("html")
    details = re.findall(r'<details class="check" id="check-(\w+)">', text)
    assert details == grouped(fleet.gate)
    folded = text.split('id="check-transferbench_a2a"')[1].split("</details>")[0]
    assert "Source: </strong>ROCm/system-acceptance-docs" in folded
    assert "median 48" in folded and "node41: 3" in folded and "fleet outlier" in folded
    assert folded.count("<circle") == 63 + 1  # a dot per host that ran it, a ring round one


# -- Markdown and JUnit ------------------------------------------------------------------


def test_markdown_leads_with_the_failures_then_the_matrix(fleet):
    text = fleet.text("markdown")
    headings = re.findall(r"^## (.*)$", text, re.M)
    assert headings[:5] == [
        "Failures and errors",
        "Hosts x checks: 64 x 45",
        "Fleet view: outliers that pass",
        "Stages: expected and actual duration",
        "The run",
    ]
    problems, matrix, key, outliers, stages, *rest = markdown_tables(text)
    assert [r[0] for r in problems[1:]] == ["<strong>FAIL</strong>"] * 3 + [
        "<strong>ERROR</strong>"
    ] * 4 + ["WARN"]
    assert problems[2][1:4] == [
        "<code>gpu_pcie_width</code> gpu pcie width",
        "node07",
        "3: 8 is not &gt;= 16",
    ]
    assert problems[2][4] == "ROCm/system-acceptance-docs, docs/gpus/mi300x.md, Basic health"
    assert len(matrix) == 1 + 64 and all(len(r) == 1 + 45 for r in matrix)
    assert [r[0] for r in matrix[1 : 1 + len(FIRST)]] == FIRST
    node41 = matrix[FIRST.index("node41") + 1]
    assert node41[1:].count("▼") == 1 and set(node41[1:]) == {"·", "▼"}
    titles = {c.id: c.title for c in fleet.gate.spec.checks}
    assert [r[1] for r in key[1:]] == [f"<code>{i}</code> {titles[i]}" for i in grouped(fleet.gate)]
    assert outliers[1][:2] == ["<code>transferbench_a2a</code>", "node41"]
    assert [r[0] for r in stages[1:]] == list(gate_fleet.STAGES)
    assert text.count("<details>") == 45 and text.count("</details>") == 45
    checks, signoff = rest[:-1], rest[-1]  # the rules use no variable: no thresholds table
    assert len(checks) == 45 and all(len(t) == 1 + 64 for t in checks)
    assert all(t[0] == ["host", "status", "value", "rule", "reason"] for t in checks)
    assert signoff[0] == ["Name", "Role", "Date", "Signature"]


def test_junit_has_each_source_and_the_outlier(fleet):
    xmlschema.XMLSchema(SCHEMA).validate(fleet.files["junit"])
    suites = {s.hostname: s for s in junitparser.JUnitXml.fromfile(str(fleet.files["junit"]))}
    assert len(suites) == 64
    sources = {c[0]: c[6] for c in gate_fleet.CHECKS}
    for case in suites["node07"]:
        texts = [r.text for r in case.result if r.text] + [case.system_out or ""]
        if case.name in sources:
            assert any(f"source: {sources[case.name]}" in t for t in texts), case.name
    slow = next(c for c in suites["node41"] if c.name == "transferbench_a2a")
    assert slow.is_passed and slow.system_out.startswith("OUTLIER (passes; does not fail")
    props = {p.name: p.value for p in suites["node41"].properties()}
    assert props["outliers"].startswith("transferbench_a2a (node41): 30% below the fleet median")
    assert "outliers" not in {p.name for p in suites["node01"].properties()}


def test_the_terminal_table_of_a_fleet_shows_what_did_not_pass_and_the_outlier(fleet):
    console = Console(width=250, record=True)
    console.print(table(fleet.result))
    text = console.export_text()
    assert "(2871 passing rows not shown: see report.md)" in text
    rows = [line for line in text.splitlines() if line.startswith("│ node")]
    assert len(rows) == len(FAILED) + 1
    assert any("node41" in r and "outlier: 30% below the fleet median" in r for r in rows)


# -- stages ------------------------------------------------------------------------------


def test_a_stage_alone_on_the_command_line(fleet, tmp_path):
    out = tmp_path / "health"
    limit = "node01:node07:node33:node41"
    argv = [FXKIT, "gate", str(fleet.gate.path), "-i", str(fleet.inventory), "--limit", limit]
    done = subprocess.run(
        [*argv, "--stage", "health", "--out", str(out)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 1, done.stderr  # node07's x8 link is in the health stage
    assert "38 checks on 4 host(s), stage health only" in done.stdout
    assert "stages: health (expected 2 min)" in done.stdout
    result = load_results(out / "result.json")
    assert result.stages_run == ["health"]
    assert {c.stage for h in result.hosts.values() for c in h.checks} == {"health"}
    assert not any(v.outliers for v in result.fleet.values())  # a2a is not in this stage
    assert (
        "health only (a partial run, not the whole gate; not run: prerequisites, performance)"
        in (out / "report.md").read_text()
    )
    again = reevaluate(result, fleet.gate, rule_renderer(fleet.gate, {}))
    assert [c.status for h in again.hosts.values() for c in h.checks].count("ERROR") == 0
    wrong = subprocess.run([*argv, "--stage", "helth"], capture_output=True, text=True, timeout=120)
    assert wrong.returncode == 2
    assert "no stage 'helth' in gate fleet64" in wrong.stderr
    assert "its stages: prerequisites, health, performance" in wrong.stderr


def test_a_stage_must_be_declared_when_the_gate_declares_stages(tmp_path):
    text = (
        "gate: g\ntitle: G\nstages:\n  health: {expected: 5m}\n  validation: {expected: 30m}\n"
        "checks:\n  - {id: a, title: A, why: w, measure: {command: 'true'}, rule: {'==': ''},\n"
        "     stage: helth}\n"
    )
    gate_file = tmp_path / "g.yml"
    gate_file.write_text(text)
    with pytest.raises(spec.GateError, match=r"check 'a': stage 'helth' is not one of the gate's"):
        spec.load(gate_file)
    gate_file.write_text(text.replace("helth", "health"))
    gate = spec.load(gate_file)
    assert [c.id for c in gate.checks_of(["health"])] == ["a"]
    with pytest.raises(spec.GateError, match="no check of gate g is in stage validation"):
        gate.checks_of(["validation"])
    gate_file.write_text(text.replace("5m", "soon").replace("helth", "health"))
    with pytest.raises(spec.GateError, match="'soon' is not a duration"):
        spec.load(gate_file)


# -- in a browser ------------------------------------------------------------------------

#: Measures the page's layout once it is drawn, into a <pre> that --dump-dom prints: the copy
#: the test opens has it, the report itself has no script.
PROBE = """<script>
addEventListener("load", () => {
  const box = (e) => { const b = e.getBoundingClientRect();
    return {left: b.left, right: b.right, top: b.top, bottom: b.bottom}; };
  const cells = [...document.querySelectorAll("table.matrix tr:nth-child(3) td")];
  const found = {viewport: innerWidth, page: document.documentElement.scrollWidth,
    matrix: box(document.querySelector("table.matrix")),
    failures: box(document.querySelector("#failures")),
    first_failure: box(document.querySelector("table.problems tr:nth-child(2)")),
    cell: Math.min(...cells.map((c) => c.getBoundingClientRect().width))};
  const pre = document.createElement("pre"); pre.id = "layout";
  pre.textContent = JSON.stringify(found); document.body.append(pre);
});
</script>"""
WINDOW = (1280, 1800)


def need_chromium() -> str:
    found = shutil.which("chromium")
    if found is None:
        pytest.skip("chromium is not installed: scripts/install-system-deps.sh installs it")
    return found


def test_the_64_host_report_is_readable_in_chromium(fleet, tmp_path):
    chromium = need_chromium()
    probe = tmp_path / "probe.html"
    probe.write_text(fleet.text("html").replace("</body>", PROBE + "</body>"))
    argv = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"]
    argv += [f"--user-data-dir={tmp_path / 'profile'}", f"--window-size={WINDOW[0]},{WINDOW[1]}"]
    dom = subprocess.run(
        [*argv, "--dump-dom", probe.as_uri()], capture_output=True, text=True, timeout=180
    )
    layout = json.loads(re.search(r'<pre id="layout">(.*?)</pre>', dom.stdout).group(1))
    assert layout["page"] <= layout["viewport"], "nothing sticks out to the right"
    assert layout["matrix"]["right"] <= layout["viewport"], "the matrix fits the width"
    assert layout["cell"] >= 12, "a matrix cell is wide enough to see its letter"
    assert layout["failures"]["top"] < layout["matrix"]["top"], "the failures come first"
    assert layout["first_failure"]["bottom"] < 400, "the first failure is on the first screen"
    png = tmp_path / "report.png"
    screenshot(fleet.files["html"], png, WINDOW)
    width, height, rows = png_rows(png)
    assert (width, height) == WINDOW
    red = bytes.fromhex(COLOURS["FAIL"][1:])
    first_red = next(y for y, row in enumerate(rows) if red in colours(row))
    assert first_red < 300, "the failures' red is at the top of the page"
    matrix_top = int(layout["matrix"]["top"])
    assert len(set().union(*(colours(row) for row in rows[matrix_top : matrix_top + 400]))) > 8
    if os.environ.get("FXKIT_DOCS_IMAGES"):
        DOCS_IMAGE.write_bytes(png.read_bytes())
