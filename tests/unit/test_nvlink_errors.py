"""NVLink error counters as rates over a window, and clock-event reasons over sweeps (issue 30, 1 and 2).

The parser reads the real H100 capture (tests/fixtures/real/ml-engineering-nvlink-e-h100.txt) and the
NVLink5 names in the same line shape (what the lab prints); the memory (mctl.health.signals) turns
readings into growth per counter; the checks judge it with DCGM's thresholds.
"""

from __future__ import annotations

import pytest

from mctl.checks import clocks, nvlink_errors
from mctl.facts import FactsParseError
from mctl.facts.nvidia_smi import parse_nvlink_errors, parse_xml
from mctl.health.signals import SignalMemory
from mctl.model.findings import Severity
from mctl.model.settings import HealthSettings
from mctl.model.tray import Clock, TrayFacts
from tests.helpers import REAL_SAMPLES, real_text

S = HealthSettings()
REPORT = parse_xml((REAL_SAMPLES.parent / "gb200-nvidia-smi-q-x.xml").read_text())
UUIDS = [g.uuid for g in REPORT.gpus]


def nvlink5_text(values: dict[tuple[int, int, str], int] | None = None, gpus=4, links=18) -> str:
    """`nvidia-smi nvlink -e` with the NVLink5 names, in the real capture's line shape (the lab's form)."""
    from mctl.model.gpu import NVLINK5_COUNTERS

    values = values or {}
    out = []
    for g in range(gpus):
        out.append(f"GPU {g}: NVIDIA GB200 (UUID: {UUIDS[g]})")
        for link in range(links):
            for name in NVLINK5_COUNTERS:
                out.append(f"         Link {link}: {name}: {values.get((g, link, name), 0)}")
            out.append(f"         Link {link}: FEC Errors - 0: 36140749276")
            out.append(f"         Link {link}: Effective BER: 15e-255")
            out.append("")
    return "\n".join(out) + "\n"


def facts(text: str, epoch: float, boot: str = "b1", **kw) -> TrayFacts:
    return TrayFacts(host="t01", gpus=REPORT, nvlink_counters=parse_nvlink_errors(text), boot_id=boot,
                     clock=Clock(epoch, None, 100.0), **kw)


def judge(f: TrayFacts, settings=S):
    return nvlink_errors.check(f, None, settings)


def test_nvlink5_form_reads_every_counter_and_leaves_out_bers():
    got = parse_nvlink_errors(nvlink5_text({(2, 13, "Rx Errors"): 7}))
    assert [g.index for g in got] == [0, 1, 2, 3] and got[2].uuid == UUIDS[2]
    assert len(got[2].links) == 18
    assert got[2].links[13]["Rx Errors"] == 7
    assert got[2].links[13]["FEC Errors - 0"] == 36140749276
    assert "Effective BER" not in got[2].links[13]


@pytest.mark.parametrize("text, words", [
    ("", "printed nothing"),
    ("GPU 0: NVIDIA GB200 (UUID: GPU-1)\n\t Link 0: Rx Errors: lots\n", "unexpected value"),
    ("garbage line\n", "unexpected text"),
    ("GPU 0: NVIDIA GB200\x00", "binary"),
])
def test_bad_nvlink_e_output_is_refused_with_the_line(text, words):
    with pytest.raises(FactsParseError, match=words):
        parse_nvlink_errors(text)


def test_not_a_count_is_left_out():
    got = parse_nvlink_errors("GPU 0: NVIDIA GB200 (UUID: GPU-1)\n\t Link 0: Rx Errors: 18446744073709551615\n")
    assert got[0].links == {}


def test_first_reading_is_a_baseline_then_growth_is_judged_by_kind():
    mem = SignalMemory(window_s=600)
    first = mem.see(facts(nvlink5_text(), 1000.0))
    assert first.nvlink_window.baseline
    assert [f.severity for f in judge(first)] == [Severity.OK] and "next sweep" in judge(first)[0].message
    # a few Rx errors in 60 s: counted, a warning (critical from 100/s)
    warn = mem.see(facts(nvlink5_text({(1, 4, "Rx Errors"): 30}), 1060.0))
    found = judge(warn)
    assert [f.severity for f in found] == [Severity.WARN]
    assert "gpu1 link4 Rx Errors +30 in 60s" in found[0].message
    # a failed link recovery: critical at once (DCGM: any replay/recovery error fails)
    crit = mem.see(facts(nvlink5_text({(1, 4, "Rx Errors"): 30, (3, 17, "Link recovery failed events"): 1}), 1120.0))
    found = judge(crit)
    assert found[0].severity is Severity.CRITICAL and found[0].details["short"] == "nvlink gpu3 link17 errors"
    assert found[0].details["links"] == ["gpu3:17"]


