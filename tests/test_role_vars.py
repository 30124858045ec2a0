"""A role's variables declared once (role.py's ``Vars``, :mod:`fxkit.engine.rolevars`): the
defaults, the checks of every host before any host is touched, the typed ``v`` that ``apply``
receives (checked by mypy) and the README table all come from it."""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path
from typing import Annotated, Literal

import pytest
from mypy import api as mypy
from pydantic import BaseModel, Field
from test_runner import VALIDATED, Fleet, play

from fxkit.engine.role import RoleLoader
from fxkit.engine.rolevars import Nqn, RoleVars, Whole, check_vars, pattern, readme_table
from fxkit.engine.variables import HostVars, Layer
from fxkit.errors import PlaybookError, VarError

ROOT = Path(__file__).resolve().parent.parent

TYPED = {
    "roles/typed/role.py": """
        from pydantic import Field

        from fxkit.engine.rolevars import AbsolutePath, Nqn, RoleVars, Whole
        from fxkit.errors import VarError


        class Vars(RoleVars):
            mtu: Whole = Field(9000, ge=68, le=9216, description="MTU", examples=[9000])
            nqn: Nqn = Field("nqn.2024-01.io.fx:a", description="the subsystem")
            jumbo: bool = Field(False, description="jumbo frames")
            etc: AbsolutePath = Field("{{ root }}/etc", description="configuration")
            root: str = Field("", description="prefix")


        def validate(v: Vars) -> None:
            if v.jumbo and v.mtu < 9000:
                raise VarError("jumbo frames need mtu 9000", where=f"{v.host}: mtu")


        def validate_all(hosts: dict[str, Vars]) -> None:
            seen: dict[str, str] = {}
            for name, v in hosts.items():
                if v.nqn in seen:
                    raise VarError(f"{v.nqn} is used by {seen[v.nqn]} and {name}",
                                   where=f"{name}: nqn")
                seen[v.nqn] = name


        def apply(host, v: Vars) -> None:
            host.put("/vars", f"{type(v).__name__} {v.host} {v.mtu!r} {v.jumbo!r} {v.etc} "
                     f"{v.all['inventory_hostname']}")
        """,
}


def test_every_wrong_variable_of_every_host_is_named_with_its_place_and_hint(
    tmp_path: Path,
) -> None:
    inventory = """
    all:
      hosts:
        h1: {mtu: 99999}
        h2: {mtu: true, nqn: "nqn.2024-13.io.fx:b"}
        h3: {jumbo: true, mtu: 1500, nqn: "nqn.2024-01.io.fx:c"}
        h4: {root: relative, nqn: "nqn.2024-01.io.fx:d"}
    """
    fleet = Fleet()
    with pytest.raises(VarError) as caught:
        play(tmp_path, "- hosts: all\n  roles: [typed]\n", inventory, TYPED, fleet=fleet)
    text = str(caught.value)
    assert "role typed: 5 wrong variables (nothing was changed)" in text
    assert f"h1: mtu ({tmp_path / 'hosts.yml'}:4)" in text  # where the value was set
    assert "mtu is 99999: Input should be less than or" in text
    assert "hint: e.g. 9000" in text  # from the field's examples
    assert "mtu is True: a boolean is not a number" in text
    assert "nqn is 'nqn.2024-13.io.fx:b'" in text and "is not a year and month" in text
    assert "h3: mtu: jumbo frames need mtu 9000" in text  # validate(v), on typed values
    assert "etc is 'relative/etc': not absolute" in text  # a templated default, rendered
    assert "h1 and h2" not in text  # validate_all waits until every host's values are typed
    assert fleet.hosts == {}  # no host was even connected


def test_apply_receives_the_typed_values_converted_as_an_inventory_gives_them(
    tmp_path: Path,
) -> None:
    inventory = """
    all:  # strings, as an INI inventory or -e gives them
      hosts: {h1: {mtu: "1500", jumbo: "no", nqn: "nqn.2024-01.io.fx:one", root: /srv}}
    """
    played = play(tmp_path, "- hosts: all\n  roles: [typed]\n", inventory, TYPED)
    assert played.fleet.hosts["h1"].files["/vars"] == b"Vars h1 1500 False /srv/etc h1"


