"""roles/rocm_host's variables (its role.py ``Vars``): each wrong value is refused with the
host, the variable and a hint, as the runner checks them before any host is touched
(tests/test_role_rocm_host.py runs the role itself on lab hosts)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fxkit.engine.role import RoleLoader
from fxkit.engine.variables import HostVars, Layer
from fxkit.errors import VarError

ROLE = RoleLoader([Path(__file__).resolve().parents[1] / "roles"]).load("rocm_host")
KEY = "73f5d8100de6048aa38a8b84cd9a87f05177d208ca3bb1bc4e2e9b6f7b2d6bba"


def typed(**values: Any) -> Any:
    """The role's typed values of a host with ``values`` in its inventory (and the key pin)."""
    inventory = {"rocm_host_key_sha256": KEY, **values}
    return ROLE.typed(
        HostVars("gpu01", [Layer("role defaults", ROLE.defaults), Layer("inventory", inventory)])
    )


def test_the_defaults_with_a_key_pin_are_typed_and_rendered() -> None:
    v = typed(rocm_repo_base="file:///srv/mirror")
    assert v.rocm_host_key_url == "file:///srv/mirror/rocm/rocm.gpg.key"
    assert (v.rocm_host_gpu_count, v.rocm_host_reboot, v.rocm_host_groups) == (
        8,
        False,
        ["render", "video"],
    )


def test_values_are_converted_as_an_inventory_gives_them() -> None:
    v = typed(
        rocm_host_reboot="yes",  # INI, -e
        rocm_host_gpu_count="4",
        rocm_host_rocm_repo=7.2,  # unquoted YAML: still the text it was before
        rocm_host_key_sha256="SHA256:" + KEY.upper(),  # as checksum files write it
    )
    assert (v.rocm_host_reboot, v.rocm_host_gpu_count, v.rocm_host_rocm_repo) == (True, 4, "7.2")


def test_the_key_pin_is_required_and_the_hint_says_how_to_get_it() -> None:
    with pytest.raises(VarError) as caught:
        ROLE.typed(HostVars("gpu01", [Layer("role defaults", ROLE.defaults)]))
    assert caught.value.where == "gpu01: rocm_host_key_sha256"
    assert caught.value.message == "rocm_host_key_sha256 is not set"
    assert "gpg --show-keys" in (caught.value.hint or "")


@pytest.mark.parametrize(
    "variable, value, words",
    [
        ("rocm_host_key_sha256", "", "not a sha256"),
        ("rocm_host_key_sha256", "ab" * 31, "not a sha256"),
        ("rocm_repo_base", "repo.radeon.com", "not an http(s):// or file:// URL"),
        ("rocm_host_key_url", "https://mirror/rocm key", "not an http(s):// or file:// URL"),
        ("rocm_host_rocm_repo", "latest", "not a repository version"),
        ("rocm_host_amdgpu_repo", True, "not a repository version"),  # "True"
        ("rocm_host_rocm_version", "7.2 beta", 'not an apt version or ""'),
        ("rocm_host_apt_arch", "amd 64", "not a Debian architecture"),
        ("rocm_host_key_file", "keyrings/rocm.gpg.key", "not absolute"),
        ("rocm_host_keyring", "", "not absolute"),
        ("rocm_host_pin_origin", "", "at least 1 character"),
        ("rocm_host_pin_priority", "high", "valid integer"),
        ("rocm_host_users", "alice", "valid list"),
        ("rocm_host_users", ["Alice"], "not a user name"),
        ("rocm_host_groups", "render", "valid list"),
        ("rocm_host_sysctl", ["kernel.numa_balancing=0"], "valid dictionary"),
        ("rocm_host_kernel_args", ["iommu=pt quiet"], "not a kernel argument"),
        ("rocm_host_iommu_arg", "on", "Input should be 'cpu', 'amd_iommu=on', 'intel_iommu=on'"),
        ("rocm_host_transparent_hugepage", "yes", "Input should be '', 'always'"),
        ("rocm_host_grub_dropin_override", "ignore", "Input should be 'fail' or 'edit'"),
        ("rocm_host_grub_dropins", "grub.d", "not absolute"),
        ("rocm_host_kernel_headers", "maybe", "valid boolean"),
        ("rocm_host_environment", {"HIP FORCE": "1"}, "not an environment variable name"),
        ("rocm_host_environment", {"HSA_X": "0 1"}, "not a value without spaces or quotes"),
        ("rocm_host_grub_file", "grub", "not absolute"),
        ("rocm_host_reboot", "maybe", "valid boolean"),
        ("rocm_host_reboot_timeout", 0, "greater than or equal to 1"),
        ("rocm_host_gpu_count", 0, "greater than or equal to 1"),
        ("rocm_host_gpu_count", True, "a boolean is not a number"),
        ("rocm_host_gpu_vram_gib", 191.5, "valid integer"),
        ("rocm_host_gpu_model", "MI 308X", "not a model name"),
    ],
)
def test_a_wrong_value_names_host_variable_and_hint(variable: str, value: Any, words: str) -> None:
    with pytest.raises(VarError) as caught:
        typed(**{variable: value})
    assert caught.value.where.startswith(f"gpu01: {variable}")  # or a path into it
    assert caught.value.where.endswith(" (inventory)")
    assert caught.value.message.startswith(f"{variable}"), caught.value.message
    assert words in caught.value.message
    assert caught.value.hint