def test_a_high_rate_is_critical_and_the_threshold_is_a_setting():
    mem = SignalMemory(window_s=600)
    mem.see(facts(nvlink5_text(), 0.0))
    high = mem.see(facts(nvlink5_text({(0, 0, "Symbol Errors"): 12_000}), 60.0))       # 200/s
    assert judge(high)[0].severity is Severity.CRITICAL
    lenient = HealthSettings(nvlink_error_rate_critical=500.0)
    assert [f.severity for f in judge(high, lenient)] == [Severity.WARN]


def test_a_counter_that_went_backwards_restarts_never_a_negative_or_huge_rate():
    mem = SignalMemory(window_s=600)
    mem.see(facts(nvlink5_text({(0, 1, "Rx Errors"): 5000}), 0.0))
    after = mem.see(facts(nvlink5_text({(0, 1, "Rx Errors"): 3}), 30.0))      # driver reload: counters restart
    assert after.nvlink_window.rates == () and after.nvlink_window.resets == ("gpu0 link1 Rx Errors",)
    assert [f.severity for f in judge(after)] == [Severity.OK] and "restarted" in judge(after)[0].message
    later = mem.see(facts(nvlink5_text({(0, 1, "Rx Errors"): 4}), 60.0))
    assert [(r.counter, r.delta) for r in later.nvlink_window.rates] == [("Rx Errors", 1)]


def test_a_reboot_or_an_old_reading_is_a_new_baseline():
    mem = SignalMemory(window_s=600)
    mem.see(facts(nvlink5_text(), 0.0, boot="b1"))
    assert mem.see(facts(nvlink5_text({(0, 0, "Rx Errors"): 9}), 30.0, boot="b2")).nvlink_window.baseline
    assert mem.see(facts(nvlink5_text({(0, 0, "Rx Errors"): 99}), 5000.0, boot="b2")).nvlink_window.baseline


def test_legacy_names_are_judged_replay_fails():
    legacy = real_text("ml-engineering-nvlink-e-h100.txt")
    mem = SignalMemory(window_s=600)
    mem.see(facts(legacy, 0.0))
    grown = legacy.replace("Link 1: Replay Errors: 0", "Link 1: Replay Errors: 2")
    found = judge(mem.see(facts(grown, 60.0)))
    assert found[0].severity is Severity.CRITICAL and "gpu0 link1 Replay Errors +2" in found[0].message
    crc = legacy.replace("Link 0: CRC Errors: 0", "Link 0: CRC Errors: 5")
    assert judge(mem.see(facts(crc, 120.0)))[0].severity is Severity.WARN


def test_counters_not_reported_are_said_so_never_healthy():
    text = "GPU 0: NVIDIA GB200 (UUID: GPU-1)\n\t Link 0: FEC Errors - 0: 10\n"
    found = judge(facts(text, 0.0))
    assert [f.severity for f in found] == [Severity.WARN] and "not reported" in found[0].message
    unread = TrayFacts(host="t01", gpus=REPORT, nvlink_counters_error="nvidia-smi nvlink -e failed (exit 2)")
    assert judge(unread)[0].severity is Severity.WARN


def test_the_latest_reading_survives_in_the_state_folder(tmp_path):
    mem = SignalMemory(window_s=600)
    mem.see(facts(nvlink5_text({(2, 3, "Rx Errors"): 10}), 0.0))
    mem.save(tmp_path)
    again = SignalMemory.load(tmp_path, 600)
    grown = again.see(facts(nvlink5_text({(2, 3, "Rx Errors"): 12}), 30.0))
    assert [(r.gpu, r.link, r.delta) for r in grown.nvlink_window.rates] == [(2, 3, 2)]
    (tmp_path / "health" / "signals.json").write_text("{not json")
    assert SignalMemory.load(tmp_path, 600).readings == {}


