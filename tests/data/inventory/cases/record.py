"""Record real ansible-core output for the inventory cases here (not run by the tests).

    python3 -m venv /tmp/ansible && /tmp/ansible/bin/pip install ansible-core
    python3 tests/data/inventory/cases/record.py /tmp/ansible/bin [CASE...]

For each CASE.json (sources, hosts, patterns, limits) it writes ansible/CASE/: ``list.json``
(``ansible-inventory -i SRC... --list``), ``graph.txt`` (``--graph``), ``hosts.json`` (``--host
NAME`` for each host), ``patterns.json`` (``ansible PATTERN -i SRC... --list-hosts``: the hosts
printed, in order, or the error) and ``limits.json`` (the same with ``--limit``). For each file
in errors/ it writes ansible/errors/FILE.txt: what ``ansible-inventory -i FILE --list`` said.
Ansible runs in an empty directory, so that no ansible.cfg or group_vars/ there counts.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "ansible"


def run(bin_dir: Path, tool: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "ANSIBLE_NOCOLOR": "1", "HOME": "/tmp"}
    with tempfile.TemporaryDirectory() as empty:
        command = [str(bin_dir / tool), *args]
        return subprocess.run(command, cwd=empty, env=env, capture_output=True, text=True)


def listed_hosts(result: subprocess.CompletedProcess[str]) -> list[str] | dict[str, str]:
    if result.returncode != 0:
        return {"error": result.stderr.strip().splitlines()[-1]}
    lines = result.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith("hosts ("))
    return [line.strip() for line in lines[start + 1 :] if line.strip()]


def record_case(bin_dir: Path, case: Path, pool: ThreadPoolExecutor) -> None:
    spec = json.loads(case.read_text())
    sources = [arg for src in spec["sources"] for arg in ("-i", _source(src))]
    out = OUT / case.stem
    out.mkdir(parents=True, exist_ok=True)
    listed = run(bin_dir, "ansible-inventory", *sources, "--list")
    assert listed.returncode == 0, listed.stderr
    (out / "list.json").write_text(listed.stdout)
    graph = run(bin_dir, "ansible-inventory", *sources, "--graph")
    (out / "graph.txt").write_text(graph.stdout)
    hosts = pool.map(
        lambda h: json.loads(run(bin_dir, "ansible-inventory", *sources, "--host", h).stdout),
        spec["hosts"],
    )
    _dump(out / "hosts.json", dict(zip(spec["hosts"], hosts, strict=True)))
    patterns = pool.map(
        lambda p: listed_hosts(run(bin_dir, "ansible", p, *sources, "--list-hosts")),
        spec["patterns"],
    )
    _dump(out / "patterns.json", dict(zip(spec["patterns"], patterns, strict=True)))
    limits = spec.get("limits", [])
    limited = pool.map(
        lambda pl: listed_hosts(
            run(bin_dir, "ansible", pl[0], *sources, "--limit", pl[1], "--list-hosts")
        ),
        limits,
    )
    _dump(out / "limits.json", [[*pl, hosts] for pl, hosts in zip(limits, limited, strict=True)])


def record_error(bin_dir: Path, path: Path) -> None:
    result = run(bin_dir, "ansible-inventory", "-i", str(path), "--list")
    out = OUT / "errors" / f"{path.name}.txt"
    out.parent.mkdir(parents=True, exist_ok=True)
    text = result.stderr.replace(str(HERE), "CASES")
    out.write_text(f"rc={result.returncode}\n{text}")


def _source(source: str) -> str:
    return str(HERE / source) if (HERE / source).exists() else source


def _dump(path: Path, data: object) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")


def main() -> None:
    bin_dir, only = Path(sys.argv[1]).resolve(), sys.argv[2:]
    version = run(bin_dir, "ansible", "--version").stdout.splitlines()[0]
    with ThreadPoolExecutor(2) as pool:
        for case in sorted(HERE.glob("*.json")):
            if not only or case.stem in only:
                print(case.stem, flush=True)
                record_case(bin_dir, case, pool)
    for path in sorted((HERE / "errors").iterdir()):
        if not only or path.name in only:
            record_error(bin_dir, path)
    (OUT / "VERSION").write_text(version + "\n")


if __name__ == "__main__":
    main()
