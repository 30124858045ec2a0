"""pyinfra form of the provisioning benchmark's workload (see ../README.md): 20 operations."""

from pathlib import Path

from pyinfra import host
from pyinfra.facts.files import File
from pyinfra.operations import files, server

ROOT = "/srv/fxkit-bench"
CONF = "/etc/fxkit-bench.conf"
SLOTS = range(1, 6)
TEMPLATE = str(Path(__file__).with_name("templates") / "app.conf.j2")

for slot in SLOTS:
    files.directory(name=f"directory d{slot}", path=f"{ROOT}/d{slot}", mode="0755")
for slot in SLOTS:
    files.template(
        name=f"template d{slot}", src=TEMPLATE, dest=f"{ROOT}/d{slot}/app.conf", mode="0644"
    )
for slot in SLOTS:
    files.line(name=f"line option_{slot}", path=CONF, line=f"option_{slot} = on")
for slot in SLOTS:
    marker = f"{ROOT}/done-{slot}"
    if not host.get_fact(File, path=marker):
        server.shell(name=f"command done-{slot}", commands=[f"touch {marker}"])
