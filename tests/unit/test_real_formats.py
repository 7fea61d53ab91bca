"""Every real capture in tests/fixtures/real/ through mctl's parsers and checks (issue 16).

Expectations are written from reading each sample (see tests/fixtures/real/README.md for where
each one comes from): GPU counts, driver versions, values of the fields the checks judge.
"""

from __future__ import annotations

import hashlib
from datetime import datetime

import pytest

from mctl.facts import FactsParseError
from mctl.facts.probe import Section, smi_section
from mctl.facts.kernel_log import (STAMP_CTIME, STAMP_ISO, STAMP_SYSLOG, parse_xid_events, parse_xid_line,
                                   stamp_age)
from mctl.facts.nvidia_smi import parse_nvlink_status, parse_query_csv, parse_xml
from mctl.checks.inventory import validate_rack
from mctl import checks
from mctl.checks import ecc, gpu_count, nvlink, thermal, xid
from mctl.model.tray import Clock, TrayExpectation, TrayFacts
from mctl.facts.kernel_log import observe_xid
from mctl.model.settings import HealthSettings, parse_subcodes
from mctl.model.findings import Severity
from mctl.model.tray import TrayFacts
from mctl.model.xid import DEFAULT_DRAIN_XIDS, judge, nvlink5_detail, recovery_change
from tests.helpers import REAL_BURNIN_SAMPLES, REAL_SAMPLES, REAL_SCHED_SAMPLES, real_text

S = HealthSettings()


# --- the set itself -------------------------------------------------------------------------------

def test_every_sample_has_provenance_and_a_test():
    readme = (REAL_SAMPLES / "README.md").read_text(encoding="utf-8")
    samples = sorted(p.name for p in REAL_SAMPLES.iterdir() if p.is_file() and p.name != "README.md")
    assert len(samples) >= 20
    for name in samples:
        assert f"`{name}`" in readme, f"{name} has no provenance row in tests/fixtures/real/README.md"

    tested = set(XML) | set(NVLINK) | set(NVLINK_ERRORS) | set(KERNEL_LOGS) | set(CSV) | set(REAL_SCHED_SAMPLES) \
        | set(REAL_BURNIN_SAMPLES)
    assert sorted(tested) == samples


def test_samples_are_byte_exact_as_recorded():
    """The git blob ids in the README are those of the files as published (read back with git hash-object)."""
    readme = (REAL_SAMPLES / "README.md").read_text(encoding="utf-8")
    for name in [*XML, *REAL_SCHED_SAMPLES, *REAL_BURNIN_SAMPLES, *NVLINK_ERRORS]:
        if not name.startswith(("telegraf-", "netdata-", "jpsnips-", "slurm-on-aws-", "crusoe-", "minyang-chen-",
                                "glimmer-", "virtualclient-", "ml-engineering-")):
            continue
        data = (REAL_SAMPLES / name).read_bytes()
        blob = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
        assert blob in readme, f"{name}: blob {blob} not recorded"


# --- nvidia-smi -q -x -----------------------------------------------------------------------------

# name -> (driver, attached_gpus, <gpu> blocks, bus id, product, temperature C, power draw W, power limit W)
XML = {
    "telegraf-a100-sxm4-v12.xml": ("535.54.03", 4, 1, "00000000:01:00.0", "NVIDIA A100-SXM4-80GB", 27, 67.03, 500.0),
    "telegraf-a10g.xml": ("515.105.01", 1, 1, "00000000:00:1E.0", "NVIDIA A10G", 17, 25.58, 300.0),
    "telegraf-quadro-p2000-v12.xml": ("525.125.06", 1, 1, "00000000:17:00.0", "Quadro P2000", 34, 4.61, 75.0),
    "telegraf-rtx-3060-v12.xml": ("570.124.04", 1, 1, "00000000:2D:00.0", "NVIDIA GeForce RTX 3060", 42, 11.6, 170.0),
    "telegraf-rtx-3080-v13.xml": ("595.58.03", 1, 1, "00000000:0C:00.0", "NVIDIA GeForce RTX 3080", 27, 139.62,
                                  320.0),
    "telegraf-rtx-3090-v12.xml": ("525.147.05", 1, 1, "00000000:00:10.0", "NVIDIA GeForce RTX 3090", 37, 27.23,
                                  200.0),
    "telegraf-rtx-4000-sff-ada-v13.xml": ("595.84", 1, 1, "00000000:06:00.0", "NVIDIA RTX 4000 SFF Ada Generation",
                                          38, 8.81, 70.0),
    "telegraf-tesla-t4.xml": ("515.105.01", 1, 1, "00000000:00:1E.0", "Tesla T4", 40, 26.78, 70.0),
    "netdata-a100-sxm4-mig.xml": ("510.47.03", 1, 1, "00000000:00:04.0", "NVIDIA A100-SXM4-40GB", 36, 66.92, 400.0),
    "netdata-rtx-2080-win.xml": ("516.59", 1, 1, "00000000:0A:00.0", "NVIDIA GeForce RTX 2080", 29, 14.5, 275.0),
    "netdata-rtx-3060.xml": ("515.65.01", 1, 1, "00000000:01:00.0", "NVIDIA GeForce RTX 3060 Laptop GPU", 45, 8.7,
                             None),
    "netdata-rtx-4090-driver-535.xml": ("535.86.05", 1, 1, "00000000:84:00.0", "NVIDIA GeForce RTX 4090", 40, 26.84,
                                        450.0),
    "netdata-tesla-p100.xml": ("510.47.03", 1, 1, "00000000:00:04.0", "Tesla P100-PCIE-16GB", 38, 26.16, 250.0),
}


