"""The lab trays' BMCs (sushy-tools with mctl's systems driver): `mctl bmc inventory` over real HTTPS and
Basic auth, a tray powered off and on through its BMC (the host goes away: SSH refused, no process
left; it comes back with a new boot id), and `mctl power` / `mctl rack power` on them.

The job test here needs Slurm: `slurm_lab` (tests/lab_fixture.py), deployed once per session."""

from __future__ import annotations

import json
import stat
import subprocess
import time
from functools import partial

import pytest

from mctl.lab import bmcs, control
from tests import helpers
from tests.helpers import bmc_address, power_restored, power_state, redfish, ssh_ok

wait_for = partial(helpers.wait_for, timeout=120.0)       # every wait here: two minutes


def test_lab_inventory_names_each_bmc_and_a_private_credentials_file(lab):
    import yaml

    doc = yaml.safe_load(lab.inventory.read_text())
    n = len(lab.trays)
    assert doc["racks"][lab.rack]["compute"]["bmc"] == (f"127.{lab.net}.101.[1-{n}]" if n > 1 else f"127.{lab.net}.101.1")
    cred = bmcs.lab_bmc_dir(lab.dir) / "credentials"
    assert doc["bmc"]["credentials_file"] == str(cred) and doc["bmc"]["verify_tls"].endswith("ca.pem")
    assert stat.S_IMODE(cred.stat().st_mode) == 0o600
    assert stat.S_IMODE((bmcs.lab_bmc_dir(lab.dir) / "htpasswd").stat().st_mode) == 0o600


def test_bmc_inventory_reads_every_lab_tray_like_a_gb200_tray(lab, tmp_path):
    """... with collections read by $expand (the capture's root says ExpandQuery) over resumed TLS
    sessions; a firmware version changed in one tray's BMC (mctl.lab.bmcs.set_firmware) is a --diff change."""
    state = ("--state-dir", str(tmp_path))              # snapshots of this test's own
    proc = lab.mctl(*state, "bmc", "inventory", lab.rack, "--json", timeout=120)
    assert proc.returncode == 0, proc.stderr + proc.stdout[-2000:]
    data = json.loads(proc.stdout)
    trays = {t["host"]: t for t in data["trays"]}
    assert sorted(trays) == sorted(lab.trays)
    for n, name in enumerate(sorted(lab.trays)):
        t = trays[name]
        assert t["ok"] and t["bmc"] == bmc_address(lab, name)
        assert (t["vendor"], t["product"], t["tray_chassis"]) == ("NVIDIA", "GB200 NVL", "Chassis_0")
        assert t["tray_index"] == n and t["slot"] == n + 1
        assert t["power_state"] == "On"
        assert t["versions"]["bmc"] == ["GB200Nvl-24.12-8"] and "FW_BMC_0" in t["firmware"]
        assert t["thermal"]["leak_detection"] is True
        assert t["requests"] < 20, (name, t["requests"])      # 85 GETs one by one
        # the lab's BMCs keep a connection between requests (D78): a tray's GETs share one connection,
        # two at most; resumption, where connections are made again, is tests/unit/test_firmware_baseline.py's
        assert t["tls_handshakes"] <= 1 and t["tls_handshakes"] + t["tls_resumed"] <= 2 < t["requests"], t
    assert len({t["serial"] for t in trays.values()}) == len(lab.trays)

    tray = lab.trays[-1]
    code, coll = redfish(lab, tray, "/redfish/v1/UpdateService/FirmwareInventory?$expand=.($levels=1)")
    assert code == 200 and {m["Id"]: m["Version"] for m in coll["Members"]}["FW_BMC_0"] == "GB200Nvl-24.12-8"
    bmcs.set_firmware(lab.dir, tray, "FW_BMC_0", "GB200Nvl-24.12-9")
    try:
        proc = lab.mctl(*state, "bmc", "inventory", lab.rack, "--diff", "--json", timeout=120)
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["changes"][lab.rack] == [
            {"host": tray, "kind": "firmware", "message": "FW_BMC_0 version GB200Nvl-24.12-8 -> GB200Nvl-24.12-9"}]
    finally:
        bmcs.reset_firmware(lab.dir, tray)
    code, doc = redfish(lab, tray, "/redfish/v1/UpdateService/FirmwareInventory/FW_BMC_0")
    assert code == 200 and doc["Version"] == "GB200Nvl-24.12-8"


