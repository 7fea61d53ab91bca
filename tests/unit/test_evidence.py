"""Evidence bundles (mctl/health/evidence.py) without a lab: the tray's answer parsed, files capped and
described, a tray that did not answer, the bad input the command refuses, and the lab's
nvidia-bug-report.sh stand-in run in-process."""

from __future__ import annotations

import base64
import gzip
import io
import json
import sys

import pytest

from mctl.errors import UsageError
from mctl.health import evidence
from mctl.lab.gpus import gpu_state
from mctl.lab.layout import LabLayout
from mctl.lab.services import EMULATORS
from mctl.transport.results import HostResult, HostStatus

pytestmark = pytest.mark.pure
NONCE = "0123456789abcdef"


def _answer(rc="0", report=None, out=b"Running nvidia-bug-report.sh... complete.\n", kern=b"kernel: NVRM: Xid 79\n",
            imex=b"", tray=b"Linux lab-r1-tray01\n", size=None, cut_after=None) -> str:
    report = gzip.compress(b"nvidia bug report\n" * 100, mtime=0) if report is None else report
    parts = [("bug-rc", rc), ("bug-size", str(len(report) if size is None else size) if report else ""),
             ("nvidia-bug-report.log.gz", base64.b64encode(report).decode()),
             ("bug-output", base64.b64encode(out).decode()), ("kernel.log", base64.b64encode(kern).decode()),
             ("nvidia-imex.log", base64.b64encode(imex).decode()), ("tray.txt", base64.b64encode(tray).decode())]
    if cut_after is not None:
        parts = parts[:cut_after]
    return "".join(f"\n=={NONCE} {name}==\n{body}" for name, body in parts) + "\n"


def _result(stdout, status=HostStatus.OK, error=None):
    return HostResult("lab-r1-tray01", "127.0.0.1", status, exit_code=0 if status is HostStatus.OK else None,
                      stdout=stdout, error=error)


def _bundle(tmp_path):
    b = evidence.Bundle("lab-r1-tray01", tmp_path / "b", "before reboot", 0.0)
    b.path.mkdir()
    return b


def test_a_full_answer_gives_every_file_with_its_hash(tmp_path):
    b = _bundle(tmp_path)
    evidence._tray_files(b, _result(_answer()), NONCE, evidence.caps(evidence.DEFAULT_MAX_BYTES))
    items = {i.name: i for i in b.items}
    assert items["nvidia-bug-report.log.gz"].status == "ok"
    assert gzip.decompress((b.path / "nvidia-bug-report.log.gz").read_bytes()).startswith(b"nvidia bug report")
    assert (b.path / "kernel.log").read_bytes() == b"kernel: NVRM: Xid 79\n"
    assert items["nvidia-imex.log"].status == "missing"            # no IMEX log on the tray: said, not a problem
    assert items["tray.txt"].sha256 and not b.problems


def test_each_file_keeps_to_its_share_of_the_cap(tmp_path):
    b = _bundle(tmp_path)
    cap = evidence.caps(evidence.MIN_MAX_BYTES)
    big = b"x" * (cap["kernel.log"] + 500)
    evidence._tray_files(b, _result(_answer(kern=big, size=10 ** 9)), NONCE, cap)
    items = {i.name: i for i in b.items}
    assert items["kernel.log"].status == "capped" and items["kernel.log"].bytes == cap["kernel.log"]
    assert items["nvidia-bug-report.log.gz"].status == "capped" and "of 1000000000 bytes" in items[
        "nvidia-bug-report.log.gz"].note
    assert sum(i.bytes for i in b.items) <= evidence.MIN_MAX_BYTES


@pytest.mark.parametrize("rc,report,why", [
    ("124", b"", "did not finish within its deadline (killed)"),
    ("127", b"", "nvidia-bug-report.sh is not installed"),
    ("1", b"", "nvidia-bug-report.sh exited 1"),
    ("0", b"garbage, not gzip", "wrote no gzip file"),
])
def test_a_bug_report_that_failed_says_why_and_the_logs_still_come(tmp_path, rc, report, why):
    b = _bundle(tmp_path)
    evidence._tray_files(b, _result(_answer(rc=rc, report=report, out=b"ERROR: it went wrong\n")), NONCE,
                         evidence.caps(evidence.DEFAULT_MAX_BYTES))
    items = {i.name: i for i in b.items}
    assert items["nvidia-bug-report.log.gz"].status in ("failed", "missing")
    assert why in items["nvidia-bug-report.log.gz"].note and "ERROR: it went wrong" in items["nvidia-bug-report.log.gz"].note
    assert any(why in p for p in b.problems)
    assert (b.path / "kernel.log").exists()
    assert (b.path / "nvidia-bug-report.log.gz.partial").exists() == bool(report)


def test_an_answer_cut_by_its_deadline_keeps_what_came(tmp_path):
    b = _bundle(tmp_path)
    evidence._tray_files(b, _result(_answer(cut_after=5), HostStatus.TIMEOUT, "command did not finish within 60s"),
                         NONCE, evidence.caps(evidence.DEFAULT_MAX_BYTES))
    items = {i.name: i for i in b.items}
    assert items["kernel.log"].status == "ok" and items["tray.txt"].status == "failed"
    assert any("cut" in p for p in b.problems)