@pytest.mark.parametrize("name", sorted(XML))
def test_real_xml(name):
    driver, attached, blocks, bus, product, temp, draw, limit = XML[name]
    report = parse_xml(real_text(name))
    assert report.driver_version == driver
    assert report.attached_gpus == attached
    assert len(report.gpus) == blocks
    gpu = report.gpus[0]
    assert (gpu.pci_bus_id, gpu.product_name, gpu.temperature_c) == (bus, product, temp)
    assert gpu.uuid.startswith("GPU-")
    assert (gpu.power_draw_w, gpu.power_limit_w) == (draw, limit)


def test_r535_power_draw_is_read_and_the_power_check_runs():
    """R535 puts the draw in <gpu_power_readings><power_draw> (no average/instant): it used to be None."""
    for name in ("telegraf-a100-sxm4-v12.xml", "netdata-rtx-4090-driver-535.xml"):
        report = parse_xml(real_text(name))
        assert "<gpu_power_readings>" in real_text(name) and "<average_power_draw>" not in real_text(name)
        assert report.gpus[0].power_draw_w is not None
    report = parse_xml(real_text("netdata-rtx-4090-driver-535.xml"))
    tray = TrayFacts(host="t01", gpus=report)
    power = [f for f in thermal.check(tray, None, S) if f.check == thermal.POWER]
    assert power[0].severity is Severity.OK
    over = report.gpus[0].__class__(**{**report.gpus[0].__dict__, "power_draw_w": 500.0})
    hot = TrayFacts(host="t01", gpus=report.__class__(**{**report.__dict__, "gpus": (over,)}))
    power = [f for f in thermal.check(hot, None, S) if f.check == thermal.POWER]
    assert power[0].severity is Severity.WARN and "gpu0 draws 500 W over its 450 W limit" in power[0].message


def test_r580_memory_repair_fields_read_and_judged():
    # R595 captures (the R580 schema, nvsmi_device_v13.dtd) say No for both repairs and N/A for the rest
    for name in ("telegraf-rtx-3080-v13.xml", "telegraf-rtx-4000-sff-ada-v13.xml"):
        repair = parse_xml(real_text(name)).gpus[0].repair
        assert (repair.channel_repair_pending, repair.tpc_repair_pending) == (False, False)
        assert (repair.unrepairable_memory, repair.sram_threshold_exceeded) == (None, None)
    # the same document with the driver saying Yes (edited here, in memory; the file stays as published)
    doc = real_text("telegraf-rtx-3080-v13.xml")
    doc = doc.replace("<channel_repair_pending>No<", "<channel_repair_pending>Yes<")
    doc = doc.replace("<unrepairable_memory>N/A<", "<unrepairable_memory>Yes<")
    doc = doc.replace("<sram_threshold_exceeded>N/A<", "<sram_threshold_exceeded>Yes<")
    report = parse_xml(doc)
    repair = report.gpus[0].repair
    assert (repair.channel_repair_pending, repair.unrepairable_memory, repair.sram_threshold_exceeded) == (True,) * 3
    found = [f for f in ecc.check(TrayFacts(host="t01", gpus=report), None, S) if f.check == ecc.REPAIR]
    assert {(f.severity, f.message.split(" on ")[0].split(" (")[0]) for f in found} == {
        (Severity.CRITICAL, "memory the GPU could not repair"),
        (Severity.CRITICAL, "SRAM error threshold exceeded"),
        (Severity.WARN, "memory repair pending"),
    }


