"""Secrets stay secret (issue 8, part 4): one minimum length, nested keys, what templates make
of secrets, common transforms, and outputs that used to quote them (``-e`` errors, Jinja2
errors, ``fxkit inventory``). The whole path, over SSH: tests/test_secrets_lab.py."""

from __future__ import annotations

import base64
import json
import shlex
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from fxkit.cli import cli
from fxkit.engine.variables import HostVars, Layer, parse_extra_vars
from fxkit.errors import FxkitError, TemplateError, masked_errors
from fxkit.redaction import (
    MIN_SECRET_LENGTH,
    REDACTED,
    Masker,
    is_secret_name,
    maskable,
    masked,
    redact,
)


def shown(text: str, v: HostVars) -> str:
    """``text`` as fxkit prints it, with this host's secrets (what the report does)."""
    return redact(text, maskable(v.secret_values()))


def test_short_secret_values_are_masked_nowhere() -> None:
    extra = parse_extra_vars(['{"admin_pin_password": 8}', "pin_password=MI3 db_password=MI308"])
    v = HostVars("gpu01", [Layer("extra vars", extra)])
    assert v.secret_values() == {"8", "MI3", "MI308"}  # secret by name, all too short
    assert MIN_SECRET_LENGTH == 6
    # Masking them would give them away and corrupt the text: "MI30********X".
    assert shown("+gpu: MI308X (8 of them)\n", v) == "+gpu: MI308X (8 of them)\n"
    assert maskable(["8", "MI3", "12345"]) == []  # nor their base64 (the SSH layer's too)
    assert masked(extra) == {
        "admin_pin_password": 8,
        "pin_password": "MI3",
        "db_password": "MI308",
    }
    assert masked({"db_password": "MI308X"}) == {"db_password": REDACTED}


def test_nested_secret_keys_are_secret_as_written_and_rendered() -> None:
    v = HostVars(
        "gpu01",
        [
            Layer("inventory", {"vault_pw": "hunter2-from-vault", "bmc_user": "admin"}),
            Layer(
                "play vars",
                {
                    "creds": {"user": "{{ bmc_user }}", "password": "{{ vault_pw }}"},
                    "registries": [{"url": "https://r1", "auth": {"token": "tok-r1-8841"}}],
                    "nvme": {"dhchap": "DHHC-1:00:abcdef"},
                },
            ),
        ],
        secret_names=["dhchap"],  # a play's secret_vars name keys inside variables too
    )
    assert v.secret_values() == {
        "{{ vault_pw }}",
        "hunter2-from-vault",
        "tok-r1-8841",
        "DHHC-1:00:abcdef",
    }
    assert shown(f"login {v.creds}", v) == ("login {'user': 'admin', 'password': '********'}")
    assert masked(
        {"creds": {"user": "admin", "password": "hunter2x"}, "list": [{"api_key": "k-123456"}]}
    ) == {"creds": {"user": "admin", "password": REDACTED}, "list": [{"api_key": REDACTED}]}


TEMPLATE = """\
upper={{ db_password | upper }}
replaced={{ creds.password | replace('-', '_') }}
joined={{ 'user:' ~ db_password | reverse | join }}
{% set pw = db_password | title %}{% set again = pw %}
set={{ again }}
{% for part in db_password.split('-') %}part={{ part | upper }}
{% endfor %}
plain={{ address | upper }} {{ fleet[node].bmc }}
url={{ db_url }}
"""


def test_what_templates_make_of_secrets_is_recorded_as_they_render(tmp_path: Path) -> None:
    (tmp_path / "app.conf.j2").write_text(TEMPLATE)
    told: list[str] = []
    v = HostVars(
        "gpu01",
        [
            Layer(
                "play vars",
                {
                    "db_password": "hunter-two-x9",
                    "creds": {"password": "adm-pass-77"},
                    "address": "gpu01.lab",
                    "node": "gpu01",
                    "fleet": {"gpu01": {"bmc": "10.1.0.1", "password": "bmc-pass-31"}},
                    "db_url": "pg://app:{{ db_password | urlencode | upper }}@db",
                },
            )
        ],
        on_secret=told.extend,
    )
    text = v.render_template(tmp_path, "app.conf.j2")
    assert "upper=HUNTER-TWO-X9\n" in text and "url=pg://app:HUNTER-TWO-X9@db\n" in text
    rendered = {"HUNTER-TWO-X9", "adm_pass_77", "user:9x-owt-retnuh", "Hunter-Two-X9"}
    rendered |= {"HUNTER", "TWO", "X9"}  # from a loop over its parts
    assert rendered <= set(told) and set(told) <= v.secret_values()
    # Expressions that read no secret are not recorded (an address stays visible).
    assert not {"GPU01.LAB", "10.1.0.1"} & set(told)
    # Parts too short to be masked alone mask their lines; db_url reads a secret: all secret.
    assert shown(text, v) == (
        "upper=********\nreplaced=********\njoined=********\n"
        "set=********\npart=********\n********\n********\n"
        "plain=GPU01.LAB 10.1.0.1\nurl=********\n"
    )


