#!/usr/bin/env python3
"""A rollout of a new revision under traffic, measured: requests failed and their latency during
the rollout against before it, per instance the time out of service and to ready, the fleet's
rollout duration.

A fresh lab fleet (2 hosts by default) each with 4 serve-probe instances of one GPU each on a
5-GPU layout (1 slot free), from roles/vllm_lmcache and the lab wheelhouse of
tests/lab_wheelhouse.py, serving a generated checkpoint (each answer takes
``PROBE_COMPLETION_SECONDS`` = 0.2 s). On each host bench/rollout_lb.py balances round-robin over
its instances and a closed-loop client (4 workers) sends through it: lab hosts cannot reach each
other, nor the controller their instances. The balancers' control plane (:class:`Balancer`) is
an HTTP endpoint on the controller, as a user's load balancer has one: the rollout's register
and deregister hooks POST to it, and it rewrites that host's backends file over a connection it
keeps open, noting when each backend left and rejoined the rotation: the time not serving as
the balancer saw it. The rollout changes the unit alone (a new revision), ``--serial 1`` (and
``--max-surge N`` with ``--max-surge``).

With ``--rollback``, a canary of a revision that cannot start (its model is missing) follows,
drained first (no surge), the traffic still running: how long until the rollout stopped with the
canary rolled back, against the readiness timeout (``--ready-timeout``) + 10 s, and whether
every instance serves the previous revision again (``fxkit rollout status``).

    sudo .venv/bin/python bench/rollout_bench.py --json docs/bench/rollout.json
    sudo .venv/bin/python bench/rollout_bench.py --max-surge 1 --rollback \
        --json docs/bench/rollout_surge.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

from fxkit import paths
from fxkit.lab import Fleet

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
import lab_wheelhouse  # type: ignore[import-not-found]  # noqa: E402  (the lab tests' wheels)
from rollout_lb import edit_command  # type: ignore[import-not-found]  # noqa: E402  (beside this)

FXKIT = Path(sys.executable).with_name("fxkit")
LB = "/root/lb"
#: How often a switched instance's readiness is polled (roles/vllm_lmcache/role.py,
#: ``switch_ready``): its time to ready is known to this resolution.
READY_POLL_S = 0.2
MODEL, NFS = "/srv/fast/tiny", "/srv/nfs/tiny"
NFS_ROLE = """
from pathlib import Path


def apply(host, v):
    host.directory(v.nfs_path, mode="0755")
    for file in sorted(Path(v.nfs_checkpoint).iterdir()):
        host.copy(str(file), f"{v.nfs_path}/{file.name}", mode="0644")