def test_fewer_gpu_blocks_than_attached_gpus_is_a_finding():
    """The published A100 sample lists one <gpu> for attached_gpus 4."""
    report = parse_xml(real_text("telegraf-a100-sxm4-v12.xml"))
    tray = TrayFacts(host="t01", gpus=report)
    found = gpu_count.check(tray, TrayExpectation(host="t01", rack="r", gpus_per_tray=1), S)
    assert found[0].severity is Severity.CRITICAL and "driver counts 4" in found[0].message
    facts = TrayFacts(host="t01", address="127.0.0.1", reach="ok", gpus=report)
    found = [f for f in validate_rack(_rack(1), [facts]) if f.check == "gpu.count"]
    assert found and found[0].severity is Severity.CRITICAL and "driver counts 4" in found[0].message


def _rack(gpus_per_tray: int):
    """The two Rack attributes validate_rack reads for one tray."""

    class R:
        name = "rack-a"
        nvlink_domain = None

    r = R()
    r.gpus_per_tray = gpus_per_tray
    return r


# --- nvlink --status ------------------------------------------------------------------------------

# name -> [(gpu index, link lines, inactive links, all links down)]
NVLINK = {
    "gpud-nvlink-status-a100.txt": [(i, 12, (), False) for i in range(8)],
    "issue-gpud-1085-nvlink-all-inactive-b200.txt": [(2, 0, (), True)],
    "issue-azhpc-diagnostics-73-nvlink-v100-inactive.txt": [(3, 6, (3, 5), False)],
}


@pytest.mark.parametrize("name", sorted(NVLINK))
def test_real_nvlink_status(name):
    got = parse_nvlink_status(real_text(name))
    assert [(g.index, len(g.links), g.inactive_links, g.all_inactive) for g in got] == NVLINK[name]


# name -> [(GPU index, UUID, links, counter names)]
NVLINK_ERRORS = {
    "ml-engineering-nvlink-e-h100.txt": [(0, "GPU-abcdefab-cdef-abdc-abcd-abababababab", 2,
                                          ("Replay Errors", "Recovery Errors", "CRC Errors"))],
}


@pytest.mark.parametrize("name", sorted(NVLINK_ERRORS))
def test_real_nvlink_errors(name):
    from mctl.facts.nvidia_smi import parse_nvlink_errors

    got = parse_nvlink_errors(real_text(name))
    assert [(g.index, g.uuid, len(g.links), tuple(g.links[0])) for g in got] == NVLINK_ERRORS[name]
    assert {v for g in got for c in g.links.values() for v in c.values()} == {0}


def test_real_clock_event_reasons_by_branch():
    """R510-R525 print <clocks_throttle_reasons>, R535 and later <clocks_event_reasons>; same reasons."""
    seen = {}
    for name in XML:
        gpu = parse_xml(real_text(name)).gpus[0]
        seen[name] = gpu.clock_events.element
        assert len(gpu.clock_events.reported) == 9, name
    assert seen["netdata-tesla-p100.xml"] == "clocks_throttle_reasons"          # 510.47.03
    assert seen["telegraf-quadro-p2000-v12.xml"] == "clocks_throttle_reasons"   # 525.125.06
    assert seen["telegraf-a100-sxm4-v12.xml"] == "clocks_event_reasons"         # 535.54.03
    assert seen["telegraf-rtx-3080-v13.xml"] == "clocks_event_reasons"          # 595.58.03
    for name, element in seen.items():
        major = int(XML[name][0].split(".")[0])
        assert element == ("clocks_event_reasons" if major >= 535 else "clocks_throttle_reasons"), name
    assert parse_xml(real_text("netdata-tesla-p100.xml")).gpus[0].clock_events.active == ("gpu_idle",)


def test_a100_links_are_25_gbps():
    assert {l.speed_gbps for g in parse_nvlink_status(real_text("gpud-nvlink-status-a100.txt")) for l in g.links} == {25.0}


