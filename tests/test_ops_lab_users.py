"""user and group for real over SSH on a lab host (its own /etc/passwd, /etc/group, /home):
check mode changes nothing, apply, apply again is ok; read back with getent and id."""

from __future__ import annotations

import pytest
from test_ops_lab import converge, sh

from fxkit.connection.base import Connection
from fxkit.facts import FactCache
from fxkit.lab import SUDO_USER, Fleet
from fxkit.ops.base import OpContext, Result
from fxkit.ops.users import group, group_member, user

pytestmark = pytest.mark.lab


def _absent_group(ctx: OpContext, name: str) -> Result:
    return group(ctx, name, state="absent")


def _absent_user(ctx: OpContext, name: str) -> Result:
    return user(ctx, name, state="absent")


def test_group_created_given_a_gid_and_removed(root: Connection) -> None:
    def entry() -> str:
        return root.run("getent group fxgrp").stdout

    preview, applied, again = converge(root, group, "fxgrp", state=entry)
    assert preview.diff == "group fxgrp: absent -> present\n"
    assert preview.data["commands"] == ["groupadd -- fxgrp"]
    assert applied.msg == "created group fxgrp"
    gid = int(entry().split(":")[2])
    assert again.msg == f"group fxgrp present (gid {gid})"

    preview, applied, _ = converge(root, group, "fxgrp", gid=gid + 100, state=entry)
    assert preview.diff == f"gid of group fxgrp: {gid} -> {gid + 100}\n"
    assert entry() == f"fxgrp:x:{gid + 100}:\n"

    converge(
        root, group, "fxsysgrp", system=True, state=lambda: root.run("getent group fxsysgrp").stdout
    )
    assert int(sh(root, "getent group fxsysgrp").split(":")[2]) < 1000  # SYS_GID_MAX of login.defs

    preview, applied, again = converge(root, _absent_group, "fxgrp", state=entry)
    assert preview.diff == f"group fxgrp: gid {gid + 100} -> absent\n"
    assert entry() == "" and again.msg == "group fxgrp absent"


def test_user_created_changed_and_removed(root: Connection) -> None:
    sh(root, "getent group fxteam >/dev/null || groupadd fxteam")

    def account() -> tuple[str, str]:
        return root.run("getent passwd fxuser").stdout, root.run("id -nG fxuser").stdout

    preview, applied, again = converge(
        root, user, "fxuser", groups=["video", "fxteam"], shell="/bin/sh", state=account
    )
    assert preview.diff == "user fxuser: absent -> present\n"
    assert preview.data["commands"] == ["useradd -G video,fxteam -s /bin/sh -m -- fxuser"]
    passwd, groups = account()
    uid, own_gid = int(passwd.split(":")[2]), sh(root, "getent group fxuser").split(":")[2]
    assert passwd == f"fxuser:x:{uid}:{own_gid}::/home/fxuser:/bin/sh\n"  # its own group
    assert set(groups.split()) == {"fxuser", "video", "fxteam"}
    assert sh(root, "stat -c %U:%F /home/fxuser") == "fxuser:directory\n"  # the home, created
    assert again.msg == f"user fxuser present (uid {uid})"

    preview, applied, _ = converge(
        root, user, "fxuser", uid=2345, shell="/bin/bash", groups=["audio", "video"], state=account
    )
    assert preview.diff == (
        f"uid: {uid} -> 2345\n"
        "groups: fxteam video -> fxteam video audio\n"
        "shell: /bin/sh -> /bin/bash\n"
    )
    assert applied.msg == "changed uid, groups, shell of user fxuser"
    assert account()[0] == f"fxuser:x:2345:{own_gid}::/home/fxuser:/bin/bash\n"
    assert set(account()[1].split()) == {"fxuser", "video", "fxteam", "audio"}  # others kept
    # The primary group, by name or by gid.
    converge(root, user, "fxuser", group="fxteam", state=account)
    gid = int(sh(root, "getent group fxteam").split(":")[2])
    assert account()[0].split(":")[3] == str(gid)
    assert (
        user(OpContext(root, FactCache(root)), "fxuser", group=gid).msg
        == "user fxuser present (uid 2345)"
    )
    # group_member still works beside user().
    assert (
        group_member(OpContext(root, FactCache(root)), "fxuser", ["audio"]).msg
        == "fxuser is in audio"
    )

    preview, applied, again = converge(root, _absent_user, "fxuser", state=account)
    assert preview.diff == "user fxuser: uid 2345 -> absent\n"
    assert account()[0] == "" and again.msg == "user fxuser absent"


def test_system_user_without_a_home(root: Connection) -> None:
    sh(root, "getent group fxsvc >/dev/null || groupadd -r fxsvc")

    def account() -> str:
        return root.run("getent passwd fxsvc").stdout

    converge(
        root, user, "fxsvc", system=True, group="fxsvc", shell="/usr/sbin/nologin", state=account
    )
    _, _, uid, gid, _, home, shell = account().strip().split(":")
    assert int(uid) < 1000 and shell == "/usr/sbin/nologin"
    assert gid == sh(root, "getent group fxsvc").split(":")[2]
    assert root.run(f"test -e {home}").rc != 0  # a system account gets no home unless asked


def test_mistakes_fail_clearly(root: Connection) -> None:
    ctx = OpContext(root, FactCache(root))
    result = user(ctx, "fxnogroup", group="no-such-group")
    assert result.failed and "group 'no-such-group' does not exist" in result.msg, result
    assert root.run("getent passwd fxnogroup").stdout == ""
    taken = group(ctx, "fxdup", gid=0)
    assert taken.failed and "GID '0' already exists" in taken.msg, taken


def test_user_through_become_as_the_sudo_user(fleet: Fleet) -> None:
    password = fleet.become_password()
    if password is None:
        pytest.skip("sudo is not installed: lab hosts have no non-root user (apt-get install sudo)")
    with (
        fleet.connect("lab01") as root,
        fleet.connect("lab01", ansible_user=SUDO_USER, ansible_become_password=password) as conn,
    ):
        results = converge(
            conn,
            user,
            "fxbecome",
            shell="/bin/sh",
            become=True,
            state=lambda: root.run("getent passwd fxbecome").stdout,
        )
        assert root.run("getent passwd fxbecome").stdout.endswith(":/home/fxbecome:/bin/sh\n")
        # Without become: fails (the user's PATH has no /usr/sbin, and it could not write /etc).
        denied = user(OpContext(conn, FactCache(conn)), "fxdenied")
        assert denied.failed and denied.msg.startswith("create user fxdenied failed"), denied
        assert root.run("getent passwd fxdenied").stdout == ""
    for result in results:
        assert password not in repr(result)
