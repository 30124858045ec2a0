"""The how-to pages stay true: docs/HOWTO-ROLE.md and docs/HOWTO-GATE-CHECK.md are run as a
reader would run them, on a lab host of this machine.

A page is read as a script. Each block captioned with its file (a line `` `~/site/x.yml`: ``) is
written there; each ``console`` block's commands (``$ ...``) run in order through bash, and what
a command prints must be what the page shows under it; a block captioned
``Part of `~/site/x`:`` must be found in that file after the commands ran. The reader's home
is a folder of the test: ``~/site`` the page's project (its ``.lab`` this test's lab fleet),
``~/fxkit`` this checkout. Files the page adds to fxkit's checkout (``~/fxkit/...``) go to a
folder of their own, never into this checkout: the ``fxkit`` on the page's PATH, and pytest run
from ``~/fxkit``, import them as if they had been added there.

What a machine changes in the output (decimal numbers: memory, durations; the widths of the
tables they sit in; the test's home) is compared in a normal form.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from fxkit.engine.rolevars import BEGIN, END
from fxkit.lab import Fleet

pytestmark = pytest.mark.lab

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
#: What the pages call the reader's home in the output they show.
SHOWN_HOME = "/home/me"

FILE = re.compile(r"^`(~/[^`]+)`:\n\n```[\w-]*\n(.*?)\n```$", re.M | re.S)
PART = re.compile(r"^Part of `(~/[^`]+)`:\n\n```[\w-]*\n(.*?)\n```$", re.M | re.S)
CONSOLE = re.compile(r"^```console\n(.*?)\n```$", re.M | re.S)
#: Commands a page shows that this test does not run: its lab fleet stands in for the page's.
NOT_RUN = ("sudo fxkit lab up",)


@dataclass
class Page:
    """A how-to page as a script: its files, its commands (each with the output it shows), and
    the parts of files it quotes."""

    files: dict[str, str]
    commands: list[tuple[str, str]]
    parts: dict[str, str]

    @classmethod
    def read(cls, name: str) -> Page:
        text = (DOCS / name).read_text()
        commands: list[tuple[str, str]] = []
        for block in CONSOLE.findall(text):
            for chunk in re.split(r"^\$ ", block, flags=re.M)[1:]:
                command, _, output = chunk.partition("\n")
                commands.append((command, output))
        return cls(dict(FILE.findall(text)), commands, dict(PART.findall(text)))


@dataclass
class Home:
    """The reader's home: ``~/site``, ``~/fxkit``, and the page's additions to fxkit."""

    path: Path
    env: dict[str, str]
    cwd: Path = field(init=False)
    #: Around a command (found by a part of its text): the scene the page describes for it.
    scenes: dict[str, Callable[[], AbstractContextManager[None]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.cwd = self.site

    @property
    def site(self) -> Path:
        return self.path / "site"

    @property
    def overlay(self) -> Path:
        """What the page adds to fxkit's checkout."""
        return self.path / "fxkit-additions"

    def local(self, shown: str) -> Path:
        """The path a page's ``~/site/...`` or ``~/fxkit/...`` is here."""
        if shown.startswith("~/fxkit/"):
            return self.overlay / shown.removeprefix("~/fxkit/")
        return self.path / shown.removeprefix("~/")

    def write(self, files: dict[str, str]) -> None:
        for shown, text in files.items():
            path = self.local(shown)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text + "\n")
            if text.startswith("#!"):
                path.chmod(0o755)

    def run(self, command: str) -> tuple[int, str]:
        """Run one of the page's commands as its reader would: its exit code and output."""
        if command.startswith("cd "):
            self.cwd = Path(command[3:].replace("~", str(self.path), 1))
            return 0, ""
        with ExitStack() as stack:
            for trigger, scene in self.scenes.items():
                if trigger in command:
                    stack.enter_context(scene())
            ran = subprocess.run(
                ["bash", "-c", command],
                cwd=self.cwd,
                env=self.env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                timeout=600,
                check=False,
            )
        return ran.returncode, ran.stdout

    def normal(self, text: str) -> str:
        """``text`` with what a machine changes made the same everywhere."""
        text = text.replace(str(self.path), SHOWN_HOME)
        text = re.sub(r"\d+\.\d+", "N", text)
        text = re.sub(r"([━─])\1+", r"\1", text)
        lines = [re.sub(r"[ \t]+", " ", line).strip() for line in text.splitlines()]
        return "\n".join(lines).strip()


def preloader(overlay: Path) -> str:
    """Python that imports the page's modules for fxkit (``~/fxkit/fxkit/...``) under their
    names, as if they were part of the installed fxkit (a kind of measurement registers)."""
    return f"""
import importlib.util, pathlib, sys
OVERLAY = pathlib.Path({str(overlay)!r})
for path in sorted(OVERLAY.glob("fxkit/**/*.py")):
    name = ".".join(path.relative_to(OVERLAY).with_suffix("").parts)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
"""


@pytest.fixture(scope="module")
def lab(lab_fleet: Callable[..., Fleet]) -> Fleet:
    """The pages' lab host (lab01), fresh: check mode must find it as a new node is."""
    if not (ROOT / ".venv" / "bin" / "mypy").exists():
        pytest.skip("the pages run ~/fxkit/.venv/bin/...: make .venv/.installed")
    return lab_fleet(1, name="howto")