def test_validate_all_receives_typed_values_of_every_host(tmp_path: Path) -> None:
    inventory = "all: {hosts: {h1: {}, h2: {}}}"
    with pytest.raises(VarError, match=r"nqn\.2024-01\.io\.fx:a is used by h1 and h2"):
        play(tmp_path, "- hosts: all\n  roles: [typed]\n", inventory, TYPED)


ACROSS = {
    **TYPED,
    "roles/across/role.py": """
        from fxkit.errors import VarError


        def validate_all(hosts, fleet):
            seen = {h: v.nqn for h, v in fleet.of("typed").items()}
            if len(set(seen.values())) < len(seen):
                raise VarError(f"typed across the inventory: {sorted(seen.items())}")


        def apply(host, v):
            pass
        """,
}
TWO_PLAYS = """
- hosts: targets
  roles: [typed]
- hosts: others
  roles: [across]
"""


@pytest.mark.parametrize("limit", [None, "others", "nobody"])
def test_validate_all_reads_another_role_s_values_across_the_inventory(
    tmp_path: Path, limit: str | None
) -> None:
    """fleet.of(role): every host that runs it in the playbook, or that sets one of its
    variables (h3, in no play), whatever --limit says."""
    inventory = """
    all:
      children:
        targets: {hosts: {h1: {nqn: "nqn.2024-01.io.fx:a"}}}
        others: {hosts: {h2: {}, h3: {nqn: "nqn.2024-01.io.fx:a"}}}
    """
    fleet = Fleet()
    with pytest.raises(VarError) as caught:
        play(tmp_path, TWO_PLAYS, inventory, ACROSS, fleet=fleet, limit=limit)
    assert "typed across the inventory: [('h1', 'nqn.2024-01.io.fx:a'), ('h3', " in str(
        caught.value
    )
    assert fleet.hosts == {}


def test_a_validate_all_of_three_arguments_is_refused(tmp_path: Path) -> None:
    role = tmp_path / "roles" / "three"
    role.mkdir(parents=True)
    (role / "role.py").write_text("def validate_all(a, b, c): pass\ndef apply(host, v): pass\n")
    with pytest.raises(
        PlaybookError, match="validate_all must be a function of one or two arguments"
    ):
        RoleLoader([tmp_path / "roles"]).load("three")


def test_a_role_without_vars_keeps_its_untyped_hostvars(tmp_path: Path) -> None:
    with pytest.raises(VarError, match="mtu 0 is out of range"):
        play(
            tmp_path, "- hosts: all\n  roles: [checked]\n", "all: {hosts: {h: {mtu: 0}}}", VALIDATED
        )


def test_defaults_declared_twice_are_refused(tmp_path: Path) -> None:
    role = tmp_path / "roles" / "typed"
    role.mkdir(parents=True)
    (role / "role.py").write_text(textwrap.dedent(TYPED["roles/typed/role.py"]))
    (role / "defaults.yml").write_text("mtu: 1500\n")
    with pytest.raises(PlaybookError, match="declares its variables twice") as caught:
        RoleLoader([tmp_path / "roles"]).load("typed")
    assert caught.value.where == str(role / "defaults.yml")


class Port(BaseModel):
    addr: str = Field(description="the address")
    kind: Literal["rdma", "tcp"] = Field("rdma", description="the transport")


class Sample(RoleVars):
    sample_ports: list[Port] = Field([], description="ports | listeners")
    sample_name: Annotated[str, pattern(r"[a-z]+", "a lowercase word")] = Field(
        "abc", description="a name"
    )
    sample_count: Whole = Field(2, ge=1, le=8, description="how many")
    sample_nqn: Nqn = Field(description="required")


def test_the_readme_table_says_types_bounds_defaults_and_nested_keys() -> None:
    table = readme_table(Sample)
    assert "| `sample_ports` | list of Port | `[]` | ports \\| listeners |" in table
    assert "| `sample_name` | a lowercase word | `abc` | a name |" in table
    assert "| `sample_count` | int (≥ 1, ≤ 8) | `2` | how many |" in table
    assert "| `sample_nqn` | NQN | (required) | required |" in table
    assert "Keys of each `Port`:" in table
    assert "| `kind` | one of `rdma`, `tcp` | `rdma` | the transport |" in table
    assert Sample.defaults() == {"sample_ports": [], "sample_name": "abc", "sample_count": 2}


