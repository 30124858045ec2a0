"""node_base: the fxkit folders, a node description, kernel tuning and limits on every node."""

import posixpath
from shlex import quote

from pydantic import Field

from fxkit.engine.role import Host
from fxkit.engine.rolevars import RoleVars, Text, Whole

ROOT = "{{ node_base_root }}"


class Vars(RoleVars):
    node_base_root: str = Field(
        "", description="prefix for every path below (a scratch folder for a dry run)"
    )
    node_base_etc_dir: str = Field(f"{ROOT}/etc/fxkit", description="fxkit's configuration folder")
    node_base_opt_dir: str = Field(f"{ROOT}/opt/fxkit", description="fxkit's software folder")
    node_base_sysctl: dict[str, str | int] = Field(
        {"kernel.numa_balancing": 0},
        description="kernel settings, name: value (numa_balancing 0: ROCm's MI300X tuning, "
        "the system optimization guide)",
        examples=[{"kernel.numa_balancing": 0}],
    )
    node_base_sysctl_file: str = Field(
        f"{ROOT}/etc/sysctl.d/90-fxkit.conf", description="where they persist"
    )
    node_base_proc_sys: str = Field(f"{ROOT}/proc/sys", description="the live kernel settings")
    node_base_modules: list[str] = Field(
        ["amdgpu", "rdma_ucm", "nvme_rdma"], description="modules loaded at boot"
    )
    node_base_modules_load_file: str = Field(
        f"{ROOT}/etc/modules-load.d/fxkit.conf", description="their list"
    )
    node_base_memlock: str | Whole = Field(
        "unlimited",
        description="the memlock limit (soft and hard; RDMA pins memory)",
        examples=["unlimited", 65536],
    )
    node_base_limits_file: str = Field(
        f"{ROOT}/etc/security/limits.conf", description="where it is set"
    )
    node_role: Text = Field("inference", description="written to node.yaml")
    node_gpu_model: Text = Field("MI308X", description="written to node.yaml")
    node_gpu_count: Whole = Field(8, ge=0, description="written to node.yaml")
    rocm_version: Text = Field("7.2", description="written to node.yaml")


def apply(host: Host, v: Vars) -> None:
    for folder in (v.node_base_etc_dir, v.node_base_opt_dir, f"{v.node_base_opt_dir}/bin"):
        host.directory(folder, mode="0755")
    host.template("node.yaml.j2", f"{v.node_base_etc_dir}/node.yaml", mode="0644")

    # Every distribution has these folders; minimal images and scratch roots may not.
    for path in (v.node_base_sysctl_file, v.node_base_modules_load_file, v.node_base_limits_file):
        host.directory(posixpath.dirname(path))

    for name, value in v.node_base_sysctl.items():
        host.sysctl(name, value, file=v.node_base_sysctl_file, proc_sys=v.node_base_proc_sys)
    host.template("modules-load.conf.j2", v.node_base_modules_load_file, mode="0644")
    for kind in ("soft", "hard"):
        host.line(
            v.node_base_limits_file,
            f"*  {kind}  memlock  {v.node_base_memlock}",
            regexp=rf"^\*\s+{kind}\s+memlock\s",
        )

    node_id = f"{v.node_base_etc_dir}/node-id"
    host.command(f"cat /proc/sys/kernel/random/uuid > {quote(node_id)}", creates=node_id)
