"""Variables: precedence layers, lazy rendering, StrictUndefined errors, extra vars, secrets."""

from __future__ import annotations

from pathlib import Path

import pytest

from fxkit.engine.variables import HostVars, Layer, UndefinedVariable, parse_extra_vars
from fxkit.errors import FxkitError, TemplateError
from fxkit.redaction import is_secret_name

LEVELS = ["role defaults", "inventory", "play vars", "play vars_files", "role parameters", "extra"]


@pytest.mark.parametrize("top", range(len(LEVELS)))
def test_each_level_overrides_the_ones_below(top: int) -> None:
    layers = [Layer(name, {"level": name, f"only_{i}": i}) for i, name in enumerate(LEVELS)]
    v = HostVars("h1", layers[: top + 1])
    assert v["level"] == LEVELS[top]
    assert v.source("level") == LEVELS[top]
    assert [v[f"only_{i}"] for i in range(top + 1)] == list(range(top + 1))


def test_a_higher_level_replaces_a_whole_mapping() -> None:
    v = HostVars("h1", [Layer("low", {"m": {"a": 1, "b": 2}}), Layer("high", {"m": {"a": 9}})])
    assert v.m == {"a": 9}


def test_values_render_lazily_with_the_winning_values() -> None:
    v = HostVars(
        "h1",
        [
            Layer("defaults", {"root": "/opt", "app": "{{ root }}/fxkit", "ports": [1, 2]}),
            Layer("play vars", {"root": "/srv", "all_ports": "{{ ports }}", "n": "{{ 2 * 21 }}"}),
            Layer("extra", {"nested": {"path": "{{ app }}/etc", "list": ["{{ root }}"]}}),
        ],
    )
    assert v.app == "/srv/fxkit"
    assert v.nested == {"path": "/srv/fxkit/etc", "list": ["/srv"]}
    assert v.all_ports == [1, 2]  # native types survive rendering
    assert v.n == 42
    assert v.get("missing", "dflt") == "dflt"
    assert "root" in v and "missing" not in v


def test_an_unused_broken_variable_does_not_matter() -> None:
    v = HostVars("h1", [Layer("defaults", {"ok": "fine", "broken": "{{ nowhere }}"})])
    assert v.ok == "fine"


def test_undefined_in_a_variable_names_variable_source_line_and_host() -> None:
    v = HostVars("node7", [Layer("play vars", {"path": "first\n{{ base_dir }}/x"})])
    with pytest.raises(TemplateError) as err:
        v["path"]
    text = str(err.value)
    assert "variable 'path' (play vars), line 2" in text
    assert "'base_dir'" in text and "node7" in text


def test_undefined_attribute_is_named_too() -> None:
    v = HostVars("h1", [Layer("defaults", {"d": {}, "x": "{{ d.missing_key }}"})])
    with pytest.raises(TemplateError, match="missing_key"):
        v["x"]


def test_reading_an_undefined_variable_in_role_code() -> None:
    v = HostVars("h1", [])
    with pytest.raises(UndefinedVariable, match="'nope' is not defined") as err:
        _ = v.nope
    assert err.value.where == "host h1"
    assert isinstance(err.value, KeyError)  # so Mapping.get and `in` work


def test_a_reference_loop_is_an_error_naming_the_loop() -> None:
    v = HostVars("h1", [Layer("defaults", {"a": "{{ b }}", "b": "{{ c }}", "c": "{{ a }}"})])
    with pytest.raises(TemplateError, match="a -> b -> c -> a"):
        v["a"]


def test_template_file_errors_name_file_line_variable_and_host(tmp_path: Path) -> None:
    (tmp_path / "node.yaml.j2").write_text("name: {{ inventory_hostname }}\nrack: {{ rack }}\n")
    v = HostVars("gpu3", [Layer("fxkit", {"inventory_hostname": "gpu3"})])
    with pytest.raises(TemplateError) as err:
        v.render_template(tmp_path, "node.yaml.j2")
    assert err.value.where == f"{tmp_path / 'node.yaml.j2'}:2"
    assert "'rack'" in str(err.value) and "gpu3" in str(err.value)


def test_template_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "t.j2").write_text("ok\n\n{% if %}\n")
    with pytest.raises(TemplateError) as err:
        HostVars("h1", []).render_template(tmp_path, "t.j2")
    assert err.value.where == f"{tmp_path / 't.j2'}:3"