def test_all_links_down_is_critical_with_the_gpu_named():
    links = parse_nvlink_status(real_text("issue-gpud-1085-nvlink-all-inactive-b200.txt"))
    report = parse_xml((REAL_SAMPLES.parent / "gb200-nvidia-smi-q-x.xml").read_text())
    found = nvlink.check(TrayFacts(host="t01", gpus=report, nvlinks=links), None, S)
    assert found[0].severity is Severity.CRITICAL
    assert "gpu2 all 18 links down" in found[0].message
    assert found[0].details["short"] == "nvlink gpu2 all links down"
    assert found[0].details["all_inactive"] == ["gpu2"]


def test_all_inactive_sentence_on_stderr_names_the_gpus_without_links():
    from mctl.facts.nvidia_smi import with_stderr

    sample = real_text("issue-gpud-1085-nvlink-all-inactive-b200.txt").splitlines()
    stdout = "\n".join(real_text("gpud-nvlink-status-a100.txt").splitlines()[:13] + [sample[0]]) + "\n"
    gpus = parse_nvlink_status(stdout)
    assert [(g.index, len(g.links), g.all_inactive) for g in gpus] == [(0, 12, False), (2, 0, False)]
    gpus = with_stderr(gpus, sample[1] + "\n")
    assert [(g.index, len(g.links), g.all_inactive) for g in gpus] == [(0, 12, False), (2, 0, True)]
    assert with_stderr(gpus[:1], "some other error\n") == gpus[:1]


def test_unreadable_nvlink_output_is_never_healthy():
    with pytest.raises(FactsParseError, match="binary"):
        parse_nvlink_status("GPU 0: NVIDIA GB200\x00\x01")
    with pytest.raises(FactsParseError, match="unexpected text"):
        parse_nvlink_status("NVML: Unable to retrieve NVLink information as all links are inActive\n")


# --- kernel logs ----------------------------------------------------------------------------------

# name -> [(pci, code, form, stamp kind)]
KERNEL_LOGS = {
    "gpud-dmesg-T-xid-119.log": [("0000:9b:00", 119, "xid", STAMP_CTIME)] * 5,
    "issue-akash-support-209-dmesg-T-xid79.txt": [("0000:a1:00", 79, "xid", STAMP_CTIME)],
    "issue-nvsentinel-155-dmesg-fell-off-bus-no-xid.txt": [("0000:b3:00.0", 79, "fell-off-bus", None)],
    "issue-open-gpu-kernel-modules-1150-xid45-after-149-145.txt": [
        (p, 45, "xid", None) for p in ("0000:dc:00", "0000:ed:00", "0000:ba:00", "0000:97:00", "0000:dc:00",
                                       "0000:ba:00", "0000:ed:00")],
    "issue-gpud-pr1160-nvlink5-kmsg-lines.txt": [("0000:01:00", 144, "xid", None), ("0000:00:00", 149, "xid", None),
                                                 ("0000:00:00", 149, "xid", None)],
    "issue-gpud-pr1174-nvlink5-kmsg-lines.txt": [("0019:01:00", 149, "xid", None), ("0000:00:00", 149, "xid", None),
                                                 ("0018:01:00", 145, "xid", None)],
    "issue-gpud-pr870-dmesg-decode-iso.txt": [("0000:04:00", 79, "xid", STAMP_ISO)],
}


@pytest.mark.parametrize("name", sorted(KERNEL_LOGS))
def test_real_kernel_logs(name):
    events = parse_xid_events(real_text(name))
    assert [(e.pci, e.code, e.form, e.stamp_kind) for e in events] == KERNEL_LOGS[name]


def test_dmesg_T_xid_119_stamps_and_ages():
    events = parse_xid_events(real_text("gpud-dmesg-T-xid-119.log"))
    assert [e.timestamp for e in events] == ["Sun Feb 23 16:24:18 2025", "Sun Feb 23 16:24:24 2025",
                                             "Sun Feb 23 16:24:30 2025", "Sun Feb 23 16:27:12 2025",
                                             "Sun Feb 23 16:30:13 2025"]
    assert events[0].pid == 2024380 and events[0].process_name == "nvidia-smi"
    clock = Clock(epoch=0.0, local=datetime(2025, 2, 23, 16, 34, 18), uptime=86_400.0)
    assert observe_xid(events[0], clock).age_s == 600.0
    assert observe_xid(events[-1], clock).age_s == 245.0


