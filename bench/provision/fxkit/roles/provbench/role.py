"""The provisioning benchmark's 20 tasks: directories, templates, config lines, guarded commands."""

SLOTS = range(1, 6)


def apply(host, v):
    root = v["bench_root"]
    for slot in SLOTS:
        host.directory(f"{root}/d{slot}", mode="0755")
    for slot in SLOTS:
        host.template("app.conf.j2", f"{root}/d{slot}/app.conf", mode="0644")
    for slot in SLOTS:
        host.line(v["bench_conf"], f"option_{slot} = on")
    for slot in SLOTS:
        host.command(f"touch {root}/done-{slot}", creates=f"{root}/done-{slot}")