def test_the_kernel_arguments_of_the_defaults() -> None:
    """AMD's required ones (kernel-parameters.md), the IOMMU one chosen later from the CPU."""
    v = typed()
    assert v.rocm_host_kernel_args == ["pci=realloc=off", "pci=bfsort", "iommu=pt"]
    assert (v.rocm_host_iommu_arg, v.rocm_host_numa_balancing_arg) == ("cpu", True)
    assert (v.rocm_host_max_cstate_arg, v.rocm_host_transparent_hugepage) == (False, "")
    assert v.rocm_host_environment == {
        "HIP_FORCE_DEV_KERNARG": "1",
        "HSA_OVERRIDE_CPU_AFFINITY_DEBUG": "0",
    }
    assert ROLE.validate is not None
    ROLE.validate(v)  # no two values for one setting


@pytest.mark.parametrize(
    "values, variable, words",
    [
        ({"rocm_host_kernel_args": ["iommu=pt", "iommu=off"]}, "rocm_host_kernel_args", "iommu"),
        (
            {"rocm_host_kernel_args": ["intel_iommu=off"], "rocm_host_iommu_arg": "intel_iommu=on"},
            "rocm_host_iommu_arg",
            "intel_iommu",
        ),
        (
            {"rocm_host_kernel_args": ["transparent_hugepage=never"]}
            | {"rocm_host_transparent_hugepage": "always"},
            "rocm_host_transparent_hugepage",
            "transparent_hugepage",
        ),
        (
            {"rocm_host_kernel_args": ["numa_balancing=enable"]},
            "rocm_host_numa_balancing_arg",
            "numa_balancing",
        ),
    ],
)
def test_two_values_for_one_kernel_setting_are_refused(
    values: dict[str, Any], variable: str, words: str
) -> None:
    v = typed(**values)
    assert ROLE.validate is not None
    with pytest.raises(VarError) as caught:
        ROLE.validate(v)
    assert caught.value.where.startswith(f"gpu01: {variable}")
    assert f"two values for {words}" in caught.value.message


def test_pci_options_are_separate_settings() -> None:
    """pci=realloc=off and pci=bfsort are two (AMD's grubby line gives both)."""
    assert ROLE.validate is not None
    ROLE.validate(typed(rocm_host_kernel_args=["pci=realloc=off", "pci=bfsort"]))
