"""Facts about hosts: a command plus a parser, cached per host per run."""

from fxkit.facts.apt import HeldPackages
from fxkit.facts.base import Fact, FactCache, FactError
from fxkit.facts.capabilities import CAP_SYS_ADMIN, Capabilities
from fxkit.facts.commands import CommandJSON, CommandOutput
from fxkit.facts.files import FileInfo, FileStat
from fxkit.facts.kernel import ModuleInfo, ModuleState, SysctlInfo, SysctlState
from fxkit.facts.packages import InstalledPackages
from fxkit.facts.python import VenvPackages
from fxkit.facts.system import Cpu, InitSystem, Kernel, Memory, Mounts, OsRelease
from fxkit.facts.users import GroupMembership

__all__ = [
    "CAP_SYS_ADMIN",
    "Capabilities",
    "CommandJSON",
    "CommandOutput",
    "Cpu",
    "Fact",
    "FactCache",
    "FactError",
    "FileInfo",
    "FileStat",
    "GroupMembership",
    "HeldPackages",
    "InitSystem",
    "InstalledPackages",
    "Kernel",
    "Memory",
    "ModuleInfo",
    "ModuleState",
    "Mounts",
    "OsRelease",
    "SysctlInfo",
    "SysctlState",
    "VenvPackages",
]
