"""Surge copies of roles/vllm_lmcache without a lab host: where they go (GPUs the layout leaves
free, ports after the layout's), what they run (the instance's command line and environment with
their own port and GPUs), and an instance with no room getting none. The rollout with copies on
lab hosts: tests/test_rollout_surge_lab.py."""

from __future__ import annotations

from test_role_vllm_lmcache import CODE, host_vars, wheel  # noqa: F401 (the module's fixture)


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
    assert [(c.name, c.gpus, c.port) for c in found] == [
        ("tp1-0-surge", (3,), 8003),
        ("tp1-1-surge", (4,), 8004),
    ]  # tp1-2: no GPU left, no copy
    full = host_vars(wheel, vllm_lmcache_layout="TP4x2")  # 8 GPUs, all in the layout
    assert CODE.surge_copies(full, CODE.instance_specs(full)) == []  # type: ignore[union-attr]
