"""Counts a tool's SSH round trips for bench/provision.py: loaded (through PYTHONPATH) into the
tool's own Python, it counts the SSH channels paramiko opens (one per command, one per SFTP
session), the SFTP requests it sends and the requests sent to fxkit's host-side helper (a
command or a read, one request on its open channel each), and writes them as JSON to
$FXBENCH_COUNTS at exit. fxkit and pyinfra both talk SSH through paramiko, so both are counted
the same way."""

import atexit
import json
import os
import threading

_path = os.environ.get("FXBENCH_COUNTS")
if _path:
    import paramiko
    import paramiko.sftp_client

    _counts = {"channels": 0, "sftp_requests": 0, "helper_requests": 0}
    _lock = threading.Lock()

    def _counting(cls, name, key):
        original = getattr(cls, name)

        def counted(self, *args, **kwargs):
            with _lock:
                _counts[key] += 1
            return original(self, *args, **kwargs)

        setattr(cls, name, counted)

    _counting(paramiko.Transport, "open_channel", "channels")
    _counting(paramiko.sftp_client.SFTPClient, "_async_request", "sftp_requests")
    try:
        from fxkit.connection.helper import HelperClient
    except ImportError:  # not fxkit
        pass
    else:
        _counting(HelperClient, "send", "helper_requests")  # a command
        _counting(HelperClient, "ask", "helper_requests")  # a read

    @atexit.register
    def _write():
        with open(_path, "w") as out:
            json.dump(_counts, out)