def test_leak_detectors_and_reset_action_info_as_on_the_capture(lab):
    tray = lab.trays[0]
    base = "/redfish/v1/Chassis/Chassis_0/ThermalSubsystem/LeakDetection/LeakDetectors"
    code, coll = redfish(lab, tray, base)
    assert code == 200 and len(coll["Members"]) == 4
    code, det = redfish(lab, tray, coll["Members"][0]["@odata.id"])
    assert code == 200 and det["DetectorState"] == "OK" and det["Id"].startswith("Chassis_0_LeakDetector_")
    code, info = redfish(lab, tray, "/redfish/v1/Systems/System_0/ResetActionInfo")
    assert code == 200 and "GracefulShutdown" in info["Parameters"][0]["AllowableValues"]
    code, _ = redfish(lab, tray, "/redfish/v1/Systems", password="wrong-password")
    assert code == 401
    code, err = redfish(lab, tray, "/redfish/v1/Systems/System_0/Actions/ComputerSystem.Reset", method="POST",
                        body={"ResetType": "PushPowerButton"})
    assert code == 400 and "ResetType" in json.dumps(err)


def test_power_off_through_the_bmc_stops_the_host_and_on_boots_it_again(lab):
    tray = lab.trays[-1]
    paths = control.LabFiles(lab.dir)
    host = control.layout_of(control.load_record(lab.dir)).host(tray)
    old_boot = lab.run(tray, "cat /proc/sys/kernel/random/boot_id").stdout.strip()
    try:
        code, _ = redfish(lab, tray, "/redfish/v1/Systems/System_0/Actions/ComputerSystem.Reset", method="POST",
                          body={"ResetType": "ForceOff"})
        assert code == 204
        wait_for("PowerState Off", lambda: power_state(lab, tray) == "Off")
        assert not control.host_running(paths, host)
        assert not ssh_ok(lab, tray)
        # The BMC keeps answering with the host off, as a real one on standby power does.
        code, chassis = redfish(lab, tray, "/redfish/v1/Chassis/Chassis_0")
        assert code == 200 and chassis["PowerState"] == "Off"
        code, _ = redfish(lab, tray, "/redfish/v1/Systems/System_0/Actions/ComputerSystem.Reset", method="POST",
                          body={"ResetType": "On"})
        assert code == 204
        wait_for("PowerState On", lambda: power_state(lab, tray) == "On")
        wait_for("SSH back", lambda: ssh_ok(lab, tray))
        assert lab.run(tray, "cat /proc/sys/kernel/random/boot_id").stdout.strip() != old_boot
    finally:
        if not control.host_running(paths, host):
            redfish(lab, tray, "/redfish/v1/Systems/System_0/Actions/ComputerSystem.Reset", method="POST",
                    body={"ResetType": "On"})
            wait_for("SSH back", lambda: ssh_ok(lab, tray))


def test_graceful_shutdown_of_a_frozen_tray_is_not_answered_force_off_is(lab):
    tray = lab.trays[0]
    paths = control.LabFiles(lab.dir)
    host = control.layout_of(control.load_record(lab.dir)).host(tray)
    frozen = lab.mctl("lab", "fault", "host", tray, "--freeze", "--dir", str(lab.dir))
    assert frozen.returncode == 0, frozen.stderr
    try:
        code, _ = redfish(lab, tray, "/redfish/v1/Systems/System_0/Actions/ComputerSystem.Reset", method="POST",
                          body={"ResetType": "GracefulShutdown"})
        assert code == 204
        assert power_state(lab, tray) == "On" and control.host_running(paths, host)
        code, _ = redfish(lab, tray, "/redfish/v1/Systems/System_0/Actions/ComputerSystem.Reset", method="POST",
                          body={"ResetType": "PowerCycle"})
        assert code == 204
        wait_for("SSH back after the power cycle (the freeze ends with the power)", lambda: ssh_ok(lab, tray))
        assert power_state(lab, tray) == "On"
    finally:
        lab.clear_faults(tray)
        if not control.host_running(paths, host):
            redfish(lab, tray, "/redfish/v1/Systems/System_0/Actions/ComputerSystem.Reset", method="POST",
                    body={"ResetType": "On"})
        wait_for("SSH back", lambda: ssh_ok(lab, tray))