def test_a_tray_that_did_not_answer_gets_a_bundle_saying_so(tmp_path):
    b = _bundle(tmp_path)
    evidence._tray_files(b, _result("", HostStatus.UNREACHABLE, "no SSH answer within 10s"), NONCE,
                         evidence.caps(evidence.DEFAULT_MAX_BYTES))
    assert not b.reached and b.problems == ["nothing from the tray: unreachable: no SSH answer within 10s"]


def test_garbage_in_a_section_is_not_taken_for_the_file(tmp_path):
    text = _answer().replace(base64.b64encode(b"kernel: NVRM: Xid 79\n").decode(), "!!not base64!!")
    assert evidence.parse(text, NONCE)["kernel.log"] is None
    assert evidence.parse("no markers at all", NONCE) == {name: None for name in evidence.SECTIONS}
    assert evidence.parse(_answer(), "another-nonce")["kernel.log"] is None


def test_the_command_bounds_the_bug_report_and_removes_its_folder():
    cmd = evidence.command(NONCE, 60.0, evidence.caps(evidence.DEFAULT_MAX_BYTES))
    assert "timeout -k 5 45 nvidia-bug-report.sh" in cmd and 'rm -rf "$d"' in cmd
    assert "mktemp -d /tmp/mctl-evidence.XXXXXX" in cmd
    assert "timeout -k 5 5 nvidia-bug-report.sh" in evidence.command(NONCE, 12.0, evidence.caps(1 << 20))


def test_bundle_folders_are_named_by_time_and_reason_and_never_reused(tmp_path):
    one = evidence.bundle_dir(tmp_path, "t1", "before power-cycle", 0.0)
    assert one.name == "19700101T000000Z-before-power-cycle" and one.parent.name == "t1"
    one.mkdir(parents=True)
    assert evidence.bundle_dir(tmp_path, "t1", "before power-cycle", 0.0).name.endswith("-2")
    assert evidence.bundle_dir(tmp_path, "t1", "../../etc; rm -rf /", 0.0).name == "19700101T000000Z-etc-rm-rf"


def test_bad_input_is_refused_with_a_hint():
    assert evidence.parse_size("32M") == 32 << 20 and evidence.parse_size("64k") == 64 << 10
    assert evidence.parse_size("1GiB") == 1 << 30 and evidence.parse_size("70000") == 70000
    for bad in ("lots", "-1M", "1T", ""):
        with pytest.raises(UsageError):
            evidence.parse_size(bad)
    for deadline, size in ((5, 1 << 20), (float("nan"), 1 << 20), (60, 100), (60, 5 << 30)):
        with pytest.raises(UsageError):
            evidence.check_limits(deadline, size)
    for reason in ("", "x" * 201, "line\nbreak"):
        with pytest.raises(UsageError):
            evidence.check_reason(reason)


def test_the_index_is_appended_and_read_back(tmp_path):
    b = evidence.Bundle("t1", tmp_path / "evidence" / "t1" / "x", "on-demand", 0.0, items=[evidence.Item("a", "ok", 3)])
    evidence._index(tmp_path, [b])
    evidence._index(tmp_path, [b])
    rows = evidence.read_index(tmp_path, "t1")
    assert len(rows) == 2 and rows[0]["path"] == "evidence/t1/x" and rows[0]["bytes"] == 3
    assert evidence.read_index(tmp_path, "t2") == []


# --- the lab's nvidia-bug-report.sh ---------------------------------------------------------------

@pytest.fixture
def bug_report(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(EMULATORS))
    for name in ("nvidia_smi", "bug_report"):
        sys.modules.pop(name, None)
    import bug_report as module

    layout = LabLayout("lab", 1, 2)
    host = next(h for h in layout.hosts() if h.kind == "tray")
    (tmp_path / "gpus.json").write_text(json.dumps(gpu_state(layout, host)))
    env = {"MCTL_LAB_GPU_STATE": str(tmp_path / "gpus.json"), "MCTL_LAB_FAULTS": str(tmp_path / "faults.json")}
    monkeypatch.setattr(module.os, "geteuid", lambda: 0)
    monkeypatch.setattr(module, "KERN_LOG", str(tmp_path / "kern.log"))
    (tmp_path / "kern.log").write_text("Dec  2 18:00:00 lab-r1-tray01 kernel: NVRM: Xid (PCI:0008:01:00): 79\n")

    def run(faults=None):
        (tmp_path / "faults.json").write_text(json.dumps(faults or {}))
        out = io.StringIO()
        rc = module.main(["--output-file", str(tmp_path / "report.log")], env=env, stdout=out)
        return rc, out.getvalue(), (tmp_path / "report.log.gz")

    return run


def test_the_stand_in_writes_a_gzip_report_of_the_trays_state(bug_report):
    rc, out, path = bug_report({"fell_off_bus": [0]})
    assert rc == 0 and "has been created" in out
    text = gzip.decompress(path.read_bytes()).decode()
    assert "Start of NVIDIA bug report log file" in text and "/usr/bin/nvidia-smi -q" in text
    assert "Xid (PCI:0008:01:00): 79" in text and '"fell_off_bus": [0]' in text


def test_the_stand_ins_truncated_report_is_not_gzip_a_reader_can_finish(bug_report):
    rc, _out, path = bug_report({"tool_faults": {"nvidia-bug-report.sh": "truncated"}})
    assert rc == 0
    with pytest.raises(EOFError):
        gzip.decompress(path.read_bytes())
