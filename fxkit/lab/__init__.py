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

__all__ = [
    "DEFAULT_DIR",
    "DIR_ENV",
    "PORT_ENV",
    "PREFIX_ENV",
    "SUDO_USER",
    "AddressInUse",
    "Fleet",
    "HostStatus",
    "LabError",
    "check_requirements",
]
