"""Surge copies of roles/vllm_lmcache without a lab host: where they go (GPUs the layout leaves
free, ports after the layout's), what they run (the instance's command line and environment with
their own port and GPUs), an instance with no room getting none, and the memory a copy declares.
The rollout with copies on lab hosts: tests/test_rollout_surge_lab.py."""

from __future__ import annotations

from test_role_vllm_lmcache import CODE, host_vars, wheel  # noqa: F401 (the module's fixture)

from fxkit.rollout.report import Hooks, Instance
from fxkit.rollout.rollback import Previous, moved
from fxkit.rollout.state import InstanceState
from fxkit.rollout.surge import Surge


def test_a_copy_takes_free_gpus_and_the_next_port(wheel: str) -> None:  # noqa: F811
    v = host_vars(wheel, vllm_lmcache_layout="TP4x2", vllm_lmcache_gpus=12)
    first, second = CODE.instance_specs(v)  # type: ignore[union-attr]
    [copy] = CODE.surge_copies(v, [second])  # type: ignore[union-attr]
    assert (copy.name, copy.unit) == ("tp4-1-surge", "vllm@tp4-1-surge.service")
    assert (copy.gpus, copy.port) == ((8, 9, 10, 11), 8002)
    assert copy.env["HIP_VISIBLE_DEVICES"] == "8,9,10,11" and copy.env["FXKIT_PORT"] == "8002"
    assert copy.argv[copy.argv.index("--port") + 1] == "8002"
    assert copy.argv[: copy.argv.index("--port")] == second.argv[: second.argv.index("--port")]
    assert copy.env_file == second.env_file.replace("tp4-1.env", "tp4-1-surge.env")
    assert copy.ready_url == "http://127.0.0.1:8002/v1/models"
    same = {k: x for k, x in copy.env.items() if k not in ("HIP_VISIBLE_DEVICES", "FXKIT_PORT")}
    assert same == {k: x for k, x in second.env.items() if k in same}
    assert first.port == 8000 and second.port == 8001  # the instances themselves unchanged


def test_copies_share_the_free_gpus_until_none_are_left(wheel: str) -> None:  # noqa: F811
    v = host_vars(wheel, vllm_lmcache_layout=[[0], [1], [2]], vllm_lmcache_gpus=5)
    found = CODE.surge_copies(v, CODE.instance_specs(v))  # type: ignore[union-attr]
    assert [(c.name, c.gpus, c.port) if c else None for c in found] == [
        ("tp1-0-surge", (3,), 8003),
        ("tp1-1-surge", (4,), 8004),
        None,  # tp1-2: no GPU left, no copy
    ]
    full = host_vars(wheel, vllm_lmcache_layout="TP4x2")  # 8 GPUs, all in the layout
    assert CODE.surge_copies(full, CODE.instance_specs(full)) == [None, None]  # type: ignore[union-attr]


def test_a_larger_instance_without_room_leaves_its_gpus_to_a_smaller_one(wheel: str) -> None:  # noqa: F811
    v = host_vars(wheel, vllm_lmcache_layout=[[0, 1, 2, 3], [4]], vllm_lmcache_gpus=7)
    big, small = CODE.instance_specs(v)  # type: ignore[union-attr]
    none, copy = CODE.surge_copies(v, [big, small])  # type: ignore[union-attr]
    assert none is None and (copy.name, copy.gpus, copy.port) == ("tp1-1-surge", (5,), 8002)


def test_a_copy_declares_lmcache_s_cpu_buffer(wheel: str) -> None:  # noqa: F811
    # LMCache 0.5.6 allocates max_local_cpu_size GiB whole per GPU worker at start
    # (lmcache/v1/storage_backend/local_cpu_backend.py, LocalCPUBackend.initialize_allocator;
    # the wheel's source, pip download lmcache==0.5.6 --no-deps).
    v = host_vars(wheel, vllm_lmcache_layout=[[0, 1], [2]], vllm_lmcache_max_local_cpu_size=1.5)
    two, one = CODE.instance_specs(v)  # type: ignore[union-attr]
    assert CODE.surge_memory(v, two) == 3 * 2**30  # type: ignore[union-attr]
    assert CODE.surge_memory(v, one) == int(1.5 * 2**30)  # type: ignore[union-attr]
    # local_cpu off still allocates it (lmcache/v1/storage_backend/__init__.py: "always
    # created because other backends might need it as a buffer"), unless its size is 0.
    off = host_vars(wheel, vllm_lmcache_local_cpu=False, vllm_lmcache_layout="TP4x2")
    assert CODE.surge_memory(off, CODE.instance_specs(off)[0]) == 4 * 5 * 2**30  # type: ignore[union-attr]
    for bare in (
        host_vars(wheel, vllm_lmcache_max_local_cpu_size=0),
        host_vars(wheel, vllm_lmcache_kv_connector=None),
        host_vars(wheel, vllm_lmcache_server="serve-probe", vllm_lmcache_vllm_version=False,
                  vllm_lmcache_torch_version="2.13.0+cpu"),
    ):  # fmt: skip
        assert CODE.surge_memory(bare, CODE.instance_specs(bare)[0]) == 0  # type: ignore[union-attr]


