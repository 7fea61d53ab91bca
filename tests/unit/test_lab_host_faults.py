"""Host faults of the lab (pure parts) and the reboot verdict: requests, documents, rendering, boot memory."""

from __future__ import annotations

import json
import math
import subprocess
from datetime import datetime

import pytest

from mctl.errors import UsageError
from mctl.facts.kernel_log import parse_xid_line
from mctl import checks
from mctl.health.boots import BootMemory
from mctl.checks import boot
from mctl.model.tray import Clock, TrayFacts, TrayExpectation
from mctl.facts.kernel_log import observe_xid
from mctl.facts.probe import Section, parse_boot_id
from mctl.model.settings import HealthSettings
from mctl.lab import daemon_faults, faults, host_faults, hostinit, hosts, inject
from mctl.lab.layout import LabLayout
from mctl.model.findings import Severity

B1 = "4c0cbca8-8eec-472c-b9df-98c93098c729"
B2 = "22d80ddf-0d35-4b8a-a2c2-5a4c2f0e9f11"


def test_host_faults_are_in_the_document_only_while_set():
    doc = faults.apply(None, faults.FaultRequest(slow=2.5), now=1.0)
    doc = faults.apply(doc, faults.FaultRequest(slurmd_down=True), now=2.0)
    assert doc["slow"] == 2.5 and doc["slurmd_down"] is True
    assert faults.active(doc) == ["slow 2.5s", "slurmd down"]
    # The GPU emulator and older readers see the document they always saw.
    assert set(faults.empty()) <= set(doc) and set(doc) - set(faults.empty()) == {"slow", "slurmd_down"}
    assert faults.apply(doc, faults.FaultRequest(clear=True), now=3.0) == faults.empty()
    kept = faults.apply(dict(doc, slurmd_down={"restart": False}), faults.FaultRequest(slurmd_down=True), now=2.5)
    assert kept["slurmd_down"] == {"restart": False}            # injected again: what --clear restarts is kept
    # a daemon fault recorded with what --clear must restart still reads as set
    assert faults.active(faults.normalize({"imex_crash": {"restart": True}, "slurmctld_down": False})) == \
        ["imex crashed"]


def test_a_reboot_ends_process_faults_and_xid_effects_but_not_hardware_faults():
    doc = faults.apply(None, faults.FaultRequest(xid=79, gpu=0, nvlink_down="1:2", unreachable=True, hang=True,
                                                 slow=1.0, slurmd_down=True), now=1.0)
    after = faults.without_host_faults(doc)
    assert after == dict(faults.empty(), nvlink_down=[[1, 2]])
    # events change the host, not the document
    assert faults.apply(doc, faults.FaultRequest(reboot=True, down_for=0), now=2.0) == doc
    assert faults.FaultRequest(reboot=True).events() == ["reboot"]
    assert faults.FaultRequest(sshd_restart=True).events() == ["sshd-restart"]


@pytest.mark.parametrize("req, words", [
    (faults.FaultRequest(slow=0), "--slow 0"),
    (faults.FaultRequest(slow=-1), "not a delay"),
    (faults.FaultRequest(slow=math.nan), "not a delay"),
    (faults.FaultRequest(slow=faults.SLOW_MAX_S + 1), "at most"),
    (faults.FaultRequest(down_for=3), "only goes with --reboot"),
    (faults.FaultRequest(reboot=True, down_for=-1), "not a time"),
    (faults.FaultRequest(reboot=True, down_for=faults.REBOOT_DOWN_MAX_S + 1), "not a time"),
    (faults.FaultRequest(reboot=True, hang=True), "--reboot is an event and goes alone"),
    (faults.FaultRequest(reboot=True, sshd_restart=True), "goes alone"),
    (faults.FaultRequest(sshd_restart=True, xid=79, gpu=0), "--sshd-restart is an event"),
    (faults.FaultRequest(clear=True, slow=1), "cannot be combined"),
    (faults.FaultRequest(clear=True, reboot=True), "cannot be combined"),
])
def test_host_fault_requests_are_validated(req, words):
    with pytest.raises(UsageError) as exc:
        faults.validate(req)
    assert words in exc.value.message + (exc.value.hint or "")