def test_template_renders_text_one_line_per_item(tmp_path: Path) -> None:
    (tmp_path / "t.j2").write_text("port={{ port }}\n{% for d in dirs %}\n{{ d }}\n{% endfor %}\n")
    v = HostVars("h1", [Layer("defaults", {"port": 22, "dirs": ["/a", "/b"]})])
    assert v.render_template(tmp_path, "t.j2") == "port=22\n/a\n/b\n"


def test_missing_template_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(TemplateError, match=r"'nope\.j2' not found"):
        HostVars("h1", []).render_template(tmp_path, "nope.j2")


def test_extra_vars_forms_and_order(tmp_path: Path) -> None:
    (tmp_path / "more.yml").write_text("from_file: 1\nb: file\n")
    merged = parse_extra_vars(
        ["a=1 b='two words'", '{"j": [1, 2], "a": "json"}', f"@{tmp_path / 'more.yml'}"]
    )
    assert merged == {"a": "json", "b": "file", "j": [1, 2], "from_file": 1}


@pytest.mark.parametrize("bad", ["novalue", "{not: [valid", "@/nonexistent/vars.yml", "1x=2"])
def test_bad_extra_vars_are_clear_errors(bad: str) -> None:
    with pytest.raises(FxkitError) as err:
        parse_extra_vars([bad])
    assert err.value.hint


def test_extra_vars_file_must_hold_a_mapping(tmp_path: Path) -> None:
    (tmp_path / "list.yml").write_text("- a\n- b\n")
    with pytest.raises(FxkitError, match="must be a mapping"):
        parse_extra_vars([f"@{tmp_path / 'list.yml'}"])


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("ansible_become_password", True),
        ("ansible_ssh_pass", True),
        ("registry_token", True),
        ("lmcache_secret", True),
        ("hf_api_key", True),
        ("max_num_batched_tokens", False),
        ("passthrough_mode", False),
        ("node_name", False),
    ],
)
def test_secret_names(name: str, secret: bool) -> None:
    assert is_secret_name(name) is secret


def test_secret_values_include_listed_names_and_rendered_values() -> None:
    v = HostVars(
        "h1",
        [
            Layer("inventory", {"ansible_become_password": "{{ vault_pw }}", "vault_pw": "s3cr3t"}),
            Layer("play vars", {"nvme_dhchap": "DHHC-1:00:abc", "plain": "x"}),
        ],
        secret_names=["nvme_dhchap"],
    )
    assert v.secret_values() == {"{{ vault_pw }}", "s3cr3t", "DHHC-1:00:abc"}


#: Templates that reach Python's internals: each would run `touch MARKER` outside a sandbox.
ESCAPES = [
    "{{ lipsum.__globals__['os'].popen('touch MARKER').read() }}",
    "{{ cycler.__init__.__globals__.os.popen('touch MARKER').read() }}",
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ joiner.__init__.__globals__['__builtins__']['open']('MARKER', 'w') }}",
    "{% set d = {} %}{{ d.update(a=1) }}{{ namespace.__init__.__globals__ }}",
]


