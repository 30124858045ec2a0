"""The host's own tools that roles/rocm_host reads: lscpu, dkms, update-grub.

- ``lscpu`` prints the profile's recorded output (``cpu.lscpu``: util-linux's expected output of
  a real EPYC dump), whatever the machine under the lab is;
- ``dkms`` keeps its modules in /var/lib/fxkit-lab/dkms.json: ``add``, ``build``, ``install``
  (which need the kernel's headers, /lib/modules/KERNEL/build, as dkms does) and ``status`` in
  dkms 3's format (dkms-project/dkms run_test.sh);
- ``update-grub`` sources /etc/default/grub and /etc/default/grub.d/*.cfg as grub-mkconfig does
  and writes /boot/grub/grub.cfg with a default and a recovery entry as Ubuntu's 10_linux
  writes their ``linux`` lines: the file is for reading back, it boots nothing.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from .common import Profile, Tool, fail, load_state, new_parser, save_state

GRUB_DEFAULTS, GRUB_DROPINS = Path("/etc/default/grub"), Path("/etc/default/grub.d")
GRUB_CFG = Path("/boot/grub/grub.cfg")


def lscpu(p: Profile, args: list[str], stdin: str, entry: dict[str, Any]) -> int:
    if args:
        fail("lscpu", f"the lab's lscpu prints its recorded output only, without {args}", 2)
    sys.stdout.write((p["dir"] / p["cpu"]["lscpu"]).read_text())
    return 0


# -- dkms ------------------------------------------------------------------------------------


def dkms(p: Profile, args: list[str], stdin: str, entry: dict[str, Any]) -> int:
    parser = new_parser("dkms")
    parser.add_argument("action", choices=("status", "add", "build", "install"))
    parser.add_argument("module_version", nargs="?", default="")
    parser.add_argument("-m", dest="module", default="")
    parser.add_argument("-v", dest="version", default="")
    parser.add_argument("-k", dest="kernel", default="")
    opts = parser.parse_args(args)
    module, _, version = opts.module_version.partition("/")
    module, version = opts.module or module, opts.version or version
    modules: dict[str, dict[str, Any]] = load_state("dkms.json", {})
    if opts.action == "status":
        _status(modules, module, version, opts.kernel)
        return 0
    if not module or not version:
        fail("", f"Error! dkms {opts.action} needs a module and a version (-m M -v V or M/V)", 1)
    key = f"{module}/{version}"
    if opts.action == "add":
        modules.setdefault(key, {"kernels": {}})
        save_state("dkms.json", modules)
        source = f"/var/lib/dkms/{module}/{version}/source"
        print(f"Creating symlink {source} -> /usr/src/{module}-{version}")
        return 0
    if key not in modules:
        fail("", f"Error! The module/version combo: {key} is not located in the DKMS tree.", 3)
    kernel = opts.kernel or os.uname().release
    if not any(Path(f"/lib/modules/{kernel}/{d}").exists() for d in ("build", "source")):
        fail(
            "",
            f"Error! Your kernel headers for kernel {kernel} cannot be found at "
            f"/lib/modules/{kernel}/build or /lib/modules/{kernel}/source.\n"
            f"Please install the linux-headers-{kernel} package or use the --kernelsourcedir "
            "option to tell DKMS where it's located.",
            21,
        )
    state = "installed" if opts.action == "install" else "built"
    modules[key]["kernels"][kernel] = {"arch": os.uname().machine, "state": state}
    save_state("dkms.json", modules)
    print(f"Building module(s)... done.\n{module}.ko: {state} for {kernel}")
    return 0


def _status(modules: dict[str, dict[str, Any]], module: str, version: str, kernel: str) -> None:
    for key in sorted(modules):
        name, _, ver = key.partition("/")
        if (module and name != module) or (version and ver != version):
            continue
        kernels = modules[key]["kernels"]
        if not kernels and not kernel:
            print(f"{key}: added")
        for k, built in sorted(kernels.items()):
            if not kernel or k == kernel:
                print(f"{key}, {k}, {built['arch']}: {built['state']}")


# -- update-grub -----------------------------------------------------------------------------

#: grub-mkconfig's sourcing of the defaults (util/grub-mkconfig.in, Debian's grub.d loop).
_SOURCE = (
    'for f in "$1" "$2"/*.cfg; do [ -e "$f" ] || continue; '
    'echo "Sourcing file \\`$f\'" >&2; . "$f" >/dev/null; done; '
    'printf "%s\\0%s\\0" "${GRUB_CMDLINE_LINUX-}" "${GRUB_CMDLINE_LINUX_DEFAULT-}"'
)


def update_grub(p: Profile, args: list[str], stdin: str, entry: dict[str, Any]) -> int:
    if args:
        fail("update-grub", f"the lab's update-grub takes no arguments, not {args}", 2)
    read = subprocess.run(
        ["sh", "-c", _SOURCE, "sh", str(GRUB_DEFAULTS), str(GRUB_DROPINS)],
        capture_output=True,
        text=True,
        check=False,
    )
    sys.stderr.write(read.stderr)
    if read.returncode:
        return read.returncode
    linux, default = read.stdout.split("\0")[:2]
    kernel = os.uname().release
    image, root = f"/boot/vmlinuz-{kernel}", "root=UUID=fxkit-lab ro"
    entries = [("Ubuntu", f"{linux} {default}"), ("recovery mode", f"recovery nomodeset {linux}")]
    text = "# Written by the fxkit lab's update-grub stand-in: it boots nothing.\n"
    for title, words in entries:
        text += (
            f"menuentry 'Ubuntu, with Linux {kernel} ({title})' {{\n"
            f"\tlinux\t{image} {root} {' '.join(words.split())}\n"
            f"\tinitrd\t/boot/initrd.img-{kernel}\n}}\n"
        )
    print("Generating grub configuration file ...", file=sys.stderr)
    GRUB_CFG.parent.mkdir(parents=True, exist_ok=True)
    GRUB_CFG.write_text(text)
    print("done", file=sys.stderr)
    return 0


TOOLS: dict[str, Tool] = {"lscpu": lscpu, "dkms": dkms, "update-grub": update_grub}