def test_valid_host_fault_requests():
    for req in (faults.FaultRequest(slow=0.5), faults.FaultRequest(reboot=True), faults.FaultRequest(sshd_restart=True),
                faults.FaultRequest(reboot=True, down_for=0), faults.FaultRequest(imex_crash=True, slow=3),
                faults.FaultRequest(slurmctld_down=True)):
        faults.validate(req)
    assert "--slow SECONDS" in _no_fault_hint()


def _no_fault_hint() -> str:
    with pytest.raises(UsageError) as exc:
        faults.validate(faults.FaultRequest())
    return exc.value.hint


def test_which_host_takes_which_daemon_fault():
    lay = LabLayout("lab", 1, 2)
    tray, head = lay.host("lab-r1-tray01"), lay.host("lab-r1-head")
    daemon_faults.check_kind(head, faults.FaultRequest(slurmctld_down=True), [], [])
    daemon_faults.check_kind(tray, faults.FaultRequest(slurmd_down=True, imex_crash=True), [], [])
    with pytest.raises(UsageError, match="head node"):
        daemon_faults.check_kind(tray, faults.FaultRequest(slurmctld_down=True), [], ["lab-r1-head"])
    with pytest.raises(UsageError, match="compute tray"):
        daemon_faults.check_kind(head, faults.FaultRequest(imex_crash=True), ["lab-r1-tray01"], [])


def test_sshrc_renders_hang_slow_or_nothing(processes):
    hang = host_faults.sshrc_text({"hang": True, "slow": 2.0})
    assert hang.startswith(host_faults.SSHRC_MARK) and f"exec {hosts.HANG_IN_HOST}" in hang   # hang wins
    slow = host_faults.sshrc_text({"hang": False, "slow": 1.5})
    assert slow.startswith(host_faults.SSHRC_MARK) and "sleep 1.5\n" in slow
    assert host_faults.sshrc_text({"hang": False}) is None
    # sshd runs it with /bin/sh: both parse
    for text in (hang, slow):
        assert subprocess.run(["/bin/sh", "-n", "-c", text]).returncode == 0


def test_actions_say_what_each_fault_does():
    lay = LabLayout("lab", 1, 2)
    tray = lay.host("lab-r1-tray01")
    empty = faults.empty()
    reboot = inject.fault_actions(tray, empty, empty, faults.FaultRequest(reboot=True, down_for=7))
    assert len(reboot) == 1 and "off for 7s" in reboot[0] and "new boot id" in reboot[0]
    restart = inject.fault_actions(tray, empty, empty, faults.FaultRequest(sshd_restart=True))
    assert len(restart) == 1 and "reset every open SSH connection" in restart[0]
    req = faults.FaultRequest(slurmd_down=True, slow=2)
    new = faults.apply(empty, req, now=0)
    acts = inject.fault_actions(tray, empty, new, req)
    assert any("starts 2s late" in a for a in acts) and any("keep slurmd.service from starting" in a for a in acts)
    cleared = inject.fault_actions(tray, dict(new, slurmd_down={"restart": False}), empty,
                                   faults.FaultRequest(clear=True))
    assert any("(it was not running)" in a for a in cleared)
    freeze = inject.fault_actions(tray, empty, faults.apply(empty, faults.FaultRequest(unreachable=True), 0),
                                  faults.FaultRequest(unreachable=True))
    assert any("every process of the host" in a for a in freeze)


def test_boot_units_one_shot(tmp_path, monkeypatch, processes):
    path = tmp_path / "boot-units.json"
    monkeypatch.setattr(hostinit, "BOOT_UNITS", str(path))
    assert hostinit.boot_units() is None                        # first boot after `lab up`: nothing
    path.write_text(json.dumps({"units": ["munge.service", "slurmd.service"], "gpus": 4}))
    svc = hostinit.boot_units()
    assert svc.restart is False and svc.argv[:2] == ["/bin/sh", "-c"]
    assert svc.argv[3:] == ["boot-units", "4", "munge.service", "slurmd.service"]
    path.write_text("not json")
    assert hostinit.boot_units() is None
    # With no GPUs and units that are not enabled here, the script does nothing and succeeds.
    res = subprocess.run(["/bin/sh", "-c", hostinit.BOOT_UNITS_SCRIPT, "boot-units", "0", "no-such-unit.service"],
                         capture_output=True, text=True, timeout=30)
    assert res.returncode == 0 and res.stdout == ""