def test_dmesg_iso_with_decode_columns_gives_an_age():
    event = parse_xid_events(real_text("issue-gpud-pr870-dmesg-decode-iso.txt"))[0]
    assert event.timestamp == "2025-05-27T04:18:56,089671+00:00"
    epoch = datetime.fromisoformat("2025-05-27T04:28:56.089671+00:00").timestamp()
    obs = observe_xid(event, Clock(epoch=epoch, local=datetime(2025, 5, 27, 4, 28, 56), uptime=10_000.0))
    assert round(obs.age_s, 3) == 600.0 and obs.this_boot is True


def test_raw_uptime_stamp_ages_against_the_trays_uptime():
    event = parse_xid_events(real_text("issue-nvsentinel-155-dmesg-fell-off-bus-no-xid.txt"))[0]
    assert event.uptime == 1843.308145
    obs = observe_xid(event, Clock(epoch=1e9, local=datetime(2025, 1, 1), uptime=2443.308145))
    assert round(obs.age_s, 3) == 600.0 and obs.this_boot is True
    earlier_boot = observe_xid(event, Clock(epoch=1e9, local=datetime(2025, 1, 1), uptime=100.0))
    assert earlier_boot.this_boot is False


@pytest.mark.parametrize("line, kind, stamp", [
    ("Nov 29 18:30:00 t01 kernel: NVRM: Xid (PCI:0000:29:00): 79, GPU has fallen off the bus.", STAMP_SYSLOG,
     "Nov 29 18:30:00"),
    ("Nov 29 18:30:00.123456 t01 kernel: NVRM: Xid (PCI:0000:29:00): 79, GPU has fallen off the bus.", STAMP_SYSLOG,
     "Nov 29 18:30:00.123456"),
    ("2025-11-29T18:30:00.123456+00:00 t01 kernel: NVRM: Xid (PCI:0000:29:00): 79, x", STAMP_ISO,
     "2025-11-29T18:30:00.123456+00:00"),
    ("2025-11-29T18:30:00+0000 t01 kernel: NVRM: Xid (PCI:0000:29:00): 79, x", STAMP_ISO, "2025-11-29T18:30:00+0000"),
    ("2025-11-29T18:30:00,123456+00:00 NVRM: Xid (PCI:0000:29:00): 79, x", STAMP_ISO,
     "2025-11-29T18:30:00,123456+00:00"),
    ("kern  :warn  : 2025-11-29T18:30:00,123456+00:00 NVRM: Xid (PCI:0000:29:00): 79, x", STAMP_ISO,
     "2025-11-29T18:30:00,123456+00:00"),
    ("[Sat Nov 29 18:30:00 2025] NVRM: Xid (PCI:0000:29:00): 79, x", STAMP_CTIME, "Sat Nov 29 18:30:00 2025"),
])
def test_every_wall_clock_form_gives_an_age(line, kind, stamp):
    event = parse_xid_line(line)
    assert (event.stamp_kind, event.timestamp) == (kind, stamp)
    clock = Clock(epoch=datetime.fromisoformat("2025-11-29T18:40:00+00:00").timestamp(),
                  local=datetime(2025, 11, 29, 18, 40, 0), uptime=86_400.0)
    age = observe_xid(event, clock).age_s
    assert age is not None and 599.0 <= age <= 600.0


def test_kmsg_and_uptime_prefixes():
    event = parse_xid_line("6,3964,206764307,-;NVRM: Xid (PCI:0000:29:00): 79, GPU has fallen off the bus.")
    assert event.uptime == 206.764307 and event.timestamp is None
    event = parse_xid_line("[  130.456250] [ T1946] NVRM: Xid (PCI:0000:29:00): 79, GPU has fallen off the bus.")
    assert event.uptime == 130.45625


def test_stamp_age_refuses_garbage():
    now = datetime(2025, 11, 29)
    assert stamp_age("Foo 99 99:99:99", STAMP_SYSLOG, now, 0.0) is None
    assert stamp_age("2025-13-99T00:00:00", STAMP_ISO, now, 0.0) is None
    assert stamp_age("Sat Nov 99 18:30:00 2025", STAMP_CTIME, now, 0.0) is None


