"""Staging benchmark: ``fxkit stage`` against ``cp -r`` and ``rsync -a`` of the same checkpoint,
and fio's sequential read limit of the source disk, side by side in one run.

Each round copies the same generated checkpoint with every method (the order rotates from
round to round), each from a cold cache (the destination emptied and synced, then
``echo 1 > /proc/sys/vm/drop_caches``) and timed from the start of the command until its copy is
on the destination's store (``sync -f`` on it after cp and rsync, which do not fsync; fxkit
fsyncs every file itself and gets the same ``sync -f``); fxkit with its default checksum
(BLAKE3), with ``--checksum sha256`` and with ``--verify``. Then fio reads the source files with a
few settings, each cold: the round's fastest is the read limit (fio-best); and, with that
setting, fio reads the source while it writes as many bytes to the destination (fio-copy: the
limit of a copy when both share a disk). Round 1 checks every method's copy (sha256 of every
file against the source). Ratios are medians of within-round ratios. ``--before FXKIT`` runs a
second fxkit executable too (``fxkit-before``: the code before a change, side by side).

With ``--loop`` the script makes its own isolated storage, as the loader benchmarks did
(docs/BENCHMARKS.md, "Results for issue 10"): the source on an ext4 on a loop device with direct
I/O to a file in /var/tmp (so every read reaches the disk), the destination on a tmpfs (a store
that is not the limit: the copy is measured against the source's reads) or, with
``--dest-on loop``, on a second such loop device. Everything it makes is removed at the end.

    sudo .venv/bin/python bench/stage.py --loop --size 3GiB --rounds 3 --json docs/bench/stage.json
    sudo .venv/bin/python bench/stage.py --loop --before ../main/.venv/bin/fxkit  # before/after

With ``--ssh`` the source is on a lab host instead (a fleet of one started for the run and
stopped after, the checkpoint written there from /dev/urandom) and ``fxkit stage lab01:PATH`` is
timed against ``scp -r`` of the same folder (OpenSSH, the same key and known_hosts), into a
tmpfs here, each from a cold cache as above; round 1 checks both copies against the lab host's
sha256 of every file:

    sudo .venv/bin/python bench/stage.py --ssh --size 1GiB --before ../main/.venv/bin/fxkit

Needs root (loop devices, drop_caches), fio and rsync.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fxkit.cli.loader import parse_size  # noqa: E402
from fxkit.lab import Fleet  # noqa: E402
from fxkit.loadbench.bench import FioSetting, fio_job, fio_read  # noqa: E402

FXKIT = Path(sys.executable).with_name("fxkit")
#: Read settings for the limit: the fastest ones of the loader benchmark's sweep on this VM
#: (buffered streams per file or per range) and its best O_DIRECT one.
FIO = (
    FioSetting("per-file", 1, 16 << 20, True),
    FioSetting("split", 1, 4 << 20, True),
    FioSetting("per-file", 16, 4 << 20, False),
)


def methods(dest: Path, src: Path, before: Path | None = None) -> dict[str, list[str]]:
    """Each method's command; ``before``: another fxkit executable (the code before a change),
    run as ``fxkit-before`` with the defaults."""
    out = str(dest / "model")
    earlier = {"fxkit-before": [str(before), "stage", str(src), out, "-q", "--json"]}
    return {
        **(earlier if before else {}),
        "cp": ["cp", "-r", str(src), out],
        "rsync": ["rsync", "-a", f"{src}/", f"{out}/"],
        "fxkit": [str(FXKIT), "stage", str(src), out, "-q", "--json"],
        "fxkit-sha256": [str(FXKIT), "stage", str(src), out, "-q", "--json", "--checksum=sha256"],
        "fxkit-verify": [str(FXKIT), "stage", str(src), out, "-q", "--json", "--verify"],
    }


def ssh_methods(fleet: Fleet, remote: str, dest: Path, config: Path, before: Path | None) -> dict:
    """fxkit (and ``before``) staging ``lab01:remote`` with ``config`` (an ssh config naming the
    lab host), and scp of the same folder, into ``dest``."""
    out, spec = str(dest / "model"), f"lab01:{remote}"
    hv = fleet.hostvars("lab01")
    scp = ["scp", "-r", "-q", "-o", "BatchMode=yes", "-i", str(hv["ansible_ssh_private_key_file"]),
           "-o", f"UserKnownHostsFile={fleet.known_hosts}", "-P", str(fleet.port)]  # fmt: skip
    stage = ["stage", spec, out, "-q", "--json", "--ssh-config", str(config)]
    return {
        **({"fxkit-before": [str(before), *stage]} if before else {}),
        "scp": [*scp, f"root@{fleet.address('lab01')}:{remote}", out],
        "fxkit": [str(FXKIT), *stage],
    }


def run_ssh(work: Path, dest: Path, args: argparse.Namespace, only: list[str]) -> dict:
    """The ``--ssh`` rounds: fxkit against scp from a lab host (see above)."""
    fleet = Fleet(work / "lab", "127.89.6")
    fleet.up(1)
    try:
        remote, size = "/srv/fxstage-bench/model", parse_size(args.size)
        config = work / "ssh_config"
        config.write_text(
            f"Host lab01\n    HostName {fleet.address('lab01')}\n    Port {fleet.port}\n"
            f"    User root\n    IdentityFile {fleet.client_key}\n"
            f"    UserKnownHostsFile {fleet.known_hosts}\n"
        )
        os.environ["FXKIT_KNOWN_HOSTS"] = str(work / "own_known_hosts")
        per = size // args.shards
        make = f"rm -rf {remote} && mkdir -p {remote} && cd {remote} && " + " && ".join(
            f"head -c {per} /dev/urandom > model-{i:05d}-of-{args.shards:05d}.safetensors"
            for i in range(1, args.shards + 1)
        )
        with fleet.connect("lab01") as conn:
            assert conn.run(make, timeout=600).ok
            listed = conn.run(f"cd {remote} && sha256sum *").stdout.split()
        expected = dict(zip(listed[1::2], listed[0::2], strict=True))
        commands = ssh_methods(fleet, remote, dest, config, args.before)
        gbps: dict[str, list[float]] = {m: [] for m in only}
        cpu: dict[str, list[float]] = {m: [] for m in only}
        for rnd in range(args.rounds):
            for name in only[rnd % len(only) :] + only[: rnd % len(only)]:
                seconds, usr, sys_ = copy(commands[name], dest)
                gbps[name].append(per * args.shards / seconds / 1e9)
                cpu[name].append(usr + sys_)
                if rnd == 0:
                    assert digest(dest / "model") == expected, f"{name} copied other bytes"
                print(f"round {rnd + 1} {name:13} {gbps[name][-1]:.3f} GB/s CPU {usr + sys_:.2f} s",
                      flush=True)  # fmt: skip
        empty(dest)
    finally:
        fleet.down()
    summary = {
        m: {
            "gbps_median": round(statistics.median(v), 3),
            "vs_scp": round(
                statistics.median(x / y for x, y in zip(v, gbps["scp"], strict=True)), 3
            ),
            "cpu_s_median": round(statistics.median(cpu[m]), 2),
        }
        for m, v in gbps.items()
    }
    targets = {"fxkit >= 0.9x scp (SSH source)": summary["fxkit"]["vs_scp"] >= 0.9}
    return {"bytes": per * args.shards, "rounds": args.rounds, "runs_gbps": gbps,
            "runs_cpu_s": cpu, "summary": summary, "targets": targets}  # fmt: skip


def sh(*argv: str) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout.strip()


def drop_caches() -> None:
    subprocess.run(["sync"], check=True)
    Path("/proc/sys/vm/drop_caches").write_text("1\n")


def empty(dest: Path) -> None:
    shutil.rmtree(dest / "model", ignore_errors=True)
    subprocess.run(["sync", "-f", str(dest)], check=True)
    subprocess.run(["fstrim", str(dest)], capture_output=True)  # give a loop file its space back


def files_of(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and not p.name.startswith("."))


def digest(root: Path) -> dict[str, str]:
    sums = {}
    for p in files_of(root):
        sha = hashlib.sha256()
        with open(p, "rb") as f:
            while block := f.read(16 << 20):
                sha.update(block)
        sums[p.relative_to(root).as_posix()] = sha.hexdigest()
    return sums


def copy(argv: list[str], dest: Path) -> tuple[float, float, float]:
    """Seconds of one cold copy (until it is on the store), and the user and system CPU seconds
    it used."""
    empty(dest)
    drop_caches()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(argv, check=True, capture_output=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(["sync", "-f", str(dest)], check=True)
    seconds = time.perf_counter() - start
    return seconds, after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime


def fio(files: list[Path], setting: FioSetting) -> float:
    """GB/s of one cold fio read of ``files``."""
    drop_caches()
    with tempfile.NamedTemporaryFile("w", suffix=".fio") as job:
        job.write(fio_job(files, setting))
        job.flush()
        out = subprocess.run(["fio", "--output-format=json", job.name], capture_output=True,
                             text=True, check=True).stdout  # fmt: skip
    nbytes, seconds = fio_read(out)
    return nbytes / seconds / 1e9


def fio_copy(files: list[Path], dest: Path, setting: FioSetting) -> float:
    """GB/s of the source's bytes in one cold fio run that reads ``files`` (as ``setting``) and,
    at the same time, writes a file of about each one's size (whole 16 MiB blocks) to the
    destination (O_DIRECT, 4 in flight, not preallocated, fsynced at the end): a copy's disk
    limit, with nothing hashed and nothing handed from the reads to the writes. Its time is the
    longest job's."""
    out = dest / "model"
    out.mkdir(exist_ok=True)
    block = 16 << 20
    writes = "".join(
        f"[w{i}]\nrw=write\nfilename={out / f'fio-{i}'}\nsize={max(1, size // block) * block}\n"
        "bs=16M\niodepth=4\ndirect=1\nfallocate=none\nend_fsync=1\n"
        for i, size in enumerate(f.stat().st_size for f in files)
    )
    drop_caches()
    with tempfile.NamedTemporaryFile("w", suffix=".fio") as job:
        job.write(fio_job(files, setting) + writes)
        job.flush()
        out_json = subprocess.run(["fio", "--output-format=json", job.name], capture_output=True,
                                  text=True, check=True).stdout  # fmt: skip
    empty(dest)
    jobs = json.loads(out_json[out_json.index("{") :])["jobs"]
    nbytes = sum(job["read"]["io_bytes"] for job in jobs)
    ms = max(max(job["read"]["runtime"], job["write"]["runtime"]) for job in jobs)
    return nbytes / ms / 1e6