"""


def sh(*argv: str, timeout: float = 1800) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if done.returncode not in (0, 1):
        raise SystemExit(f"{argv[:3]} exited {done.returncode}: {done.stderr[-2000:]}")
    return done.stdout


def prepare(fleet: Fleet, folder: Path, hosts: list[str], ready_timeout: int) -> Path:
    """The playbook, the checkpoint and the inventory; returns the inventory."""
    house = lab_wheelhouse.build(folder / "wheels")
    sh(str(FXKIT), "make-checkpoint", str(folder / "ckpt"), "--size", "48MB", "--shards", "2")
    (folder / "roles" / "lab_nfs").mkdir(parents=True)
    (folder / "roles" / "lab_nfs" / "role.py").write_text(NFS_ROLE)
    book = yaml.safe_load(paths.builtin("playbooks").joinpath("rollout.yml").read_text())
    play = {"name": "NFS stand-in", "hosts": "gpu_nodes", "roles": ["lab_nfs"]}
    (folder / "rollout.yml").write_text(yaml.safe_dump([play, *book]))
    data = yaml.safe_load(fleet.inventory.read_text())
    data["all"]["vars"] = {
        **data["all"].get("vars", {}),
        "vllm_lmcache_deployment": "bench",
        "vllm_lmcache_vllm_version": False,
        "vllm_lmcache_torch_version": "2.13.0+cpu",
        "vllm_lmcache_lmcache_version": False,
        "vllm_lmcache_server": "serve-probe",
        "vllm_lmcache_python": "/usr/bin/python3",
        "vllm_lmcache_wheelhouse": str(house),
        "vllm_lmcache_packages": ["uvicorn", "starlette", "prometheus_client"],
        "vllm_lmcache_model": MODEL,
        "vllm_lmcache_model_source": NFS,
        "vllm_lmcache_served_name": "tiny",
        "vllm_lmcache_layout": [[0], [1], [2], [3]],
        "vllm_lmcache_gpus": 5,
        "vllm_lmcache_bind_host": "{{ ansible_host }}",
        "vllm_lmcache_kv_connector": None,
        # /tmp is a mount of its own on a lab host (tmpfs), as tests/test_role_vllm_lmcache_lab.py
        "vllm_lmcache_local_disk": "/tmp/lmcache",
        "vllm_lmcache_max_local_disk_size": 0.01,
        "vllm_lmcache_ready_timeout": ready_timeout,
        "vllm_lmcache_env": {"PROBE_COMPLETION_SECONDS": "0.2"},
        "nfs_path": NFS,
        "nfs_checkpoint": str(folder / "ckpt"),
    }
    data["all"]["children"]["gpu_nodes"] = {"hosts": {h: {} for h in hosts}}
    inv = folder / "inventory.yml"
    inv.write_text(yaml.safe_dump(data))
    return inv


class Balancer:
    """The balancers' control plane: fxkit's hooks POST ``{event, host, address, port}`` to
    :attr:`url`; the backend leaves or joins that host's backends file (rewritten whole over a
    connection kept open), and :attr:`events` notes when each change took effect."""

    def __init__(self, fleet: Fleet, hosts: list[str]) -> None:
        self.held = ExitStack()
        self.conns = {h: self.held.enter_context(fleet.connect(h)) for h in hosts}
        self.locks = {h: threading.Lock() for h in hosts}
        #: (event, "host/address:port", time.time() once it took effect)
        self.events: list[tuple[str, str, float]] = []
        balancer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                fields = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                error = balancer.apply(fields)
                self.send_response(500 if error else 200)
                self.send_header("Content-Length", str(len(error)))
                self.end_headers()
                self.wfile.write(error.encode())

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/backends"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def apply(self, fields: dict[str, str]) -> str:
        """Take the backend out of, or into, its host's rotation; what went wrong ("")."""
        host, event = fields["host"], fields["event"]
        backend = f"{fields['address']}:{fields['port']}"
        with self.locks[host]:
            done = self.conns[host].run(edit_command(f"{LB}/backends", backend, event))
            self.events.append((event, f"{host}/{backend}", time.time()))
        return "" if done.ok else done.stderr

    def out_of_rotation(self, since: float) -> dict[str, float]:
        """Seconds each backend spent out of the rotation after ``since`` (deregister to the
        next register)."""
        left: dict[str, float] = {}
        spans: dict[str, float] = {}
        for event, backend, at in self.events:
            if at < since:
                continue
            if event == "deregister":
                left[backend] = at
            elif backend in left:
                spans[backend] = round(at - left.pop(backend), 3)
        return spans

    def close(self) -> None:
        self.server.shutdown()
        self.held.close()


def rollout(folder: Path, inv: Path, balancer: Balancer, *args: str) -> dict[str, Any]:
    report = folder / "report.json"
    sh(str(FXKIT), "rollout", str(folder / "rollout.yml"), "-i", str(inv), "--report",
       str(report), "--deregister-hook", balancer.url, "--register-hook", balancer.url,
       *args)  # fmt: skip
    result: dict[str, Any] = json.loads(report.read_text())
    return result