def test_common_transforms_of_a_secret_are_masked() -> None:
    """What a Python role may do to a secret before it reaches a diff or a message."""
    secret = "p@ss w'rd\"é-42"
    v = HostVars("gpu01", [Layer("extra vars", {"db_password": secret})])
    for text in (
        secret.upper(),
        secret.lower(),
        base64.b64encode(secret.encode()).decode(),
        json.dumps({"pw": secret}),
        json.dumps({"pw": secret}, ensure_ascii=False),
        shlex.quote(secret),
        repr(secret),
        "p%40ss%20w%27rd%22%C3%A9-42",  # urllib.parse.quote
    ):
        assert secret.strip("'\"") not in shown(text, v)
        assert REDACTED in shown(text, v), text
    key = "-----BEGIN KEY-----\nMIIEvQIBADANBgkqhkiG9w0B\nBKcwggSjAgEAAoIBAQC7\n-----END KEY-----"
    v = HostVars("gpu01", [Layer("play vars", {"tls_secret": key})])
    diff = "".join(f"+{line}\n" for line in key.splitlines())  # every line prefixed: not whole
    assert "MIIEvQ" not in shown(diff, v) and "BKcwgg" not in shown(diff, v)


@pytest.mark.parametrize(
    "bad",
    [
        '{"db_password": "hunter22x", oops',  # not YAML: PyYAML's message quotes the text
        "{db_password: *hunter22x}",  # an undefined alias, named in PyYAML's message
        "db_password=hunter 22x9",  # a word without '=': the second half of the secret
        "db_password='hunter22x",  # no closing quote (a traceback before)
        "db_password:hunter22x",  # ':' for '='
    ],
)
def test_bad_extra_vars_never_quote_their_text(bad: str) -> None:
    with pytest.raises(FxkitError) as err:
        parse_extra_vars(["node_role=inference", bad])
    message = str(err.value)
    assert err.value.where == "-e #2" and err.value.hint
    for piece in ("hunter", "22x"):
        assert piece not in message


@pytest.mark.parametrize("value", ["pw{%x9q7{{zz", "ab{{ c9q7 }}de", "pw{{ x9q7 | nofilter }}"])
def test_errors_in_a_secret_value_quote_none_of_it(value: str) -> None:
    """A value with '{{' or '{%' is a template; Jinja2's errors quote pieces of it."""
    v = HostVars("gpu01", [Layer("inventory", {"db_password": value, "plain": value})])
    with pytest.raises(TemplateError) as err:
        v["db_password"]
    message = str(err.value)
    assert "x9q7" not in message and "c9q7" not in message and "zz" not in message
    assert "secret value (not shown)" in message and "{% raw %}" in (err.value.hint or "")
    assert err.value.where == "variable 'db_password' (inventory), line 1"
    with pytest.raises(TemplateError) as err:
        v["plain"]  # not a secret: the details stay
    assert "secret" not in str(err.value)


def test_inventory_masks_the_secret_vars_of_a_play(tmp_path: Path) -> None:
    (tmp_path / "hosts.yml").write_text(
        "all:\n"
        "  vars: {bmc_login: bmc-login-5521, registry: {url: r1, token: reg-tok-0042}}\n"
        "  hosts:\n"
        "    gpu01: {ansible_password: MI3, nvme_key: nvme-key-7781}\n"
    )
    (tmp_path / "site.yml").write_text(
        "- hosts: all\n  secret_vars: [bmc_login]\n  roles: []\n"
        "- hosts: gpu01\n  secret_vars: nvme_key\n  roles: []\n"
    )

    def inventory(*args: str) -> dict:
        path = str(tmp_path / "hosts.yml")
        result = CliRunner().invoke(cli, ["inventory", "-i", path, *args], catch_exceptions=False)
        assert result.exit_code == 0, result.output
        return json.loads(result.output)

    plain = inventory("--host", "gpu01")
    assert plain["bmc_login"] == "bmc-login-5521"  # secret only for the play that says so
    assert plain["registry"] == {"url": "r1", "token": REDACTED}  # nested
    assert plain["ansible_password"] == "MI3"  # too short to be masked anywhere
    expected = {**plain, "bmc_login": REDACTED, "nvme_key": REDACTED}
    assert inventory("--host", "gpu01", "--playbook", str(tmp_path / "site.yml")) == expected
    assert inventory("--host", "gpu01", "--secret-vars", "bmc_login,nvme_key") == expected
    listed = inventory("--list", "--playbook", str(tmp_path / "site.yml"))
    assert listed["_meta"]["hostvars"]["gpu01"] == expected