def test_hw_slowdown_is_critical_after_n_sweeps_thermal_warns():
    xml = (REAL_SAMPLES.parent / "gb200-nvidia-smi-q-x.xml").read_text()
    slow = xml.replace("<clocks_event_reason_hw_slowdown>Not Active<", "<clocks_event_reason_hw_slowdown>Active<", 1)
    report = parse_xml(slow)
    assert report.gpus[0].clock_events.active == ("hw_slowdown",)
    mem = SignalMemory()
    settings = HealthSettings(clock_event_sweeps=3)
    severities = []
    for n in range(3):
        f = mem.see(TrayFacts(host="t01", gpus=report, clock=Clock(float(n), None, 1.0)))
        severities.append(clocks.check(f, None, settings)[0].severity)
    assert severities == [Severity.WARN, Severity.WARN, Severity.CRITICAL]
    cleared = mem.see(TrayFacts(host="t01", gpus=REPORT, clock=Clock(4.0, None, 1.0)))
    assert clocks.check(cleared, None, settings)[0].severity is Severity.OK
    capped = parse_xml(xml.replace("<clocks_event_reason_sw_power_cap>Not Active<",
                                   "<clocks_event_reason_sw_power_cap>Active<", 1))
    found = clocks.check(TrayFacts(host="t01", gpus=capped), None, settings)
    assert [f.severity for f in found] == [Severity.WARN] and "gpu0 SW power cap" in found[0].message


def test_clock_reasons_not_reported_are_said_so():
    xml = (REAL_SAMPLES.parent / "gb200-nvidia-smi-q-x.xml").read_text()
    start, end = xml.index("<clocks_event_reasons>"), xml.index("</clocks_event_reasons>") + len("</clocks_event_reasons>")
    bare = parse_xml(xml.replace(xml[start:end], ""))         # every GPU's block (they are the same text)
    assert not any(g.clock_events.known for g in bare.gpus)
    found = clocks.check(TrayFacts(host="t01", gpus=bare), None, S)
    assert [f.severity for f in found] == [Severity.WARN] and "not reported" in found[0].message


def test_the_memory_of_a_tray_stays_small_whatever_the_interval():
    """The watch keeps ~SPACING readings a tray (the oldest in the window, then one every window/SPACING), and a
    reading holds only the counters that are not zero: 200 sweeps 5 s apart keep 9 readings, a healthy tray's
    empty (the chaos soak's watch grew ~0.6 MiB a sweep on 4 trays when every reading of 64 kept every counter)."""
    from mctl.health.signals import SPACING

    mem = SignalMemory(window_s=600)
    for i in range(200):
        mem.see(facts(nvlink5_text({(2, 7, "Rx Errors"): i // 50}), 1000.0 + 5 * i))
    kept = mem.readings["t01"]
    assert len(kept) <= SPACING + 2, len(kept)
    assert all(set(r.counters) <= {(UUIDS[2], 7, "Rx Errors")} for r in kept), kept[-1].counters
    # the window a rate covers stays most of nvlink_error_window
    grown = mem.see(facts(nvlink5_text({(2, 7, "Rx Errors"): 9}), 1000.0 + 5 * 200))
    assert 600 * (1 - 1 / SPACING) <= grown.nvlink_window.seconds <= 600, grown.nvlink_window.seconds
    oldest = 1000.0 + 5 * 200 - grown.nvlink_window.seconds          # the reading the rate was taken from
    assert [(r.gpu, r.link, r.delta) for r in grown.nvlink_window.rates] == [(2, 7, 9 - int((oldest - 1000) / 5) // 50)]


def test_a_counter_back_to_zero_is_a_restart_and_its_baseline():
    mem = SignalMemory(window_s=600)
    mem.see(facts(nvlink5_text({(0, 1, "Rx Errors"): 50}), 0.0))
    zero = mem.see(facts(nvlink5_text(), 30.0))
    assert zero.nvlink_window.rates == () and zero.nvlink_window.resets == ("gpu0 link1 Rx Errors",)
    again = mem.see(facts(nvlink5_text({(0, 1, "Rx Errors"): 2}), 60.0))
    assert [(r.counter, r.delta) for r in again.nvlink_window.rates] == [("Rx Errors", 2)]