@contextmanager
def loop_fs(image: Path, mount: Path, size: int) -> Iterator[Path]:
    """An ext4 on a loop device with direct I/O to ``image``; all of it removed afterwards."""
    image.unlink(missing_ok=True)
    sh("truncate", "-s", str(size), str(image))
    device = sh("losetup", "--find", "--show", "--direct-io=on", str(image))
    try:
        sh("mkfs.ext4", "-q", "-E", "nodiscard", device)
        mount.mkdir(parents=True, exist_ok=True)
        sh("mount", device, str(mount))
        try:
            yield mount
        finally:
            sh("umount", str(mount))
    finally:
        sh("losetup", "-d", device)
        image.unlink(missing_ok=True)


@contextmanager
def tmpfs(mount: Path, size: int) -> Iterator[Path]:
    mount.mkdir(parents=True, exist_ok=True)
    sh("mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount))
    try:
        yield mount
    finally:
        sh("umount", str(mount))


def run(src: Path, dest: Path, rounds: int, only: list[str], before: Path | None) -> dict:
    files = files_of(src)
    nbytes = sum(p.stat().st_size for p in files)
    expected = digest(src)
    gbps: dict[str, list[float]] = {m: [] for m in [*only, "fio", "fio-copy"]}
    user: dict[str, list[float]] = {m: [] for m in only}
    system: dict[str, list[float]] = {m: [] for m in only}
    commands = methods(dest, src, before)
    for rnd in range(rounds):
        order = only[rnd % len(only) :] + only[: rnd % len(only)]
        for name in order:
            seconds, usr, sys_ = copy(commands[name], dest)
            gbps[name].append(nbytes / seconds / 1e9)
            user[name].append(usr)
            system[name].append(sys_)
            if rnd == 0:
                assert digest(dest / "model") == expected, f"{name} copied other bytes"
            print(f"round {rnd + 1} {name:13} {gbps[name][-1]:.2f} GB/s CPU {usr:.2f} user "
                  f"{sys_:.2f} system s", flush=True)  # fmt: skip
        empty(dest)
        reads = {s: fio(files, s) for s in FIO}
        best = max(reads, key=lambda s: reads[s])
        gbps["fio"].append(reads[best])
        gbps["fio-copy"].append(fio_copy(files, dest, best))
        print(f"round {rnd + 1} {'fio-best':13} {reads[best]:.2f} GB/s ({best.label}), "
              f"fio-copy {gbps['fio-copy'][-1]:.2f} GB/s", flush=True)  # fmt: skip

    def ratio(a: str, b: str) -> float:
        return statistics.median(x / y for x, y in zip(gbps[a], gbps[b], strict=True))

    summary = {
        m: {
            "gbps_median": round(statistics.median(v), 3),
            "gbps_min": round(min(v), 3),
            "gbps_max": round(max(v), 3),
            **{f"vs_{o}": round(ratio(m, o), 3) for o in ("fio", "fio-copy", "cp", "rsync")},
        }
        for m, v in gbps.items()
    }
    for m in only:
        summary[m]["cpu_user_s_median"] = round(statistics.median(user[m]), 2)
        summary[m]["cpu_system_s_median"] = round(statistics.median(system[m]), 2)
    startup = []
    for _ in range(3):
        start = time.perf_counter()
        subprocess.run([str(FXKIT), "stage", "--help"], check=True, capture_output=True)
        startup.append(time.perf_counter() - start)
    # Issue 26: a verified copy is not slower than an unverified one, and near the disk's limit.
    targets = {
        "fxkit >= 1.0x cp": ratio("fxkit", "cp") >= 1.0,
        "fxkit >= 1.0x rsync": ratio("fxkit", "rsync") >= 1.0,
        "fxkit >= 0.9x fio-best": ratio("fxkit", "fio") >= 0.9,
    }
    return {
        "files": len(files),
        "bytes": nbytes,
        "rounds": rounds,
        "runs_gbps": gbps,
        "runs_cpu_user_s": user,
        "runs_cpu_system_s": system,
        "fxkit_startup_s": round(min(startup), 3),
        "summary": summary,
        "targets": targets,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--src", type=Path, help="a checkpoint folder (default: made by --loop)")
    parser.add_argument("--dest", type=Path, help="an empty folder on the destination store")
    parser.add_argument("--loop", action="store_true", help="make isolated storage (see above)")
    parser.add_argument("--ssh", action="store_true", help="the source on a lab host, against scp")
    parser.add_argument("--dest-on", choices=("tmpfs", "loop"), default="tmpfs")
    parser.add_argument("--size", default="3GiB", help="checkpoint size with --loop")
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--methods", default="cp,rsync,fxkit,fxkit-sha256,fxkit-verify")
    parser.add_argument("--json", type=Path, help="write the report here")
    parser.add_argument(
        "--before", type=Path, help="another fxkit executable, also run (as fxkit-before)"
    )
    args = parser.parse_args()
    only = args.methods.split(",") + (["fxkit-before"] if args.before else [])
    for tool in ("fio", "rsync"):
        if shutil.which(tool) is None:
            sys.exit(f"{tool} is not installed (scripts/install-system-deps.sh installs it)")
    if args.ssh:
        work = Path(tempfile.mkdtemp(prefix="fxstage-", dir="/tmp"))
        try:
            with tmpfs(work / "dest", parse_size(args.size) * 2 + (256 << 20)) as dest:
                only = ["scp", "fxkit"] + (["fxkit-before"] if args.before else [])
                report = run_ssh(work, dest, args, only)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        report.update(
            date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            command=" ".join(sys.argv),
            load=Path("/proc/loadavg").read_text().split()[:3],
        )
        print(json.dumps(report, indent=2))
        if args.json:
            args.json.write_text(json.dumps(report, indent=2) + "\n")
        return
    with ExitStack() as stack:
        src, dest = args.src, args.dest
        if args.loop:
            size = parse_size(args.size)
            work = Path(tempfile.mkdtemp(prefix="fxstage-", dir="/tmp"))
            stack.callback(shutil.rmtree, work, ignore_errors=True)
            room = size + size // 2 + (256 << 20)
            src_fs = stack.enter_context(
                loop_fs(Path("/var/tmp/fxstage-src.img"), work / "src", room)
            )
            dest = stack.enter_context(
                tmpfs(work / "dest", room)
                if args.dest_on == "tmpfs"
                else loop_fs(Path("/var/tmp/fxstage-dest.img"), work / "dest", room)
            )
            src = src_fs / "model"
            sh(str(FXKIT), "make-checkpoint", str(src), "--size", args.size, "--shards",
               str(args.shards))  # fmt: skip
        if src is None or dest is None:
            parser.error("give --src and --dest, or --loop")
        report = run(src, dest, args.rounds, only, args.before)
        report.update(
            date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            command=" ".join(sys.argv),
            machine={
                "cpus": len(os.sched_getaffinity(0)),
                "kernel": platform.release(),
                "load": Path("/proc/loadavg").read_text().split()[:3],
            },
            source=sh("findmnt", "-no", "SOURCE,FSTYPE", "-T", str(src)),
            destination=sh("findmnt", "-no", "SOURCE,FSTYPE", "-T", str(dest)),
        )
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
