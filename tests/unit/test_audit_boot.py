"""The audit's boot-configuration rule: the running kernel's command line against the image."""

from __future__ import annotations

from mctl.audit.rules import boot
from mctl.model.findings import Severity

PARAMS = ["init_on_alloc=0", "iommu.passthrough=1"]
CMDLINE = "BOOT_IMAGE=/vmlinuz-6.8.0-1025-nvidia-64k root=UUID=x ro quiet splash\n"


def test_no_parameters_no_finding():
    assert boot.check_tray("t", [], {}, {}) == []


def test_running_with_them_is_ok():
    (f,) = boot.check_tray("t", PARAMS, {boot.CMDLINE: CMDLINE.strip() + " init_on_alloc=0 iommu.passthrough=1\n",
                                         boot.REBOOT_FLAG: None}, {})
    assert f.severity is Severity.OK


def test_provisioned_but_not_rebooted_is_reboot_required():
    (f,) = boot.check_tray("t", PARAMS, {boot.CMDLINE: CMDLINE + "", boot.REBOOT_FLAG: "init_on_alloc=0\n"}, {})
    assert f.severity is Severity.WARN and f.details["reboot_required"] is True
    assert f.message == "reboot required: boot configuration has init_on_alloc=0 iommu.passthrough=1, " \
                        "the running kernel does not"


def test_never_provisioned_says_so_and_a_partial_match_names_the_missing_one():
    (f,) = boot.check_tray("t", PARAMS, {boot.CMDLINE: CMDLINE.strip() + " init_on_alloc=0", boot.REBOOT_FLAG: None},
                           {})
    assert f.message == "kernel parameters not applied: iommu.passthrough=1"
    assert f.details["reboot_required"] is False


def test_unreadable_cmdline_is_a_warning_not_a_pass():
    (f,) = boot.check_tray("t", PARAMS, {}, {boot.CMDLINE: "probe output missing or cut off"})
    assert f.severity is Severity.WARN and "cannot read /proc/cmdline" in f.message