def test_every_bmc_is_a_lab_process_lab_down_ends(lab):
    # Every BMC is one of the lab's processes (found by its launcher), so `lab down` ends it.
    found = [p for p in control.lab_processes(lab.dir) if p.comm != "unshare" and "mctl.lab.bmc_emulator" in p.cmdline]
    assert len(found) == len(lab.trays)


# ------------------------------------------------------------------ mctl power / mctl rack power

def _boot_id(lab, tray):
    return lab.run(tray, "cat /proc/sys/kernel/random/boot_id").stdout.strip()


def _power_json(proc):
    try:
        return json.loads(proc.stdout)
    except ValueError:
        raise AssertionError(f"exit {proc.returncode}, not JSON: {proc.stdout[-1500:]!r} {proc.stderr[-1500:]!r}")


def test_power_off_refuses_a_tray_with_a_running_slurm_job_unless_force(lab, slurm_site):
    tray = lab.trays[1]
    out = lab.run(lab.head, f"sbatch --parsable --no-requeue -N1 -w {tray} -o /dev/null --job-name=mctl-power-test "
                            "--wrap 'sleep 600'").stdout.strip()
    job = out.split(";")[0]
    try:
        try:
            wait_for(f"job {job} RUNNING", lambda: lab.run(lab.head, f"squeue -h -j {job} -o %T",
                                                           check=False).stdout.strip() == "RUNNING")
        except AssertionError as exc:
            why = lab.run(lab.head, f"squeue -h -j {job} -o '%T %r'; sinfo -N -h -o '%N %T %E'", check=False).stdout
            raise AssertionError(f"{exc}; Slurm says: {why}") from None
        plan = _power_json(lab.mctl("-i", str(slurm_site), "power", "off", tray, "--dry-run", "--json"))
        (t,) = [t for s in plan["stages"] for t in s["trays"]]
        assert t["error_kind"] == "refused" and f"slurm {job}" in t["error"]
        proc = lab.mctl("-i", str(slurm_site), "power", "off", tray, "--yes", "--json", timeout=300)
        data = _power_json(proc)
        assert proc.returncode == 3
        (t,) = [t for s in data["stages"] for t in s["trays"]]
        assert t["error_kind"] == "refused" and t["sent"] == [] and any(w["id"] == job for w in data["work"])
        assert power_state(lab, tray) == "On" and ssh_ok(lab, tray)
        whole = _power_json(lab.mctl("-i", str(slurm_site), "rack", "power", "off", lab.rack, "--yes", "--json"))
        assert all(t["error_kind"] == "refused" and t["sent"] == [] for s in whole["stages"] for t in s["trays"])
        assert all(power_state(lab, t) == "On" for t in lab.trays)
        forced = lab.mctl("-i", str(slurm_site), "power", "off", tray, "--force", "--yes", "--json", timeout=300)
        (t,) = [t for s in _power_json(forced)["stages"] for t in s["trays"]]
        assert forced.returncode == 0 and t["ok"] and t["sent"][0] == "GracefulShutdown" and t["after"] == "Off"
        assert not ssh_ok(lab, tray)
    finally:
        power_restored(lab)
        _job_gone(lab, job, tray)


def _job_gone(lab, job: str, tray: str) -> None:
    """The test's job over and every tray idle again. A job whose tray lost power can stay RUNNING in
    slurmctld after the tray is back (its new slurmd knows nothing of it); setting the node DOWN is how an
    operator makes Slurm give such a job up, then the node is resumed."""
    def gone() -> bool:
        return not lab.run(lab.head, f"squeue -h -j {job} -o %T 2>/dev/null", check=False).stdout.strip()

    lab.run(lab.head, f"scancel {job}; true", check=False)
    end = time.monotonic() + 30
    while not gone() and time.monotonic() < end:
        time.sleep(1)
    if not gone():
        lab.run(lab.head, f"scontrol update NodeName={tray} State=DOWN Reason='test: power cut under a job'; "
                          f"scancel {job}; true", check=False)
        wait_for(f"job {job} gone after its node was set DOWN", gone)
    lab.run(lab.head, f"scontrol update NodeName={tray} State=RESUME 2>/dev/null; true", check=False)
    lab.settle_slurm()


