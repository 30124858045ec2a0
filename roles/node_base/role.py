"""node_base: the fxkit folders, a node description, kernel tuning and limits on every node."""

import posixpath
from shlex import quote

from fxkit.engine.role import Host
from fxkit.engine.variables import HostVars


def apply(host: Host, v: HostVars) -> None:
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