def traffic(fleet: Fleet, hosts: list[str], workers: int) -> None:
    script = (ROOT / "bench/rollout_lb.py").read_bytes()
    for host in hosts:
        address = fleet.address(host)
        backends = "".join(f"{address}:{8000 + i}\n" for i in range(4))
        with fleet.connect(host) as conn:
            conn.run(f"mkdir -p {LB} && rm -f {LB}/stop {LB}/client.json")
            conn.put(f"{LB}/rollout_lb.py", script)
            conn.put(f"{LB}/backends", backends.encode())
            lb = f"python3 {LB}/rollout_lb.py"
            conn.run(
                f"setsid {lb} proxy --listen 127.0.0.1:9000 --backends {LB}/backends "
                f"</dev/null >{LB}/proxy.log 2>&1 & sleep 0.5; setsid {lb} client --url "
                f"http://127.0.0.1:9000 --model tiny --workers {workers} --stop {LB}/stop "
                f"--out {LB}/client.json </dev/null >{LB}/client.log 2>&1 &"
            )


def collect(fleet: Fleet, hosts: list[str]) -> list[dict[str, Any]]:
    found = []
    for host in hosts:
        with fleet.connect(host) as conn:
            conn.run(f"touch {LB}/stop")
            deadline = time.monotonic() + 120
            while (raw := conn.get(f"{LB}/client.json")) is None:
                if time.monotonic() > deadline:
                    raise SystemExit(f"{host}: the client wrote no counts")
                time.sleep(0.5)
        found.append(json.loads(raw))
    return found


def status(folder: Path, inv: Path) -> list[dict[str, Any]]:
    """``fxkit rollout status``'s instances."""
    report = folder / "status.json"
    sh(str(FXKIT), "rollout", "status", str(folder / "rollout.yml"), "-i", str(inv), "--report",
       str(report))  # fmt: skip
    found: list[dict[str, Any]] = json.loads(report.read_text())["instances"]
    return found


def vary(inv: Path, **values: Any) -> None:
    data = yaml.safe_load(inv.read_text())
    data["all"]["vars"].update(values)
    inv.write_text(yaml.safe_dump(data))


def rollback(folder: Path, inv: Path, balancer: Balancer, ready_timeout: int) -> dict[str, Any]:
    """A canary that cannot start, rolled back: timed, and what serves afterwards."""
    wanted = status(folder, inv)
    vary(inv, vllm_lmcache_model="/srv/fast/missing", vllm_lmcache_model_source="")
    start = time.monotonic()
    report = rollout(folder, inv, balancer, "--canary", "--serial", "1")
    took = time.monotonic() - start
    vary(inv, vllm_lmcache_model=MODEL, vllm_lmcache_model_source=NFS)
    after = status(folder, inv)
    [canary] = [i for i in report["instances"] if i["batch"] == 1]
    return {
        "exit_code": report["exit_code"],
        "canary": f"{canary['host']}/{canary['name']}",
        "canary_status": canary["status"],
        "stopped": report["stopped"],
        "rollback_s": round(took, 1),
        "ready_timeout_s": ready_timeout,
        "within_ready_timeout_plus_10_s": took <= ready_timeout + 10,
        "untouched": sum(i["status"] == "not_run" for i in report["instances"]),
        "serving_previous_revision": all(
            a["running"] == b["running"] and a["health"] == "ready"
            for a, b in zip(after, wanted, strict=True)
        ),
    }


def backend(instance: dict[str, Any]) -> str:
    """The balancer's name of a report's instance."""
    return f"{instance['host']}/{instance['address']}:{instance['port']}"