def _power_events(lab, tray, since):
    """The BMC's own log of its power steps (mctl.lab.bmc_emulator.power_event) since *since*."""
    path = bmcs.tray_bmc_dir(lab.dir, tray) / bmcs.POWER_EVENTS
    lines = path.read_text().splitlines() if path.exists() else []
    return [e for e in map(json.loads, lines) if e["t"] >= since]


def _step_times(lab, trays, since, steps, phase):
    """Per tray, the time of its last power step of *steps* in *phase* (None: it took none)."""
    return {t: max([e["t"] for e in _power_events(lab, t, since) if e["step"] in steps and e["phase"] == phase],
                   default=None) for t in trays}


def test_rack_power_off_then_on_in_order_each_stage_checked_through_redfish_and_ssh(lab, slurm_site, switch_trays):
    """The rack's power off, asked of the site's safety budget first (slurm_site: Slurm deployed keeps it), then
    forced past it; each stage checked through Redfish and SSH, in order; the power on gives the grants back."""
    boots = {t: _boot_id(lab, t) for t in lab.trays}
    try:
        # `mctl bmc inventory` reads the switch trays as the real switch capture: serial, NVSwitch firmware.
        inv = lab.mctl("bmc", "inventory", lab.rack, "--json", timeout=120)
        assert inv.returncode == 0, inv.stderr + inv.stdout[-2000:]
        rows = {t["host"]: t for t in json.loads(inv.stdout)["trays"]}
        assert sorted(rows) == sorted(lab.trays + switch_trays)
        for sw in switch_trays:
            t = rows[sw]
            assert t["ok"] and t["role"] == "switch" and t["bmc"] == bmc_address(lab, sw)
            assert (t["product"], t["tray_chassis"], t["power_state"]) == ("P3809", "SYS_eeprom", "On")
            assert t["serial"] and t["serial"] == t["systems"][0]["serial"]
            assert t["versions"]["bmc"] == ["88.0002.1950"] and "MGX_FW_NVSwitch_0" in t["firmware"]
            assert t["versions"]["nvswitch"]
        assert len({rows[sw]["serial"] for sw in switch_trays}) == len(switch_trays)

        plan = _power_json(lab.mctl("rack", "power", "off", lab.rack, "--dry-run", "--json"))
        assert plan["dry_run"] and all(power_state(lab, t) == "On" for t in lab.trays + switch_trays)

        # The whole rack is more than the site's safety budget lets out of service at once (the lab's: half a
        # rack, slurmctld keeping it once Slurm is deployed): refused whole, nothing sent, the budget not tripped
        refused = lab.mctl("rack", "power", "off", lab.rack, "--yes", "--json", timeout=300)
        data = _power_json(refused)
        assert refused.returncode == 3, refused.stderr
        trays = [t for s in data["stages"] for t in s["trays"]]
        assert all(t["error_kind"] == "refused" and t["sent"] == [] for t in trays), trays
        assert any("held back by the safety budget" in t["error"] for t in trays), trays
        assert all(power_state(lab, t) == "On" for t in lab.trays + switch_trays)
        budget = lab.run(lab.head, "scontrol show reservation -o 2>/dev/null", check=False).stdout
        assert "mctl_budget_" not in budget, budget          # nothing granted kept, no trip

        since = time.time()
        start = time.monotonic()
        # --force: beyond the budget, counted where it fits (its power on gives the grants back)
        off = lab.mctl("rack", "power", "off", lab.rack, "--force", "--yes", "--json", timeout=900)
        off_s = time.monotonic() - start
        data = _power_json(off)
        assert off.returncode == 0, off.stderr
        assert [s["name"] for s in data["stages"]] == ["compute", "switch", "power_shelf"]
        compute = data["stages"][0]
        assert compute["state"] == "done" and sorted(t["host"] for t in compute["trays"]) == sorted(lab.trays)
        for t in compute["trays"]:
            assert t["ok"] and t["before"] == "On" and t["after"] == "Off"
            assert t["os_answered"] is True and t["os_after"] is False
            assert t["sent"][0] == "GracefulShutdown"      # the OS answered: graceful first
        switch = data["stages"][1]
        assert switch["state"] == "done" and sorted(t["host"] for t in switch["trays"]) == switch_trays
        for t in switch["trays"]:                           # NVOS is not asked over SSH: forced off
            assert t["ok"] and (t["before"], t["after"], t["sent"]) == ("On", "Off", ["ForceOff"])
        for tray in lab.trays:                              # checked again here, by other clients
            assert power_state(lab, tray) == "Off" and not ssh_ok(lab, tray)
        for sw in switch_trays:
            assert power_state(lab, sw) == "Off"
        # The order, from the BMCs' own logs: every compute tray was off before a switch tray was asked.
        compute_off = _step_times(lab, lab.trays, since, ("off", "force-off"), "done")
        switch_off = _step_times(lab, switch_trays, since, ("off",), "start")
        assert None not in compute_off.values() and None not in switch_off.values(), (compute_off, switch_off)
        assert max(compute_off.values()) < min(switch_off.values())

        since = time.time()
        start = time.monotonic()
        on = lab.mctl("rack", "power", "on", lab.rack, "--json", timeout=900)
        on_s = time.monotonic() - start
        data = _power_json(on)
        assert on.returncode == 0, on.stderr
        assert [s["name"] for s in data["stages"]] == ["power_shelf", "switch", "compute"]
        for t in data["stages"][1]["trays"]:
            assert t["ok"] and (t["sent"], t["after"]) == (["On"], "On")
        for t in data["stages"][2]["trays"]:
            assert t["ok"] and t["sent"] == ["On"] and t["after"] == "On" and t["os_after"] is True
        for tray in lab.trays:
            assert power_state(lab, tray) == "On" and ssh_ok(lab, tray)
            assert _boot_id(lab, tray) != boots[tray]
        assert all(power_state(lab, sw) == "On" for sw in switch_trays)
        switch_on = _step_times(lab, switch_trays, since, ("on",), "done")
        compute_on = _step_times(lab, lab.trays, since, ("on",), "start")
        assert None not in switch_on.values() and None not in compute_on.values(), (switch_on, compute_on)
        assert max(switch_on.values()) < min(compute_on.values())
        budget = lab.run(lab.head, "scontrol show reservation -o 2>/dev/null", check=False).stdout
        assert "mctl_budget_" not in budget, budget          # the power on gave back the power off's grants
        print(f"\nrack power off {off_s:.1f}s, on {on_s:.1f}s ({len(lab.trays)} trays, {len(switch_trays)} switch trays)")
    finally:
        power_restored(lab)           # the switch trays go with the fixture, whatever their state