# -- issue 27, item 3 --------------------------------------------------------------------------

SECRET_NAMES = [
    "nvme_dhchap_key",  # the value is a key: the last word says what it is
    "nvme_dhchap_ctrl_key",
    "registry_auth_key",
    "private_key",
    "ssh_private_key_passphrase",
    "tls_key",
    "ssh_key",
    "aws_secret_access_key",
    "credentials",
    "registry_credential",
    "apikey",
    "apiKey",  # camelCase words
    "HF_TOKEN",
    "dbPassword",
    "wifi_psk",
    "session_cookie",
    "http_authorization",
    "ansible_ssh_pass",
    "password_hash",  # a password's hash can be cracked: only reference words lift the mark
    "vault_secrets",
]
VISIBLE_NAMES = [
    "rocm_host_key_sha256",  # a digest of a public key: the last word says what the value is
    "num_key_value_heads",  # a model's config.json
    "ssh_strict_host_key_checking",
    "key_filename",
    "rocm_host_key_url",
    "rocm_host_key_file",
    "rocm_host_keyring",
    "ansible_ssh_private_key_file",  # a path to the key, not the key
    "vault_password_file",
    "password_min_length",
    "token_ttl",
    "secret_name",  # e.g. a Kubernetes secret's name
    "ssh_public_key",  # public
    "ssh_pub_key",
    "key",  # alone: a mapping's key as often as a cryptographic one
    "keyboard_layout",
    "max_tokens",
    "tokenizer_mode",
    "passthrough_mode",
    "fxkit_secret_vars",  # the list of names, not a secret
    "dhchap_hash",
]


@pytest.mark.parametrize("name", SECRET_NAMES)
def test_secret_names_by_the_usual_conventions(name: str) -> None:
    assert is_secret_name(name), name
    assert masked({name: "s3cret-value-42"}) == {name: REDACTED}


@pytest.mark.parametrize("name", VISIBLE_NAMES)
def test_names_that_only_refer_to_or_describe_a_secret_stay_visible(name: str) -> None:
    assert not is_secret_name(name), name
    assert masked({name: "/etc/apt/keyrings/rocm.gpg"}) == {name: "/etc/apt/keyrings/rocm.gpg"}


def test_fxkit_secret_vars_marks_more_names_at_every_level() -> None:
    v = HostVars(
        "gpu01",
        [
            Layer("role x defaults", {"site_pin": "pin-31337-x", "other": "plain-text"}),
            Layer(
                "inventory",
                {
                    "fxkit_secret_vars": ["bmc_*", "site_pin"],
                    "bmc_login": "bmc-login-0451",
                    "fleet": {"gpu01": {"bmc_user": "bmc-admin-11"}},  # nested keys too
                },
            ),
            Layer("extra vars", {"fxkit_secret_vars": "lmcache_remote"}),  # one name; adds
            Layer("extra vars", {"lmcache_remote": "lm://user:pw-9911@cache"}),
        ],
    )
    assert v.is_secret("bmc_login") and v.is_secret("site_pin") and v.is_secret("lmcache_remote")
    assert not v.is_secret("other") and not v.is_secret("fxkit_secret_vars")
    assert v.secret_values() == {
        "pin-31337-x",
        "bmc-login-0451",
        "bmc-admin-11",
        "lm://user:pw-9911@cache",
    }
    # fxkit inventory masks them too (the variables' own list).
    shown = masked({"fxkit_secret_vars": ["bmc_*"], "bmc_login": "bmc-login-0451"})
    assert shown == {"fxkit_secret_vars": ["bmc_*"], "bmc_login": REDACTED}


@pytest.mark.parametrize("bad", [{"a": 1}, ["ok", 3], 7])
def test_a_malformed_fxkit_secret_vars_is_a_clear_error(bad: object) -> None:
    with pytest.raises(FxkitError) as err:
        HostVars("gpu01", [Layer("inventory", {"fxkit_secret_vars": bad})])
    assert "fxkit_secret_vars" in str(err.value) and "inventory" in str(err.value)
    assert err.value.hint and "glob" in err.value.hint