@pytest.fixture
def home(tmp_path: Path, lab: Fleet) -> Home:
    path = tmp_path / "home"
    (path / "site").mkdir(parents=True)
    (path / "fxkit").symlink_to(ROOT)
    (path / "site" / ".lab").symlink_to(lab.dir)
    tools = path / "bin"
    tools.mkdir()
    overlay = path / "fxkit-additions"
    fxkit = tools / "fxkit"
    fxkit.write_text(
        f"#!{sys.executable}\n{preloader(overlay)}\n"
        "from fxkit.cli import main\nsys.argv[0] = 'fxkit'\nmain()\n"
    )
    fxkit.chmod(0o755)
    (tools / "howto_preload.py").write_text(preloader(overlay))
    env = {
        **os.environ,
        "HOME": str(path),
        "PATH": f"{tools}:{os.environ['PATH']}",
        "PYTHONPATH": str(tools),
        "COLUMNS": "120",
        "MYPY_CACHE_DIR": str(path / ".mypy_cache"),  # a cache of this machine names old paths
    }
    return Home(path, env)


def run_page(home: Home, page: Page) -> dict[str, int]:
    """Write the page's files, run its commands, compare their output with the page's; the exit
    code of each command by its text."""
    home.write(page.files)
    codes: dict[str, int] = {}
    for command, shown in page.commands:
        if command.startswith(NOT_RUN):
            continue
        code, output = home.run(command)
        assert home.normal(output) == home.normal(shown), (
            f"$ {command}\n(exit code {code}) printed:\n{output}"
        )
        codes[command] = code
    for shown, part in page.parts.items():
        text = home.normal(home.local(shown).read_text())
        for line in home.normal(part).splitlines():
            assert line in text, f"{shown} has no line {line!r}"
    return codes


# -- docs/HOWTO-ROLE.md ---------------------------------------------------------------------------

#: The misspelling the page asks for before it runs mypy.
TYPO = ("if v.timesync_poll_max_s <=", "if v.timesync_poll_max <=")


def timesyncd_installed() -> bool:
    """Whether this machine has systemd-timesyncd: a lab host has this machine's packages, and
    no network to install one."""
    if not shutil.which("dpkg-query"):
        return False
    query = ["dpkg-query", "-W", "-f=${Status}", "systemd-timesyncd"]
    found = subprocess.run(query, capture_output=True, text=True, check=False)
    return found.stdout == "install ok installed"


def test_the_role_page_runs_as_shown(home: Home) -> None:
    if not timesyncd_installed():
        pytest.skip("systemd-timesyncd is not installed here (a lab host has this machine's /usr)")
    page = Page.read("HOWTO-ROLE.md")
    role = home.local("~/site/roles/timesync/role.py")
    readme = home.local("~/site/roles/timesync/README.md")
    shown_readme = page.files["~/site/roles/timesync/README.md"]
    assert f"`{TYPO[1].split()[1]}`" in (DOCS / "HOWTO-ROLE.md").read_text()

    @contextmanager
    def misspelt() -> Iterator[None]:
        text = role.read_text()
        role.write_text(text.replace(*TYPO))
        try:
            yield
        finally:
            role.write_text(text)

    @contextmanager
    def markers_only() -> Iterator[None]:
        start = shown_readme.index("\n", shown_readme.index(BEGIN)) + 1
        readme.write_text(shown_readme[:start] + shown_readme[shown_readme.index(END) :] + "\n")
        yield

    home.scenes = {"mypy": misspelt, "fxkit.reference": markers_only}
    codes = run_page(home, page)

    assert readme.read_text() == shown_readme + "\n"  # the generated table is the page's
    assert [c for command, c in codes.items() if "--check" in command] == [0]
    assert [c for command, c in codes.items() if " -e " in command] == [2, 2]
    assert codes["~/fxkit/.venv/bin/python -m pytest -q tests"] == 0


# -- docs/HOWTO-GATE-CHECK.md ---------------------------------------------------------------------


def test_the_gate_check_page_runs_as_shown(home: Home) -> None:
    memory = Path("/proc/meminfo").read_text().split("MemTotal:")[1].split()[0]
    if int(memory) * 1024 >= 2e12:
        pytest.skip("this machine has the 2 TB the page's check asks for: the page shows a FAIL")
    page = Page.read("HOWTO-GATE-CHECK.md")
    checkout = home.overlay
    checkout.mkdir()
    (checkout / ".venv").symlink_to(ROOT / ".venv")
    (checkout / "tests").mkdir()
    (checkout / "tests" / "data").symlink_to(ROOT / "tests" / "data")

    @contextmanager
    def in_checkout() -> Iterator[None]:
        """pytest run in ~/fxkit: the page's test beside fxkit's, its modules in fxkit."""
        cwd, env = home.cwd, home.env
        home.cwd = checkout
        home.env = {**env, "PYTHONSAFEPATH": "1", "PYTEST_ADDOPTS": "-p howto_preload"}
        try:
            yield
        finally:
            home.cwd, home.env = cwd, env

    home.scenes = {"tests/test_gate_rocm_smi.py": in_checkout}
    codes = run_page(home, page)

    exits = {"--out node-health-1": 1, "evaluate": 0, "pytest": 0, "gpu-idle-1": 1, "gpu-idle-2": 0}
    for command, code in exits.items():
        assert [c for line, c in codes.items() if command in line] == [code], command
    html = home.local("~/site/node-health-1/report.html").read_text()
    assert "host_memory" in html and "FAIL" in html
    passed = home.local("~/site/gpu-idle-2/result.json").read_text()
    assert '"verdict": "PASS"' in passed