def test_lab_fault_bmc_on_a_switch_tray_and_a_hung_compute_tray_bmc(lab, switch_trays):
    """`mctl lab fault bmc`: a switch tray's leak where the real tray has it (MGX_BMC_0), and a hung tray BMC
    that takes connections and answers nothing while its host runs on; both seen by curl, cleared by `clear`."""
    sw, tray = switch_trays[0], lab.trays[0]
    detectors = "/redfish/v1/Chassis/MGX_BMC_0/ThermalSubsystem/LeakDetection/LeakDetectors"
    try:
        cli = lab.mctl("lab", "fault", "bmc", sw, "--leak", "critical", "--detector", "leakage3", "--dir", str(lab.dir))
        assert cli.returncode == 0 and f"{sw} bmc: leak critical leakage3" in cli.stdout, cli.stderr
        assert redfish(lab, sw, f"{detectors}/leakage3")[1]["DetectorState"] == "Critical"
        assert redfish(lab, sw, f"{detectors}/leakage1")[1]["DetectorState"] == "OK"
        assert redfish(lab, sw, "/redfish/v1/Chassis/MGX_BMC_0")[1]["Status"]["HealthRollup"] == "Critical"
        shown = {s["name"]: s["faults"] for s in control.status(lab.dir)["switch_trays"]}
        assert shown[sw] == ["leak critical leakage3"]

        hung = lab.mctl("lab", "fault", "bmc", tray, "--hang", "--dir", str(lab.dir))
        assert hung.returncode == 0 and f"{tray} bmc: bmc never answers" in hung.stdout, hung.stderr
        d = bmcs.lab_bmc_dir(lab.dir)
        user_pw = (d / "credentials").read_text().strip()
        probe = subprocess.run(["curl", "-sS", "--max-time", "3", "--cacert", str(d / "ca.pem"), "-u", user_pw,
                                "-o", "/dev/null", "-w", "%{time_appconnect}",
                                f"https://{bmc_address(lab, tray)}/redfish/v1/Systems/System_0"],
                               capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
        assert probe.returncode == 28, (probe.returncode, probe.stdout, probe.stderr)   # timed out, not refused
        assert float(probe.stdout) > 0                                                   # TLS was taken
        assert ssh_ok(lab, tray)                                                         # the host runs on
    finally:
        clear = lab.mctl("lab", "fault", "clear", sw, "--dir", str(lab.dir))
        assert clear.returncode == 0 and f"{sw} bmc: no faults" in clear.stdout, clear.stderr
        clear = lab.mctl("lab", "fault", "clear", tray, "--target", "bmc", "--dir", str(lab.dir))
        assert clear.returncode == 0 and f"{tray} bmc: no faults" in clear.stdout, clear.stderr
    assert power_state(lab, tray) == "On"
    assert redfish(lab, sw, f"{detectors}/leakage3")[1]["DetectorState"] == "OK"


def test_power_under_a_held_rack_lock_is_refused_and_sends_nothing(lab):
    from mctl.state.lock import rack_lock

    tray = lab.trays[0]
    with rack_lock(lab.state_dir, lab.rack, purpose="test holds the rack"):
        proc = lab.mctl("power", "off", tray, "--yes", "--json", timeout=120)
    assert proc.returncode != 0 and "lock" in (proc.stderr + proc.stdout).lower()
    assert power_state(lab, tray) == "On" and ssh_ok(lab, tray)


def test_power_off_and_cycle_without_a_terminal_and_without_yes_send_no_reset(lab):
    """Issue 27.6: no terminal to ask (the test's stdin) and no --yes: refused before the lock and the BMCs,
    --force or not; the trays' BMCs log no power step."""
    tray = lab.trays[0]
    since = time.time()
    for args in (("power", "off", tray), ("power", "off", tray, "--force", "--json"), ("power", "cycle", tray),
                 ("rack", "power", "off", lab.rack, "--force")):
        proc = lab.mctl(*args)
        assert proc.returncode == 2, (args, proc.stdout[-500:], proc.stderr)
        assert "no terminal to ask" in proc.stderr and "--yes" in proc.stderr and proc.stdout == ""
    assert all(_power_events(lab, t, since) == [] for t in lab.trays)
    assert power_state(lab, tray) == "On" and ssh_ok(lab, tray)


def test_power_status_and_bmcs_refusing_the_credentials_reported_exit_3(lab, tmp_path):
    import shutil

    import yaml

    site = tmp_path / "site"
    site.mkdir()
    doc = yaml.safe_load(lab.inventory.read_text())
    cred = tmp_path / "bad.cred"
    cred.write_text("root:not-the-password\n")
    cred.chmod(0o600)
    doc["bmc"]["credentials_file"] = str(cred)
    (site / "mctl.yml").write_text(yaml.safe_dump(doc))
    proc = lab.mctl("-i", str(site), "power", "status", lab.rack, "--json")
    data = _power_json(proc)
    assert proc.returncode == 3
    assert {t["error_kind"] for s in data["stages"] for t in s["trays"]} == {"auth"}
    good = _power_json(lab.mctl("power", "status", lab.rack, "--json"))
    assert all(t["ok"] and t["before"] == "On" and t["os_answered"] for s in good["stages"] for t in s["trays"])
    shutil.rmtree(site)

