"""Bring-up logic without a lab: journal and resume, phase selection, the Slurm guards, burn-in verdicts.

The orchestration tests swap the phase registry for recording phases (allowed
in unit tests only); everything against real hosts is in tests/e2e.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from mctl.bringup import journal as jr
from mctl.sched.slurm import holds
from mctl.bringup.context import PHASES, Options, Outcome, PhaseFailed
from mctl.bringup.digest import provision_digest, tree_digest
from mctl.bringup.journal import Journal
from mctl.errors import UsageError
from mctl.health import burnin
from mctl.inventory import load_site
from mctl.provision import markers

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture()
def site():
    return load_site(REPO / "inventories" / "example-gb200")


# ------------------------------------------------------------------ options

def test_phase_selection_and_bad_options():
    from mctl.bringup.service import check_options

    assert Options().selected() == list(PHASES)
    assert Options(from_phase="partitions", until_phase="scheduler").selected() == ["partitions", "imex",
                                                                                      "scheduler"]
    with pytest.raises(UsageError, match="unknown phase 'provisioning'"):
        check_options(Options(from_phase="provisioning"))
    with pytest.raises(UsageError, match="comes after"):
        check_options(Options(from_phase="open", until_phase="health"))
    with pytest.raises(UsageError, match="burn-in level"):
        check_options(Options(burn_in="forever"))
    with pytest.raises(UsageError, match="no --from/--until"):
        check_options(Options(from_phase="imex"), resume=True)
    again = Options.from_dict(Options(until_phase="imex", accept=("xid",), burn_in="off").to_dict())
    assert again == Options(until_phase="imex", accept=("xid",), burn_in="off")


# ------------------------------------------------------------------ journal

def test_journal_records_phases_atomically_and_finds_the_next_one(tmp_path):
    j = Journal.create(tmp_path, "site", "/inv/mctl.yml", "rack-a", list(PHASES), Options(until_phase="imex")
                       .selected(), {"until": "imex"})
    assert j.path == tmp_path / "bringup" / "rack-a" / j.run_id / "journal.json"
    assert [p["status"] for p in j.data["phases"]] == ["pending"] * 5 + ["excluded"] * 5
    j.start("preflight")
    j.finish("preflight", jr.DONE, "5 hosts answer", details=["a"], artifacts={"x": 1})
    j.start("inventory")
    on_disk = Journal.load(j.path)
    assert on_disk.phase("preflight")["status"] == "done" and on_disk.phase("inventory")["status"] == "running"
    assert on_disk.next_phase() == "inventory" and on_disk.completed() == ["preflight"]
    assert on_disk.status == jr.RUN_RUNNING                  # this very process owns it
    assert [x.name for x in j.path.parent.iterdir()] == ["journal.json"]    # no temp files left
    for name in ("inventory", "provision", "partitions", "imex"):
        j.start(name)
        j.finish(name, jr.DONE, "ok")
    assert j.next_phase() is None


def test_a_run_whose_process_died_reads_as_interrupted(tmp_path, processes):
    j = Journal.create(tmp_path, "site", "inv", "rack-a", list(PHASES), list(PHASES), {})
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    j.start("preflight")
    j.data["attempts"][-1]["pid"] = int(dead.stdout)       # the process died in the middle of preflight
    j.save()
    killed = Journal.load(j.path)
    assert killed.status == jr.RUN_INTERRUPTED and killed.next_phase() == "preflight"
    killed.attempt()
    assert killed.phase("preflight")["status"] == jr.INTERRUPTED
    assert [h["status"] for h in killed.phase("preflight")["history"]] == ["killed"]
    assert killed.status == jr.RUN_RUNNING
    assert Journal.latest(tmp_path, "rack-a").run_id == j.run_id
    with pytest.raises(UsageError):
        jr.runs_dir(tmp_path, "../etc")


# ------------------------------------------------------------------ orchestration

@dataclass
class Recorder:
    ran: list
    fail_at: str | None = None
    interrupt_at: str | None = None
    changed: bool = True

    def phase(self, name):
        def run(ctx):
            self.ran.append(name)
            if name == self.fail_at:
                raise PhaseFailed(f"{name} broke", hint="fix it", details=["tray03: at task 'x': boom"],
                                  artifacts={"failed_hosts": ["tray03"]})
            if name == self.interrupt_at:
                raise KeyboardInterrupt
            return Outcome("done", f"{name} ok", changed=self.changed, artifacts={"n": len(self.ran)})
        return run


@pytest.fixture()
def recorded(monkeypatch):
    from mctl.bringup import phases
    from mctl.bringup.phases.base import Phase

    rec = Recorder([])
    fake = {n: Phase(n, lambda ctx: [], rec.phase(n)) for n in PHASES}
    monkeypatch.setattr(phases, "REGISTRY", fake)
    return rec


def test_failure_stops_the_run_and_resume_continues_without_redoing(site, tmp_path, recorded):
    from mctl.bringup.service import bring_up

    recorded.fail_at = "provision"
    first = bring_up(site, "rack-a", tmp_path, Options())
    assert first.status == "failed" and first.failed_phase == "provision" and first.exit_code == 3
    assert recorded.ran == ["preflight", "inventory", "provision"]
    j = Journal.load(first.journal.path)
    assert j.phase("provision")["status"] == "failed" and j.phase("provision")["details"] == [
        "tray03: at task 'x': boom"]
    assert j.phase("provision")["error"]["hint"] == "fix it" and j.phase("imex")["status"] == "pending"

    recorded.fail_at, recorded.ran[:] = None, []
    again = bring_up(site, "rack-a", tmp_path, Options(accept=("xid",)), resume=True)
    assert again.status == "succeeded" and again.resumed and again.journal.run_id == first.journal.run_id
    assert recorded.ran == ["provision", "partitions", "imex", "scheduler", "health", "burn-in", "open", "validate"]
    assert again.journal.options["accept"] == ["xid"]
    assert len(again.journal.data["attempts"]) == 2 and not again.already_up
    with pytest.raises(UsageError, match="nothing to resume"):
        bring_up(site, "rack-a", tmp_path, Options(), resume=True)


def test_interrupt_is_journalled_and_until_limits_the_phases(site, tmp_path, recorded):
    from mctl.bringup.service import bring_up

    recorded.interrupt_at = "imex"
    res = bring_up(site, "rack-a", tmp_path, Options(until_phase="scheduler"))
    assert res.status == "interrupted" and res.exit_code == 130
    assert res.journal.phase("imex")["status"] == "interrupted"
    recorded.interrupt_at, recorded.ran[:] = None, []
    res = bring_up(site, "rack-a", tmp_path, Options(), resume=True)
    assert recorded.ran == ["imex", "scheduler"]              # the run's own --until holds on resume
    assert res.journal.phase("health")["status"] == "excluded"


def test_a_run_that_changed_nothing_says_the_rack_was_already_up(site, tmp_path, recorded):
    from mctl.bringup.service import bring_up

    recorded.changed = False
    res = bring_up(site, "rack-a", tmp_path, Options())
    assert res.status == "succeeded" and res.already_up
    assert res.to_dict()["already_up"] is True
    recorded.changed = True
    assert not bring_up(site, "rack-a", tmp_path, Options()).already_up
    with pytest.raises(UsageError, match="unknown rack"):
        bring_up(site, "rack-z", tmp_path, Options())


def test_a_second_bring_up_of_the_same_rack_is_refused(site, tmp_path, recorded):
    from mctl.bringup.service import bring_up
    from mctl.state import LockBusy, file_lock

    with file_lock(tmp_path / "locks" / "bringup-rack-a.lock", purpose="another bring-up"):
        with pytest.raises(LockBusy, match="bring-up of rack rack-a is locked"):
            bring_up(site, "rack-a", tmp_path, Options())
    assert recorded.ran == [] and Journal.runs(tmp_path, "rack-a") == []


# ------------------------------------------------------------------ Slurm guards

SHOW = """NodeName=t1 Arch=x86_64 CoresPerSocket=1 State=IDLE ThreadsPerCore=1 Partitions=gpu
NodeName=t2 Arch=x86_64 CoresPerSocket=1 State=IDLE+DRAIN ThreadsPerCore=1 Reason=mctl: bring-up 20260101-000000-abcdef: opens when health and burn-in pass [root@2026-01-01T00:00:00]
NodeName=t3 Arch=x86_64 CoresPerSocket=1 State=IDLE+DRAIN ThreadsPerCore=1 Reason=bad fan [alice@2026-01-01T00:00:00]
NodeName=t4 Arch=x86_64 CoresPerSocket=1 State=DOWN* ThreadsPerCore=1 Reason=Not responding [slurm@2026-01-01T00:00:00]
"""


def test_classify_keeps_an_operators_drain_apart_from_bring_ups():
    nodes = holds.classify(SHOW, ["t1", "t2", "t3", "t4", "t5"])
    assert nodes.open == ["t1"] and nodes.held == ["t2"] and list(nodes.operator) == ["t3"]
    assert nodes.operator["t3"].startswith("bad fan") and list(nodes.down) == ["t4"] and nodes.unknown == ["t5"]
    assert "1 open" in holds.summary(nodes) and "unknown to Slurm (t5)" in holds.summary(nodes)


def test_scripts_guard_every_update_and_report_per_node(processes):
    drain = holds.hold_script(holds.BRING_UP, ["t1"], holds.bringup_reason("RUN"))
    assert "*DRAIN*|*DOWN*|*FAIL*" in drain and "State=DRAIN Reason='mctl: bring-up RUN: opens" in drain
    resume = holds.release_script(holds.BRING_UP, ["t2"])
    assert "*' Reason=mctl: bring-up'*" in resume and "State=RESUME" in resume
    # The guard runs in a real shell: a node held by an operator is left alone.
    fake = ("scontrol() { if [ \"$1\" = show ]; then echo 'NodeName=t2 State=IDLE+DRAIN Reason=bad fan'; "
            "else echo UPDATED \"$@\"; fi; }\n")
    out = subprocess.run(["bash", "-c", fake + resume], capture_output=True, text=True).stdout
    assert "UPDATED" not in out
    assert holds.parse_actions(out, ["t2"]) == {"t2": ("refused", "left alone: the reason is no longer "
                                                                      "bring-up's")}
    fake_ours = fake.replace("Reason=bad fan", "Reason=mctl: bring-up RUN: x")
    out = subprocess.run(["bash", "-c", fake_ours + resume], capture_output=True, text=True).stdout
    assert holds.parse_actions(out, ["t2"])["t2"][0] == "done" and "UPDATED update NodeName=t2" in out
    assert holds.parse_actions("", ["t9"]) == {"t9": ("failed", "no answer (the script was cut short)")}


# ------------------------------------------------------------------ trays, digests, burn-in

def test_markers_and_tools_parse_what_the_trays_print():
    assert markers.parse_marker('{"digest": "abc", "run_id": "r"}') == {"digest": "abc", "run_id": "r"}
    assert markers.parse_marker("garbage") is None and markers.parse_marker('{"x": 1}') is None
    assert burnin.parse_tools("dcgmi=/usr/bin/dcgmi\nfoo=/bin/foo\nall_reduce_perf=relative\n") == {
        "dcgmi": "/usr/bin/dcgmi"}
    command = markers.write_command({"digest": "d"})
    assert markers.MARKER in command and "mv -f" in command


def test_digest_follows_the_inputs_of_provisioning(site, tmp_path):
    (tmp_path / "site.yml").write_text("- hosts: all\n")
    tree = tree_digest(tmp_path)
    host = site.racks["rack-a"].compute[0]
    one = provision_digest(site, host, host.image, tree)
    assert one == provision_digest(site, host, host.image, tree)
    assert one != provision_digest(site, site.racks["rack-a"].compute[1], host.image, tree)
    (tmp_path / "site.yml").write_text("- hosts: compute\n")
    assert provision_digest(site, host, host.image, tree_digest(tmp_path)) != one


def test_burn_in_verdicts():
    # a table instead of dcgmi's -j JSON, a table without its end: never a pass (tests/unit/test_burnin.py has the rest)
    assert not burnin.judge_dcgm(0, "| Diagnostic | Pass |\n").ok
    assert not burnin.judge_nccl(0, "# Out of bounds values : 0 OK\n# Avg bus bandwidth    : 801.5 \n").ok
    assert not burnin.judge_nccl(1, "NCCL error\n").ok
    assert burnin.dcgm_command("long") == "dcgmi diag -r 3 -j"


def test_health_exceptions_match_check_or_host_and_check():
    from mctl.bringup.phases.health import accepted
    from mctl.model.findings import Finding, Severity

    f = Finding(Severity.WARN, "lab-r1-tray03", "thermal.temperature", "hot")
    assert accepted(f, ["thermal.*"]) and accepted(f, ["lab-r1-tray03:thermal.temperature"])
    assert accepted(f, ["lab-r1-tray0[1-3]:*"]) and not accepted(f, ["lab-r1-tray01:*", "xid"])


def test_the_health_gate_notes_a_reboot_but_refuses_every_other_finding(monkeypatch, tmp_path):
    from types import SimpleNamespace

    from mctl.bringup.phases import health as gate
    from mctl.bringup.context import PhaseFailed
    from mctl.health import service
    from mctl.model.findings import Finding, Severity

    boot = Finding(Severity.WARN, "t1", "tray.boot", "tray rebooted since the last sweep")
    hot = Finding(Severity.WARN, "t2", "thermal.temperature", "hot")
    ok = Finding(Severity.OK, "t1", "gpu.count", "4 GPUs")
    ctx = SimpleNamespace(site=None, rack=SimpleNamespace(name="r"), state_dir=tmp_path, trays=["t1", "t2"],
                          options=SimpleNamespace(accept=[]))
    monkeypatch.setattr(service, "run_check", lambda *a, **k: SimpleNamespace(findings=[boot, ok]))
    out = gate.run(ctx)
    assert out.status == "done" and any(d.startswith("noted: ") and "tray.boot" in d for d in out.details)
    assert out.artifacts["findings"] == [] and [f["check"] for f in out.artifacts["noted"]] == ["tray.boot"]
    monkeypatch.setattr(service, "run_check", lambda *a, **k: SimpleNamespace(findings=[boot, hot, ok]))
    with pytest.raises(PhaseFailed) as err:
        gate.run(ctx)
    assert "1 finding on t2" in err.value.message


def test_result_json_is_serialisable(site, tmp_path, recorded):
    from mctl.bringup.service import bring_up

    res = bring_up(site, "rack-a", tmp_path, Options())
    data = json.loads(json.dumps(res.to_dict()))
    assert [p["phase"] for p in data["phases"]] == list(PHASES) and data["status"] == "succeeded"
    assert Path(data["journal"]).is_file()
