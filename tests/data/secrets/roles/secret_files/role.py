"""secret_files: writes secrets into the files that need them, then fails on purpose."""

import base64

from fxkit.engine.role import Host
from fxkit.engine.variables import HostVars


def apply(host: Host, v: HostVars) -> None:
    host.directory("/etc/secretapp", mode="0700")
    host.template("app.conf.j2", "/etc/secretapp/app.conf", mode="0600")
    # A transform made in Python, which no template sees.
    encoded = base64.b64encode(v.db_password.encode()).decode()
    host.file("/etc/secretapp/db.b64", content=f"{encoded}\n", mode="0600")
    host.line("/etc/secretapp/env", f"API_TOKEN={v.api_token}", regexp="^API_TOKEN=")
    if "broken_password" in v:  # a secret holding '{%': a template error must not quote it
        host.file("/etc/secretapp/broken", content=v.broken_password, mode="0600")
    host.command(f"echo 'cannot log in with {v.db_password.upper()}' >&2; exit 3")