@pytest.mark.parametrize("source", ESCAPES)
def test_a_variable_cannot_reach_python_internals(source: str, tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    v = HostVars("h1", [Layer("inventory", {"x": source.replace("MARKER", str(marker))})])
    with pytest.raises(TemplateError) as err:
        v["x"]
    assert not marker.exists()
    assert err.value.where == "variable 'x' (inventory), line 1"
    assert "SecurityError for host h1" in err.value.message and "unsafe" in err.value.message


def test_a_template_file_cannot_reach_python_internals(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    (tmp_path / "t.j2").write_text(f"ok\n{ESCAPES[0].replace('MARKER', str(marker))}\n")
    with pytest.raises(TemplateError) as err:
        HostVars("h1", []).render_template(tmp_path, "t.j2")
    assert not marker.exists()
    assert err.value.where == f"{tmp_path / 't.j2'}:2" and "unsafe" in err.value.message


def test_templates_cannot_change_a_variable_in_place() -> None:
    v = HostVars("h1", [Layer("play vars", {"ports": [1], "x": "{{ ports.append(2) }}"})])
    with pytest.raises(TemplateError, match="unsafe"):
        v["x"]
    assert v["ports"] == [1]


@pytest.mark.parametrize(
    ("source", "rendered"),
    [
        ("{{ missing | default('d') }}", "d"),
        ("{{ missing | default(omitted, true) if false else 3 }}", 3),
        ("{{ ports | map('string') | join(' ') }}", "22 80"),
        ("{{ ports | first }}", 22),
        ("{{ ports | sum + ports | max + ports | length }}", 184),
        ("{{ '42' | int + 1 }}", 43),
        ("{{ name | upper }}", "NODE"),
        ("{{ ports | list }}", [22, 80]),
        ("{{ users | selectattr('admin') | map(attribute='name') | list }}", ["ann"]),
        ("{{ users | map(attribute='name') | select('ne', 'ann') | list }}", ["bob"]),
        ("{{ m | dictsort | first | last }}", 1),
        ("{{ '%s-%d' | format(name, 7) }}", "node-7"),
        ("{{ '{}:{}'.format(name, ports[0]) }}", "node:22"),
        ("{{ name is string and ports is iterable and 3 is number }}", True),
        ("{{ range(3) | list }}", [0, 1, 2]),
        (
            "{% set ns = namespace(n=0) %}{% for p in ports %}{% set ns.n = ns.n + p %}"
            "{% endfor %}{{ ns.n }}",
            102,
        ),
        ("{{ dict(a=1).items() | list }}", [("a", 1)]),
        ("{{ name.split('o') }}", ["n", "de"]),
    ],
)
def test_jinja2_filters_tests_and_methods_still_work(source: str, rendered: object) -> None:
    values = {"ports": [22, 80], "name": "node", "m": {"a": 1}}
    values["users"] = [{"name": "ann", "admin": True}, {"name": "bob", "admin": False}]
    v = HostVars("h1", [Layer("play vars", {**values, "x": source})])
    assert v["x"] == rendered


@pytest.mark.parametrize(
    ("source", "error"),
    [
        ("{{ 1 / 0 }}", "ZeroDivisionError for host h1: division by zero"),
        ("{{ [1, 'a'] | sum }}", "TypeError for host h1: unsupported operand"),
        ("{{ none | join(',') }}", "TypeError for host h1: 'NoneType' object is not iterable"),
        ("{{ 'x' * 2 ** 70 }}", "OverflowError for host h1"),
        ("{{ '%d' | format('x') }}", "TypeError for host h1: %d format"),
    ],
)
def test_an_error_in_a_variable_names_it_and_where_it_was_set(source: str, error: str) -> None:
    v = HostVars("h1", [Layer("play vars", {"a": "{{ b }}", "b": f"line 1\n{source}"})])
    with pytest.raises(TemplateError) as err:
        v["a"]  # the error is b's, where a reads it
    assert err.value.where == "variable 'b' (play vars), line 2"
    assert error in err.value.message


def test_an_error_renders_no_other_variable(tmp_path: Path) -> None:
    """The error of a template that sets a name is its own: finding its line renders nothing
    else (Jinja2's debug traceback would render every variable, the broken one here too)."""
    marker = tmp_path / "marker"
    layer = {
        "x": "{% set n = 1 %}\n{{ n / 0 }}",
        "broken": "{{ nowhere }}",
        "escape": ESCAPES[0].replace("MARKER", str(marker)),
    }
    with pytest.raises(TemplateError) as err:
        HostVars("h1", [Layer("play vars", layer)])["x"]
    assert err.value.where == "variable 'x' (play vars), line 2"
    assert "ZeroDivisionError" in err.value.message
    (tmp_path / "t.j2").write_text("{% set n = 1 %}\n{{ n.missing.x }}\n")
    with pytest.raises(TemplateError) as err:
        HostVars("h1", [Layer("play vars", layer)]).render_template(tmp_path, "t.j2")
    assert err.value.where == f"{tmp_path / 't.j2'}:2" and "'missing'" in err.value.message


def test_a_rendered_layer_is_data() -> None:
    kept = {"label": "{{ 7 * 6 }}", "low": "{{ 1 / 0 }}"}
    v = HostVars(
        "h1",
        [Layer("run", kept, rendered=True), Layer("gate", {"low": 2, "x": "{{ label }}!"})],
    )
    assert v["label"] == "{{ 7 * 6 }}" and v["x"] == "{{ 7 * 6 }}!" and v["low"] == 2