def test_fell_off_bus_forms():
    # Xid 79 and the driver's own line about the same GPU: one event, the Xid
    events = parse_xid_events(real_text("issue-akash-support-209-dmesg-T-xid79.txt"))
    assert [(e.code, e.form) for e in events] == [(79, "xid")]
    # no Xid at all: the driver's multi-line message is XID 79 for that GPU
    events = parse_xid_events(real_text("issue-nvsentinel-155-dmesg-fell-off-bus-no-xid.txt"))
    assert [(e.code, e.pci, e.form) for e in events] == [(79, "0000:b3:00.0", "fell-off-bus")]
    # as the probe's grep hands it over (the middle line does not match the grep)
    grepped = "\n".join(l for l in real_text("issue-nvsentinel-155-dmesg-fell-off-bus-no-xid.txt").splitlines()
                        if "NVRM: Xid" in l or "fallen off the bus" in l or "NVRM: The NVIDIA GPU" in l)
    assert [(e.code, e.form) for e in parse_xid_events(grepped)] == [(79, "fell-off-bus")]
    # the one-line forms, repeated: one event
    one = ("NVRM: The NVIDIA GPU 0000:05:00.0 (PCI ID: 10de:2684) installed in this system has fallen off the bus "
           "and is not responding to commands.")
    assert len(parse_xid_events("\n".join([one] * 5))) == 1
    assert parse_xid_line("NVRM: GPU 0000:01:00.0: GPU has fallen off the bus.").code == 79
    # a GPU that is merely unsupported is no event
    assert parse_xid_events("NVRM: The NVIDIA GPU 0000:05:00.0 (PCI ID: 10de:1b06)\nNVRM: installed in this system "
                            "is not supported by the NVIDIA 580.65 driver release.") == []


def test_fell_off_bus_without_xid_drains_like_xid_79():
    event = parse_xid_events(real_text("issue-nvsentinel-155-dmesg-fell-off-bus-no-xid.txt"))[0]
    clock = Clock(epoch=1e9, local=datetime(2025, 1, 1), uptime=1900.0)
    facts = TrayFacts(host="t01", xids=(observe_xid(event, clock),), xid_source="dmesg", clock=clock)
    found = xid.check(facts, None, S)
    assert found[0].severity is Severity.CRITICAL and found[0].details["drains"] is True
    assert found[0].details["code"] == 79 and "no Xid line" in found[0].message
    assert found[0].details["short"] == "0000:b3:00.0 fell off bus (no xid)"


# --- NVLink5 verdicts and XID 154 -----------------------------------------------------------------

def _xid_findings(lines, settings=S):
    clock = Clock(epoch=1e9, local=datetime(2025, 1, 1), uptime=1e6)
    events = [observe_xid(e, clock) for e in parse_xid_events("\n".join(lines))]
    return xid.check(TrayFacts(host="t01", xids=tuple(events), xid_source="dmesg", clock=clock), None, settings)


def test_real_nvlink5_lines_judged_by_their_word_and_subcode():
    lines = real_text("issue-gpud-pr1174-nvlink5-kmsg-lines.txt").splitlines()
    lines += real_text("issue-gpud-pr1160-nvlink5-kmsg-lines.txt").splitlines()
    verdicts = [(e.code, e.nvlink5.unit, e.nvlink5.fatal, e.nvlink5.subcode,
                 judge(e.code, e.message, DEFAULT_DRAIN_XIDS).drains) for e in parse_xid_events("\n".join(lines))]
    assert verdicts == [
        (149, "NETIR", True, 0, True),
        (149, "NETIR_LINK_EVT", True, 37, True),          # INVESTIGATE_PEER_DEVICE: reset GPU
        (145, "RLW_RXPIPE", False, 0, False),             # Nonfatal: ignore
        (144, "SAW_MVB", False, 0, False),
        (149, "NETIR_LINK_EVT", True, 38, False),         # catalogue: Fatal but ignore
        (149, "NETIR_LINK_EVT", True, 37, True),
    ]


def test_nonfatal_nvlink5_does_not_drain_and_fatal_does():
    nonfatal = real_text("issue-gpud-pr1174-nvlink5-kmsg-lines.txt").splitlines()[2]
    fatal = real_text("issue-gpud-pr1174-nvlink5-kmsg-lines.txt").splitlines()[1]
    found = _xid_findings([nonfatal])
    assert found[0].severity is Severity.WARN and found[0].details["drains"] is False
    assert "NVIDIA's catalogue: ignore" in found[0].action
    found = _xid_findings([fatal])
    assert found[0].severity is Severity.CRITICAL and found[0].details["drains"] is True
    assert found[0].details["short"].startswith("xid 149 fatal")
    # the old behaviour, when asked for
    found = _xid_findings([nonfatal], HealthSettings(nvlink5_drain="all"))
    assert found[0].severity is Severity.CRITICAL
    # subcodes that never drain are a setting
    ignore_37 = HealthSettings(nvlink5_no_drain=parse_subcodes(["149.37"]))
    assert _xid_findings([fatal], ignore_37)[0].severity is Severity.WARN