class _Read(Surge):
    """A Surge whose hosts' memory figures are given (the reading itself: SessionMemory's test
    in tests/test_facts.py and tests/test_rollout_surge_lab.py)."""

    figures: tuple[dict[int, int], int] = ({}, 0)

    def memory(self, host: str, pids: list[int]) -> tuple[dict[int, int], int]:
        return self.figures


def test_copies_are_accepted_by_gpus_then_the_node_limit_then_memory(wheel: str) -> None:  # noqa: F811
    v = host_vars(wheel, vllm_lmcache_layout=[[0], [1], [2], [3]], vllm_lmcache_gpus=7,
                  vllm_lmcache_kv_connector=None)  # fmt: skip
    specs = CODE.instance_specs(v)  # type: ignore[union-attr]
    items = [Instance("gpu01", s.name, s.unit, list(s.gpus), s.port, s.served_name) for s in specs]
    before = {i.key: InstanceState("gpu01", i.name, i.unit, i.port, 100 + n, "r-a", "r-b", "ready")
              for n, i in enumerate(items)}  # fmt: skip
    surge = _Read(None, CODE, {}, before, Hooks(), per_node=2)  # type: ignore[arg-type]
    copies = CODE.surge_copies(v, specs)  # type: ignore[union-attr]
    assert [c.name if c else None for c in copies] == [
        "tp1-0-surge", "tp1-1-surge", "tp1-2-surge", None
    ]  # fmt: skip
    gib = 2**30
    # tp1-0 does not fit in memory (5 GiB of 4), tp1-1 and tp1-2 fit (1 + 1 GiB): both taken,
    # the node's limit of 2 counting accepted copies only; tp1-3 has no GPU.
    surge.figures = ({100: 5 * gib, 101: gib, 102: gib, 103: gib}, 4 * gib)
    reasons = surge.room("gpu01", v, items, copies)
    assert reasons[0].startswith("no room in gpu01's memory: its copy needs 5.00 GiB"), reasons
    assert reasons[1:3] == ["", ""] and reasons[3].startswith("no free GPUs"), reasons
    # The limit: a third copy that fits is refused for it.
    surge.figures = ({100: gib, 101: gib, 102: gib}, 10 * gib)
    assert surge.room("gpu01", v, items[:3], copies[:3])[2].endswith("(--max-surge)")
    # What an instance holds was not read: no copy for it.
    surge.figures = ({101: gib}, 10 * gib)
    reasons = surge.room("gpu01", v, items[:2], copies[:2])
    assert reasons[0].startswith("what it holds in memory could not be read") and reasons[1] == ""
    # LMCache's buffer (the role's surge_memory) counts on top of what the instance holds.
    lm = host_vars(wheel, vllm_lmcache_layout=[[0]], vllm_lmcache_gpus=2,
                   vllm_lmcache_max_local_cpu_size=2)  # fmt: skip
    one = CODE.instance_specs(lm)  # type: ignore[union-attr]
    surge.figures = ({100: gib}, int(2.5 * gib))
    [why] = surge.room("gpu01", lm, items[:1], CODE.surge_copies(lm, one))  # type: ignore[union-attr]
    assert why.startswith("no room in gpu01's memory: its copy needs 3.00 GiB"), why


def test_an_earlier_revisions_run_is_moved_to_its_surge_copy() -> None:
    """Undo's copy under systemd: the instance's kept unit text as the copy's own unit file, and
    its environment file at the copy's path with the copy's values (fxkit/rollout/rollback.py)."""
    unit = "/etc/systemd/system/vllm@tp4-0.service"
    env_file = "# Written by fxkit\nFXKIT_PORT='8000'\nHIP_VISIBLE_DEVICES='0,1,2,3'\nX='a b'\n"
    kept = {unit: "[Service]\nExecStart=/v/bin/vllm\n", "/etc/fxkit/vllm/d/tp4-0.env": env_file}
    copy_env = {"FXKIT_PORT": "8002", "HIP_VISIBLE_DEVICES": "8,9,10,11", "X": "a b", "LANG": "C"}
    run = Previous(["/v/bin/vllm", "--port", "8002"], copy_env, kept)
    moved_run = moved(run, "vllm@tp4-0-surge.service", "/etc/fxkit/vllm/d/tp4-0-surge.env")
    assert moved_run.argv == run.argv and moved_run.env == copy_env
    assert moved_run.files == {
        "/etc/systemd/system/vllm@tp4-0-surge.service": kept[unit],
        "/etc/fxkit/vllm/d/tp4-0-surge.env": "# Written by fxkit\nFXKIT_PORT='8002'\n"
        "HIP_VISIBLE_DEVICES='8,9,10,11'\nX='a b'\n",
    }
    # A value with a single quote: double-quoted, with systemd's escapes (tests/test_systemd_lab.py
    # has systemd read it back).
    odd = 'it\'s "$HOME" `id` \\n'
    quoted = moved(Previous(run.argv, {**copy_env, "X": odd}, kept), "c.service", "/c.env")
    assert quoted.files["/c.env"].endswith('\nX="it\'s \\"\\$HOME\\" \\`id\\` \\\\n"\n')
    # Without systemd there are no files: the run is the copy's as it is.
    bare = Previous(run.argv, copy_env)
    assert moved(bare, "c.service", "/c.env") == bare
