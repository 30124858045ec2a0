"""user and group on this machine in check mode only (its real accounts are read, nothing is
changed), and the arguments they refuse. The changes themselves: tests/test_ops_lab_users.py."""

from __future__ import annotations

import grp
import pwd

import pytest

from fxkit.connection.local import LocalConnection
from fxkit.facts import FactCache
from fxkit.ops.base import OpContext, OpError, Status
from fxkit.ops.users import group, user


def check_ctx() -> OpContext:
    conn = LocalConnection("localhost")
    return OpContext(conn, FactCache(conn), check=True, diff=True)


def test_real_accounts_read_in_check_mode() -> None:
    root = pwd.getpwnam("root")
    assert user(check_ctx(), "root").msg == "user root present (uid 0)"
    preview = user(check_ctx(), "root", shell="/bin/fxkit-sh", uid=0)
    assert preview.changed and preview.msg == "would change shell of user root"
    assert preview.diff == f"shell: {root.pw_shell} -> /bin/fxkit-sh\n"
    assert preview.data["commands"] == ["usermod -s /bin/fxkit-sh -- root"]
    assert pwd.getpwnam("root").pw_shell == root.pw_shell
    assert group(check_ctx(), "root", gid=0).msg == "group root present (gid 0)"
    new = group(check_ctx(), "fxkit-no-such-group", gid=4321)
    assert new.msg == "would create group fxkit-no-such-group"
    assert new.data["commands"] == ["groupadd -g 4321 -- fxkit-no-such-group"]
    with pytest.raises(KeyError):
        grp.getgrnam("fxkit-no-such-group")
    absent = user(check_ctx(), "fxkit-no-such-user", state="absent")
    assert absent.status is Status.OK and absent.msg == "user fxkit-no-such-user absent"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": "-rf"}, "bad user name"),
        ({"name": "a b"}, "bad user name"),
        ({"name": "root;id"}, "bad user name"),
        ({"name": "1abc"}, "bad user name"),
        ({"name": "x" * 33}, "bad user name"),
        ({"name": "vllm", "uid": -1}, "bad uid"),
        ({"name": "vllm", "home": "home/vllm"}, "bad home directory"),
        ({"name": "vllm", "shell": "/bin/sh:x"}, "bad shell"),
        ({"name": "vllm", "groups": ["video", "-G0"]}, "bad group name"),
        ({"name": "vllm", "state": "locked"}, "unknown state"),
    ],
)
def test_bad_arguments(kwargs: dict, message: str) -> None:
    with pytest.raises(OpError, match=message):
        user(check_ctx(), **kwargs)


def test_bad_group_arguments() -> None:
    with pytest.raises(OpError, match="bad group name"):
        group(check_ctx(), "video,render")
    with pytest.raises(OpError, match="bad gid"):
        group(check_ctx(), "vllm", gid=-5)