class Lun(BaseModel):
    size: Whole = Field(description="bytes", examples=[512])


class Target(BaseModel):
    luns: list[Lun] = Field([], description="its LUNs")


class Nested(RoleVars):
    nested_targets: list[Target] = Field([], description="targets")


def test_models_within_models_have_their_tables_and_hints() -> None:
    table = readme_table(Nested)
    assert table.index("Keys of each `Target`:") < table.index("Keys of each `Lun`:")
    assert "| `size` | int | (required) | bytes |" in table
    inventory = {"nested_targets": [{"luns": [{"size": 512}, {"size": "x"}]}]}
    _, [problem] = check_vars(Nested, HostVars("h1", [Layer("inventory", inventory)]))
    assert problem.message.startswith("nested_targets[0].luns[1].size is 'x': ")
    assert problem.hint == "e.g. 512"  # the key's examples, not the variable's description


def test_mypy_and_validation_both_catch_a_misspelt_name_and_a_wrong_type(
    tmp_path: Path,
) -> None:
    """The built-in node_base role, with two mistakes added to its apply: mypy names both at
    their lines. The same misspelling in an inventory is refused at validation."""
    role = tmp_path / "roles" / "node_base"
    shutil.copytree(ROOT / "roles" / "node_base", role)
    source = (role / "role.py").read_text()
    source += "\n\ndef broken(host: Host, v: Vars) -> None:\n"
    source += "    host.directory(v.node_base_etc_dri)\n"  # misspelt
    source += "    host.directory(v.node_gpu_count)\n"  # an int where a path goes
    (role / "role.py").write_text(source)
    lines = source.splitlines()
    out, _, status = mypy.run(
        ["--config-file", str(ROOT / "pyproject.toml"), str(role / "role.py")]
    )
    assert status == 1, out
    misspelt = lines.index("    host.directory(v.node_base_etc_dri)") + 1
    assert f'role.py:{misspelt}: error: "Vars" has no attribute "node_base_etc_dri"' in out
    wrong_type = f'role.py:{misspelt + 1}: error: Argument 1 has incompatible type "int"; '
    assert wrong_type + 'expected "str"' in out

    inventory = "all: {hosts: {h1: {node_gpu_count: eight}}}"
    with pytest.raises(VarError) as caught:
        play(tmp_path, "- hosts: all\n  roles: [node_base]\n", inventory)
    assert caught.value.where == f"h1: node_gpu_count ({tmp_path / 'hosts.yml'}:1)"
    assert "node_gpu_count is 'eight': Input should be a valid integer" in caught.value.message


class Wide(RoleVars):
    wide_memlock: str | Whole = Field("unlimited", description="a text or a number")
    wide_sysctl: dict[str, str | int] = Field({}, description="name: value")
    wide_token: str = Field("", max_length=8, description="a secret")


def test_a_value_no_type_of_a_union_takes_is_one_error_at_its_own_place() -> None:
    v = HostVars("h1", [Layer("inventory", {"wide_memlock": [1], "wide_sysctl": {"vm.x": [2]}})])
    _, problems = check_vars(Wide, v)
    assert [(p.where, p.message) for p in problems] == [
        (
            "h1: wide_memlock (inventory)",
            "wide_memlock is [1]: Input should be a valid string, or a valid integer",
        ),
        (
            "h1: wide_sysctl.vm.x (inventory)",
            "wide_sysctl.vm.x is [2]: Input should be a valid string, or a valid integer",
        ),
    ]


def test_a_long_secret_quoted_in_an_error_is_masked_whole_before_it_is_cut() -> None:
    token = "hf_" + "A" * 70 + "'"  # past the 60 characters a quoted value is cut at
    v = HostVars("h1", [Layer("inventory", {"wide_token": token})])
    _, [problem] = check_vars(Wide, v)
    assert "hf_" not in str(problem) and "AAAA" not in str(problem)
    assert problem.message.startswith("wide_token is '********': String should have at most 8")
