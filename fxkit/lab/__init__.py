"""The lab fleet: real, isolated SSH hosts on this one machine (``fxkit lab up/status/down``)."""

from fxkit.lab.fleet import (
    DEFAULT_DIR,
    DIR_ENV,
    PORT_ENV,
    PREFIX_ENV,
    SUDO_USER,
    AddressInUse,
    Fleet,
    HostStatus,
    LabError,
    check_requirements,
)
from fxkit.lab.profile import CALL_LOG, FABRIC, MARKER, calls

__all__ = [
    "CALL_LOG",
    "DEFAULT_DIR",
    "DIR_ENV",
    "FABRIC",
    "MARKER",
    "PORT_ENV",
    "PREFIX_ENV",
    "SUDO_USER",
    "AddressInUse",
    "Fleet",
    "HostStatus",
    "LabError",
    "calls",
    "check_requirements",
]