def test_nvlink5_settings_are_checked():
    assert parse_subcodes(["149.38", "145.0"]) == {(149, 38), (145, 0)}
    for bad in ("79.1", "149", "149.64", "x"):
        with pytest.raises(ValueError, match="XID.subcode"):
            parse_subcodes([bad])
    with pytest.raises(ValueError, match="nvlink5_drain"):
        HealthSettings.from_dict({"nvlink5_drain": "some"})
    from mctl.errors import UsageError
    from mctl.inventory.convert import health_settings
    from mctl.inventory.schema import HealthSpec

    with pytest.raises(UsageError, match="health.nvlink5_no_drain") as err:
        health_settings(HealthSpec(nvlink5_no_drain=["79.1"]))
    assert err.value.exit_code == 2
    assert health_settings(HealthSpec()).nvlink5_no_drain == {(149, 38), (149, 40)}
    back = HealthSettings.from_dict(HealthSettings().to_dict())
    assert back.nvlink5_no_drain == {(149, 38), (149, 40)} and back.nvlink5_drain == "fatal"


def test_nvlink5_line_without_the_word_follows_drain_xids():
    assert nvlink5_detail(145, "RLW_REMAP Nonfatal XC0 i0 Link 02").subcode is None
    assert judge(146, "some older text", DEFAULT_DRAIN_XIDS).drains is True
    assert judge(146, "TLW_RX_PIPE1 Fatal XC0 i0 Link 03 (0x00000010)", DEFAULT_DRAIN_XIDS - {146}).drains is False


def test_xid_154_recovery_action_read_and_used():
    change = recovery_change(154, "GPU recovery action changed from 0x0 (None) to 0x4 (Drain and Reset)")
    assert (change.old, change.new, change.new_name) == (0, 4, "Drain and Reset")
    assert recovery_change(154, "GPU recovery action changed from 0x0 to 0x2").new_name == "Node Reboot Required"
    found = _xid_findings(["NVRM: Xid (PCI:0008:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x4 "
                           "(Drain and Reset)"])
    assert found[0].severity is Severity.CRITICAL and found[0].action.startswith("the driver asks for: Drain and Reset")
    found = _xid_findings(["NVRM: Xid (PCI:0008:01:00): 154, GPU recovery action changed from 0x4 (Drain and Reset) "
                           "to 0x0 (None)"])
    assert found[0].severity is Severity.WARN


# --- --query-gpu CSV ------------------------------------------------------------------------------

CSV = {
    "netdata-tesla-p100.csv": None,
    "issue-provider-configs-91-query-gpu-h100nvl.csv": None,
}


def test_real_query_csv():
    fields = ["name", "uuid", "fan.speed", "pstate", "memory.reserved", "memory.used", "memory.free",
              "utilization.gpu", "utilization.memory", "temperature.gpu", "power.draw", "clocks.current.graphics",
              "clocks.current.sm", "clocks.current.memory", "clocks.current.video"]
    rows = parse_query_csv(real_text("netdata-tesla-p100.csv"), fields)
    assert len(rows) == 1
    row = rows[0]
    assert row["name"] == "Tesla P100-PCIE-16GB" and row["uuid"] == "GPU-ef1b2c9b-38d8-2090-2bd1-f567a3eb42a6"
    assert row["fan.speed"] is None and row["power.draw"] == "28.16" and row["memory.free"] == "16280"
    rows = parse_query_csv(real_text("issue-provider-configs-91-query-gpu-h100nvl.csv"), ["name", "pci.device_id"],
                           header=False)
    assert rows == [{"name": "NVIDIA H100 NVL", "pci.device_id": "0x232110DE"}]


# --- bad input ------------------------------------------------------------------------------------