def test_time_namespace_offsets_start_a_rebooted_host_near_zero():
    import os

    if not os.path.exists("/proc/self/ns/time"):
        assert hosts._time_namespace(True) == []
        return
    assert hosts._time_namespace(False) == ["--time"]
    opts = hosts._time_namespace(True)
    boot = float(open("/proc/uptime").read().split()[0])
    assert opts[:2] == ["--time", "--boottime"] and opts[3] == "--monotonic"
    assert -boot <= int(opts[2]) <= 0 and boot + int(opts[2]) >= 0


# --- the reboot verdict -------------------------------------------------------------------------------

CLOCK = Clock(epoch=1_764_441_600.0, local=datetime(2025, 11, 29, 18, 40, 0), uptime=600.0)
LINE = "Nov 29 18:25:00 t01 kernel: [  400.000000] NVRM: Xid (PCI:0000:29:00): 48, pid='<unknown>', name=<unknown>, x."


def facts(boot_id, xids=()):
    return TrayFacts("t01", clock=CLOCK, boot_id=boot_id, xid_source="/var/log/kern.log",
                           xids=tuple(observe_xid(parse_xid_line(l), CLOCK) for l in xids))


def test_boot_id_section():
    problems: list[str] = []
    assert parse_boot_id(Section("boot-id", B1.upper() + "\n", 0), problems) == B1 and problems == []
    assert parse_boot_id(None, problems) is None and problems == []
    assert parse_boot_id(Section("boot-id", "", 1), problems) is None and problems == []
    assert parse_boot_id(Section("boot-id", "garbage\n", 0), problems) is None
    assert problems == ["boot id unreadable: 'garbage'"]


def test_a_reboot_is_seen_and_the_earlier_boots_xids_stop_counting():
    memory = BootMemory()
    settings = HealthSettings()
    expect = TrayExpectation("t01")
    first = memory.see(facts(B1, [LINE]))
    assert first.previous_boot_id is None and boot.check(first, expect, settings) == []
    # XID 48 from 15 min ago in this boot: current.
    assert [f.severity for f in checks.xid.check(first, expect, settings)] == [Severity.CRITICAL]
    same = memory.see(facts(B1, [LINE]))
    assert [f.severity for f in boot.check(same, expect, settings)] == [Severity.OK]
    # The tray rebooted between two sweeps and its new uptime already passed the line's: the line's
    # stamps look like this boot, but the last sweep read it under the earlier boot.
    rebooted = memory.see(facts(B2, [LINE]))
    found = boot.check(rebooted, expect, settings)
    assert [f.severity for f in found] == [Severity.WARN] and "rebooted since the last sweep" in found[0].message
    assert found[0].details["short"] == "rebooted"
    assert [f.severity for f in checks.xid.check(rebooted, expect, settings)] == [Severity.OK]
    later = memory.see(facts(B2, [LINE]))
    assert [f.severity for f in checks.xid.check(later, expect, settings)] == [Severity.OK]
    assert [f.severity for f in boot.check(later, expect, settings)] == [Severity.OK]
    # Rotated out of the log: forgotten.
    memory.see(facts(B2, []))
    assert memory._older["t01"] == frozenset()
    # An unreached tray or a probe without the boot id changes nothing.
    assert memory.see(TrayFacts("t01", reach="timeout")).previous_boot_id is None
    assert memory.boot_ids["t01"] == B2


def test_boot_ids_persist_for_the_next_check(tmp_path):
    memory = BootMemory()
    memory.see(facts(B1))
    memory.save(tmp_path)
    again = BootMemory.load(tmp_path)
    assert again.see(facts(B2)).rebooted
    again.save(tmp_path)
    assert json.loads((tmp_path / "health" / "boots.json").read_text())["boot_ids"] == {"t01": B2}
    before = (tmp_path / "health" / "boots.json").stat().st_mtime_ns
    BootMemory.load(tmp_path).save(tmp_path)                       # nothing changed: not written again
    assert (tmp_path / "health" / "boots.json").stat().st_mtime_ns == before
    (tmp_path / "health" / "boots.json").write_text("{broken")
    assert BootMemory.load(tmp_path).boot_ids == {}
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    BootMemory(boot_ids={"t01": B1}).save(blocker)      # not writable there: no error, only no notice next time


def test_boot_check_is_in_the_catalogue_and_in_the_facts_dict():
    assert "boot" in checks.CHECK_NAMES
    d = facts(B1).to_dict()
    assert d["boot_id"] == B1 and d["previous_boot_id"] is None
