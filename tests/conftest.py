"""Shared fixtures. ``lab_fleet(n)`` starts real SSH hosts on this machine (see fxkit.lab).

Usage::

    def test_something(lab_fleet):
        fleet = lab_fleet(4)                 # the session's shared fleet, grown to 4 hosts
        with fleet.connect("lab01") as conn:
            conn.run("hostname")

    def test_breaks_hosts(lab_fleet):
        fleet = lab_fleet(2, name="mine")    # a fleet of its own (stop hosts, change keys...)

    def test_gpu_node(lab_fleet):
        fleet = lab_fleet(1, name="gpu", profile="mi308x")   # simulated MI308X hosts

    def test_small_hosts(lab_fleet):
        fleet = lab_fleet(1, name="small", limits=Limits(memory=256 * 2**20, pids=100))

Each fleet lives in a temporary state directory on its own random 127.x.y addresses, so several
test sessions (and developers' fleets) run side by side; every fleet is stopped by PID when the
session ends. Tests are skipped, with the reason, where the lab cannot run (not root, no sshd).
"""

from __future__ import annotations

import random
import socket
import sys
import types
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import systemd_host
from systemd_host import SystemdHost

from fxkit.connection.base import Connection
from fxkit.lab import SUDO_USER, AddressInUse, Fleet, LabError, check_requirements
from fxkit.lab.resources import Limits

# ``from tests.X import ...`` means this folder: cufile-python (a dependency of LMCache, the kv
# extra) installs a top-level package named ``tests``, which would win over this folder (a
# namespace package, which any regular package of the same name beats).
_tests = types.ModuleType("tests")
_tests.__path__ = [str(Path(__file__).resolve().parent)]
sys.modules["tests"] = _tests


@pytest.fixture(scope="session", autouse=True)
def shm_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The loader's node-shared state (``share=True``, on in the vLLM plugin) goes to a folder of
    the test run, not to this machine's /dev/shm (tests that need /dev/shm itself set their own)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FXKIT_SHM_DIR", str(tmp_path_factory.mktemp("shm")))
        yield


@pytest.fixture(scope="session")
def lab_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., Fleet]]:
    """A factory: ``lab_fleet(n, name="shared", profile=None, limits=None)`` -> fleet ``name``
    with lab01..labNN up (a fleet keeps the profile and limits it was first made with)."""
    fleets: dict[str, Fleet] = {}
    rng = random.Random()

    def make(
        count: int, name: str = "shared", profile: str | None = None, limits: Limits | None = None
    ) -> Fleet:
        try:
            check_requirements()
        except LabError as exc:
            pytest.skip(f"the lab fleet cannot run here: {exc}")
        if name not in fleets:
            state = tmp_path_factory.mktemp(f"lab-{name}")
            fleets[name] = _new_fleet(state, count, rng, profile, limits)
        fleet = fleets[name]
        fleet.up(count, profile=profile, limits=limits)
        return fleet

    yield make
    for fleet in fleets.values():
        fleet.down()


@pytest.fixture(scope="session")
def systemd_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SystemdHost]:
    """A host where systemd runs (tests/systemd_host.py), booted once for the session; skipped,
    with the reason, where it cannot run."""
    why = systemd_host.missing()
    if why:
        pytest.skip(f"no systemd host here: {why}")
    host = SystemdHost(tmp_path_factory.mktemp("systemd-host"), _free_address())
    try:
        host.up()
    except systemd_host.Unavailable as exc:
        host.down()
        pytest.skip(f"no systemd host here: {exc}")
    except BaseException:
        host.down()  # what did start (a timeout, Ctrl-C)
        raise
    try:
        yield host
    finally:
        host.down()


@pytest.fixture(scope="session")
def fleet(lab_fleet: Callable[..., Fleet]) -> Fleet:
    """The operation tests' own lab host (they change /etc, /usr and users: not the shared one)."""
    return lab_fleet(1, name="ops")


@pytest.fixture
def sudo_user(fleet: Fleet) -> str:
    """The lab hosts' non-root user that may sudo (with the fleet's become password)."""
    if fleet.become_password() is None:
        pytest.skip("sudo is not installed: lab hosts have no non-root user (apt-get install sudo)")
    return SUDO_USER


@pytest.fixture
def root(fleet: Fleet) -> Iterator[Connection]:
    """A root connection to the operation tests' lab host."""
    with fleet.connect("lab01") as conn:
        yield conn


def _free_address() -> str:
    """A random 127.x.y.1 on which nothing listens on port 22 (the lab's fleets take 127.100+)."""
    rng = random.Random()
    for _ in range(20):
        address = f"127.{rng.randint(60, 99)}.{rng.randint(0, 255)}.1"
        with socket.socket() as sock:
            sock.settimeout(0.5)
            if sock.connect_ex((address, 22)) != 0:
                return address
    raise LabError("no free 127.x.y.1 address for the systemd lab host after 20 tries")


def _new_fleet(
    state_dir, count: int, rng: random.Random, profile: str | None, limits: Limits | None
) -> Fleet:
    """Start a fleet on random addresses, trying others when another fleet holds them."""
    for _ in range(5):
        fleet = Fleet(state_dir, prefix=f"127.{rng.randint(100, 250)}.{rng.randint(0, 255)}")
        try:
            fleet.up(count, profile=profile, limits=limits)
        except AddressInUse:
            fleet.down()
            continue
        except BaseException:
            fleet.down()  # the hosts that did start, by PID
            raise
        return fleet
    raise LabError("no free 127.x.y addresses for a lab fleet after 5 tries")
