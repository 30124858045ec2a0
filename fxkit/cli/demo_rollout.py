"""The demo's rollout step: serve-probe instances in vLLM's place on the lab's GPU nodes.

The model, a small generated checkpoint, lies in the lab's NFS stand-in (a folder every lab host
of a profile sees); roles/vllm_lmcache stages it onto each node with ``fxkit stage`` and starts
the example inventory's layout (TP4x2: two instances per node) with ``fxkit rollout --canary``.
The virtualenvs come from a wheelhouse made of what this machine has installed
(:mod:`fxkit.lab.wheelhouse`): no network. What vLLM would need and a lab cannot give (ROCm
wheels, GPUs, /mnt/local's NVMe-oF namespace) is replaced by the variables of
:func:`rollout_vars`, written to a file the user can give again with ``-e @FILE``.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.text import Text

from fxkit.connection import ConnectOptions
from fxkit.engine.console import console_recorder
from fxkit.engine.runner import RunOptions, run_playbook
from fxkit.engine.variables import parse_extra_vars
from fxkit.lab import Fleet, wheelhouse
from fxkit.lab.standins.common import SHARED
from fxkit.rollout import rollout, table
from fxkit.rollout.report import InstanceStatus

WHEELS = Path(".cache/demo-wheels")
MODEL_CACHE = Path(".cache/demo-model")
MODEL_SIZE = 48_000_000
VARS = Path(".cache/demo-rollout.yml")
#: What the lab's virtualenvs hold: fxkit with its loader, and serve-probe's HTTP server.
REQUIREMENTS = ["fxkit[loader,probe]"]
SERVED = "demo"
#: roles/vllm_lmcache's variable of the instances a run starts ([]: none, only what they need).
SELECT = "vllm_lmcache_rollout_instances"
PROMPT = {"model": SERVED, "prompt": "Hello", "max_tokens": 8}


def rollout_vars(house: Path, nfs: str) -> dict[str, Any]:
    """roles/vllm_lmcache's variables for the lab (every other one is the inventory's)."""
    return {
        "vllm_lmcache_server": "serve-probe",  # vLLM cannot run without GPUs
        "vllm_lmcache_vllm_version": False,
        "vllm_lmcache_lmcache_version": False,  # (its wheels are GPU builds)
        "vllm_lmcache_torch_version": metadata.version("torch"),
        "vllm_lmcache_python": "/usr/bin/python3",  # the lab's Python: this machine's
        "vllm_lmcache_wheelhouse": str(house.resolve()),
        "vllm_lmcache_fxkit_wheel": "",
        "vllm_lmcache_packages": ["uvicorn", "starlette", "prometheus_client"],
        "vllm_lmcache_model_source": nfs,
        "vllm_lmcache_model": "/mnt/local/models/demo",
        "vllm_lmcache_served_name": SERVED,
        "vllm_lmcache_extra_args": [],  # vLLM's flags
        "vllm_lmcache_bind_host": "{{ ansible_host }}",
        "vllm_lmcache_local_disk": "/tmp/lmcache",  # a lab host's /tmp is a tmpfs of its own
        "vllm_lmcache_max_local_disk_size": 0.01,
        "vllm_lmcache_ready_timeout": 300,
    }


def lab_python_differs() -> str:
    """Why the wheels of this environment cannot run on the lab hosts ("" when they can): the
    hosts run this machine's /usr/bin/python3."""
    try:
        done = subprocess.run(
            ["/usr/bin/python3", "-c", "import sys; print(*sys.version_info[:2])"],
            capture_output=True, text=True, timeout=30, check=True,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return "the lab hosts' /usr/bin/python3 does not run here"
    theirs = tuple(int(n) for n in done.stdout.split())
    if theirs != sys.version_info[:2]:
        return (
            f"fxkit runs on Python {sys.version_info[0]}.{sys.version_info[1]} and the lab hosts "
            f"on /usr/bin/python3 ({'.'.join(map(str, theirs))}): the wheels made from this "
            "environment would not install there; install fxkit with /usr/bin/python3"
        )
    return ""


def rollout_demo(
    console: Console,
    fleet: Fleet,
    sources: list[Path],
    nodes: list[str],
    checkpoint: Callable[[Path, int], list[Path]],
) -> bool:
    """The model staged and the example's instances rolled out (canary first) on ``nodes``;
    the table, the command again, and a completion answered. False when it did not go so."""
    why = lab_python_differs()
    if why:
        console.print(f"SKIPPED: {why}", style="bold yellow")
        return True
    started = time.monotonic()
    house = wheelhouse.make(REQUIREMENTS, WHEELS / "house", WHEELS / "cache")
    console.print(
        f"wheelhouse: {len(house)} wheels from this environment in "
        f"{time.monotonic() - started:.1f} s ({WHEELS / 'house'}; no network)"
    )
    files = checkpoint(MODEL_CACHE, MODEL_SIZE)
    nfs = Path("nfs/models/demo")
    (fleet.shared_dir / nfs).mkdir(parents=True, exist_ok=True)
    for file in [*files, *MODEL_CACHE.glob("*.safetensors.index.json")]:
        shutil.copy2(file, fleet.shared_dir / nfs / file.name)
    console.print(
        f"model: {len(files)} file(s) in the lab's NFS stand-in, {SHARED / nfs} on every node"
    )
    VARS.write_text(yaml.safe_dump(rollout_vars(WHEELS / "house", str(SHARED / nfs))))
    limit = ":".join(nodes)
    common = [*(a for s in sources for a in ("-i", str(s))), "-e", f"@{VARS}", "--limit", limit]
    connect = ConnectOptions(known_hosts=str(fleet.known_hosts))
    extra = parse_extra_vars([f"@{VARS}"])

    # Every node at once: the virtualenv from the wheelhouse and the model staged, no instance
    # started; then the rollout's batches only start instances, the canary first.
    console.print(Text(shlex.join(["fxkit", "play", "rollout", *common, "-e", f"{SELECT}=[]"])))
    options = RunOptions(limit=limit, extra_vars={**extra, SELECT: []}, connect=connect)
    if run_playbook("rollout", sources, options, console_recorder(console)).exit_code:
        return False
    console.print(Text(shlex.join(["fxkit", "rollout", *common, "--canary", "--serial", "2"])))
    options = RunOptions(limit=limit, extra_vars=extra, connect=connect)
    recorder = console_recorder(console)
    result = rollout("rollout", sources, options, recorder, serial=[2], canary=True)
    console.print(table(result))
    if result.stopped:
        console.print(f"STOPPED: {result.stopped}", style="bold red")
        return False
    serving = (InstanceStatus.READY, InstanceStatus.UNCHANGED)
    ready = [i for i in result.instances if i.status in serving]
    if len(ready) != len(result.instances) or not ready:
        return False
    return completion(console, fleet, ready[0].host, ready[0].address, ready[0].port)


def completion(console: Console, fleet: Fleet, host: str, address: str, port: int) -> bool:
    """A completion from one instance, asked on its node with curl (the lab's hosts are reached
    only through SSH); the command printed for the user to run."""
    curl = shlex.join(
        ["curl", "-sS", f"http://{address}:{port}/v1/completions", "-H",
         "Content-Type: application/json", "-d", json.dumps(PROMPT)]
    )  # fmt: skip
    hostvars = fleet.hostvars(host)
    login = f"{hostvars['ansible_user']}@{hostvars['ansible_host']}"
    login_cmd = shlex.join(
        ["ssh", "-i", str(hostvars["ansible_ssh_private_key_file"]), "-o",
         f"UserKnownHostsFile={fleet.known_hosts}", login]
    )  # fmt: skip
    console.print(f"ask it yourself, on {host} ({login_cmd}):")
    console.print(Text(f"  {curl}"))
    with fleet.connect(host) as conn:
        done = conn.run(curl)
    try:
        answer = json.loads(done.stdout)["choices"][0]["text"]
    except (ValueError, KeyError, IndexError, TypeError):
        console.print(Text(f"no completion: {done.stdout or done.stderr}"), style="bold red")
        return False
    console.print(Text(f"{host}:{port} answered: {answer!r}"), style="bold green")
    return True