GB200 = (REAL_SAMPLES.parent / "gb200-nvidia-smi-q-x.xml").read_text()
BAD = {
    "empty": ("", "printed nothing"),
    "truncated": (GB200[: len(GB200) // 2], "output truncated"),
    "cut in a tag": (GB200[:GB200.index("<gpu id") + 9], "not well-formed"),
    "html": ("<!DOCTYPE html>\n<html><head><title>502 Bad Gateway</title></head><body></body></html>", "HTML page"),
    "html no doctype": ("<html><body>login</body></html>", "HTML page"),
    "binary": (bytes(range(256)).decode("latin-1"), "binary data"),
    "nul in the document": (GB200.replace("<attached_gpus>", "<attached_gpus>\x00", 1), "binary data"),
    "-q text": ("\n==============NVSMI LOG==============\n\nTimestamp : Thu Jan 30\n", "-x is missing"),
    "foreign xml": ('<?xml version="1.0"?><rss><channel/></rss>', "root <rss>"),
    "json": ('{"gpus": []}', "printed no XML"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_documents_say_what_could_not_be_read(case):
    doc, words = BAD[case]
    with pytest.raises(FactsParseError) as err:
        parse_xml(doc)
    assert words in err.value.message
    assert "\x00" not in err.value.message


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_documents_make_the_tray_facts_unreadable_never_healthy(case):
    doc, words = BAD[case]
    gpus, error, _ = smi_section(Section("nvidia-smi", doc, 0), None, 30.0)
    assert gpus is None and error.startswith("nvidia-smi output unreadable") and words in error
    facts = TrayFacts(host="gb-t07", gpus=None, gpu_error=error)
    found = checks.run_tray(facts, TrayExpectation(host="gb-t07", rack="rack-a"), S)
    facts_finding = [f for f in found if f.check == gpu_count.FACTS]
    assert facts_finding[0].host == "gb-t07" and facts_finding[0].severity is Severity.CRITICAL
    assert facts_finding[0].details["short"] == "gpu facts unreadable"
    assert words in facts_finding[0].message
    assert not any(f.check.startswith("gpu.") and f.severity is Severity.OK for f in found)


def test_bad_csv_and_nvlink_input():
    with pytest.raises(FactsParseError, match="binary"):
        parse_query_csv("name\x00\x07", ["name"])
    with pytest.raises(FactsParseError, match="unexpected text"):
        parse_nvlink_status("<html><body>502</body></html>")
    with pytest.raises(FactsParseError, match="unexpected text"):
        parse_nvlink_status(real_text("issue-gpud-1085-nvlink-all-inactive-b200.txt")[:40])
    # links and the all-inactive sentence for one GPU cannot both be true
    with pytest.raises(FactsParseError, match="also says all links are inactive"):
        parse_nvlink_status("GPU 0: NVIDIA GB200 (UUID: GPU-1)\n\t Link 0: 53.125 GB/s\n"
                            "NVML: Unable to retrieve NVLink information as all links are inActive\n")


def test_kernel_log_parser_survives_garbage():
    junk = bytes(range(256)).decode("latin-1") * 4 + "\nNVRM: Xid (PCI:zzzz): 79, x\nNVRM: Xid (PCI:0000:29:00): , x\n"
    assert parse_xid_events(junk) == []


# --- the probe's kernel-log grep ------------------------------------------------------------------

@pytest.mark.parametrize("name", ["issue-nvsentinel-155-dmesg-fell-off-bus-no-xid.txt",
                                  "issue-akash-support-209-dmesg-T-xid79.txt", "gpud-dmesg-T-xid-119.log"])
def test_probe_grep_keeps_what_the_parser_needs(tmp_path, name, processes):
    """The probe's own `xid` shell function over a real log (the kern.log path pointed at a copy)."""
    import subprocess

    from mctl.facts import shell
    from mctl.facts.probe import xid_section

    log = tmp_path / "kern.log"
    log.write_bytes((REAL_SAMPLES / name).read_bytes())
    body = shell.FUNCTIONS["xid"].replace("/var/log/kern.log", str(log)).replace("@XID_TAIL@", str(shell.XID_TAIL))
    body = body.replace("@XID_BYTES@", str(shell.XID_BYTES))
    out = subprocess.run(["/bin/sh", "-c", body + "\nxid\n"], capture_output=True, text=True, timeout=30).stdout
    problems: list[str] = []
    source, events = xid_section({"xid": Section("xid", out, 0)}, problems)
    assert source == str(log) and problems == []
    assert [(e.pci, e.code, e.form) for e in events] == [(p, c, f) for p, c, f, _ in KERNEL_LOGS[name]]