def latency(samples: list[list[Any]], start: float, end: float) -> dict[str, Any]:
    within = [s[1] for s in samples if start <= s[0] < end]
    failed = sum(1 for s in samples if start <= s[0] < end and not s[2])
    if not within:
        return {"requests": 0, "failed": 0}
    cut = statistics.quantiles(within, n=100) if len(within) > 1 else [within[0]] * 99
    return {
        "requests": len(within),
        "failed": failed,
        "p50_ms": round(1000 * cut[49], 1),
        "p99_ms": round(1000 * cut[98], 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hosts", type=int, default=2)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--before", type=float, default=20.0, help="seconds of traffic first")
    parser.add_argument("--max-surge", type=int, default=0, help="fxkit rollout --max-surge")
    parser.add_argument("--rollback", action="store_true", help="then a failed canary")
    parser.add_argument("--ready-timeout", type=int, default=600, help="seconds (the role's)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    hosts = [f"lab{i:02d}" for i in range(1, args.hosts + 1)]
    with tempfile.TemporaryDirectory(prefix="fxkit-rollout-bench-") as tmp:
        folder = Path(tmp)
        fleet = Fleet(folder / "lab", prefix="127.231.7")
        fleet.up(args.hosts)
        balancer = None
        try:
            inv = prepare(fleet, folder, hosts, args.ready_timeout)
            balancer = Balancer(fleet, hosts)
            first = rollout(folder, inv, balancer, "--serial", "100%")
            why = [f"{i['host']}/{i['name']}: {i['msg']}" for i in first["instances"]]
            assert first["exit_code"] == 0, (first["stopped"], why)
            traffic(fleet, hosts, args.workers)
            time.sleep(args.before)
            vary(inv, vllm_lmcache_unit_options={"Nice": "1"})
            load = [os.getloadavg()[0]]
            start = time.time()
            report = rollout(
                folder, inv, balancer, "--serial", "1", "--max-surge", str(args.max_surge)
            )
            end = time.time()
            out_of_rotation = balancer.out_of_rotation(start)
            load.append(os.getloadavg()[0])
            time.sleep(args.before / 2)
            back = rollback(folder, inv, balancer, args.ready_timeout) if args.rollback else None
            counts = collect(fleet, hosts)
        finally:
            if balancer is not None:
                balancer.close()
            fleet.down()
    samples = [s for c in counts for s in c["samples"]]
    result = {
        "hosts": args.hosts,
        "instances": len(report["instances"]),
        "max_surge": args.max_surge,
        "exit_code": report["exit_code"],
        "rollout_s": round(end - start, 1),
        "load_average_1min": {"start": round(load[0], 1), "end": round(load[1], 1)},
        "sent": sum(c["sent"] for c in counts),
        "failed": sum(c["failed"] for c in counts),
        "failures": [f for c in counts for f in c["failures"]][:10],
        "before": latency(samples, start - args.before, start),
        "during": latency(samples, start, end),
        "per_instance": {
            f"{i['host']}/{i['name']}": {
                "drain_s": i["drain_s"],
                "time_to_ready_s": i["time_to_ready_s"],
                "not_serving_s": i["not_serving_s"],
                "balancer_not_serving_s": out_of_rotation.get(backend(i)),
                "register_hook_s": i["register_s"],
                "surge": i.get("surge", ""),
                "no_surge": i.get("no_surge", ""),
            }
            for i in report["instances"]
        },
    }
    # The target (issue 25): time not serving <= drain + time to ready (no surge), as fxkit
    # timed it (deregister hook done to register hook done) and as the balancer saw it.
    for key, seen in (("", "not_serving_s"), ("balancer_", "balancer_not_serving_s")):
        over = [
            i[seen] - i["drain_s"] - i["time_to_ready_s"]
            for i in result["per_instance"].values()
            if None not in (i[seen], i["drain_s"], i["time_to_ready_s"])
        ]
        result[f"{key}beyond_drain_and_ready_s"] = (
            {"min": round(min(over), 3), "max": round(max(over), 3)} if over else None
        )
        result[f"{key}not_serving_within_drain_plus_ready"] = bool(over) and max(over) <= 0
        result[f"{key}within_readiness_resolution"] = bool(over) and max(over) <= READY_POLL_S
    if back is not None:
        result["after"] = latency(samples, end, time.time() + 1)
        result["rollback"] = back
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