TOKEN = "hunter2-xyz-4471"


def tainted_vars(**more: Any) -> HostVars:
    return HostVars(
        "gpu01",
        [
            Layer(
                "inventory",
                {
                    "registry_token": TOKEN,
                    "prefix": "{{ registry_token[0:4] }}",
                    "auth_line": "Bearer {{ prefix }}-{{ registry_token[4:7] }}",
                    "shouted": "{{ registry_token | upper }}",
                    "turned": "{{ ('user:' ~ registry_token) | reverse | join }}",
                    "model": "{{ gpu }}-tp8",
                    "gpu": "MI308X",
                    "pin_password": "MI3",  # a short secret: masked nowhere, by rule
                    **more,
                },
            )
        ],
    )


def test_what_is_rendered_from_a_secret_is_secret_whole() -> None:
    """Taint through rendering: a value whose template reads a secret is secret, whole, and so
    is every variable whose value reads one (``auth_line`` reads ``prefix``)."""
    v = tainted_vars()
    assert v["auth_line"] == "Bearer hunt-er2"
    for name in ("prefix", "auth_line", "shouted", "turned"):
        v[name]
        assert v.is_secret(name), name
    assert not v.is_secret("model") and v["model"] == "MI308X-tp8"
    rendered = {
        "Bearer hunt-er2",  # a slice and a slice of a slice, concatenated
        TOKEN.upper(),
        f"user:{TOKEN}"[::-1],
    }
    assert rendered <= v.secret_values()
    line = f"login with {v['auth_line']} as {v['turned']}; gpu {v['model']} ({TOKEN.upper()})"
    assert shown(line, v) == "login with ******** as ********; gpu MI308X-tp8 (********)"
    # A gate's rule or parameter, rendered on its own, is secret whole too.
    command = v.render_string("echo {{ registry_token[0:3] }}:{{ 7 * 6 }}", "check c, measure")
    assert command == "echo hun:42" and shown(f"ran {command}", v) == "ran ********"
    assert v.render_string("{{ gpu | lower }}", "check c, rule") == "mi308x"
    assert shown("mi308x", v) == "mi308x"


SLICES = """\
gpu: {{ gpu }}
pin: {{ pin_password }}
prefix: {{ registry_token[0:4] }}
first: {{ registry_token | first }}
{% set head = registry_token[:3] %}head={{ head }}
length: {{ registry_token | length }}
url: https://r.lab/{{ registry_token }}/x
"""


def test_short_pieces_of_a_secret_in_a_template_file_mask_their_line(tmp_path: Path) -> None:
    (tmp_path / "slices.j2").write_text(SLICES)
    v = tainted_vars()
    text = v.render_template(tmp_path, "slices.j2")
    assert text == SLICES.replace("{% set head = registry_token[:3] %}", "").replace(
        "{{ registry_token[0:4] }}", "hunt"
    ).replace("{{ registry_token | first }}", "h").replace("{{ head }}", "hun").replace(
        "{{ registry_token | length }}", str(len(TOKEN))
    ).replace("{{ registry_token }}", TOKEN).replace("{{ gpu }}", "MI308X").replace(
        "{{ pin_password }}", "MI3"
    )
    diff = "".join(f"+{line}\n" for line in text.splitlines())
    assert shown(diff, v) == (
        "+gpu: MI308X\n"
        "+pin: MI3\n"  # the secret as it is, too short: the rule for short secrets holds
        "+********\n"  # pieces too short to mask alone: their whole line
        "+********\n"
        "+********\n"
        "+********\n"
        "+url: https://r.lab/********/x\n"  # long enough: masked where it stands
    )


def test_errors_leave_fxkit_with_secrets_masked() -> None:
    """``undefined variable 'hunter2xyz'``: Jinja2 names a missing key by the secret that
    looked it up; the error's message, place and hint are masked like everything printed."""
    v = tainted_vars(expected={"a": 1})
    with pytest.raises(TemplateError) as err:
        v.render_string("{{ expected[registry_token] }}", "check c, rule")
    assert TOKEN in str(err.value)  # what Jinja2 says; masked on the way out
    mask = Masker()
    mask.add(v.secret_values())
    out = err.value.masked(mask.text)
    assert TOKEN not in str(out) and "undefined variable '********'" in str(out)
    assert type(out) is type(err.value) and out.where == err.value.where
    with pytest.raises(TemplateError, match=r"'\*{8}'"), masked_errors(mask.text):
        raise err.value
