"""`mctl power` logic against the real GB200 capture served as a static mockup (POSTs recorded, never applied):
the order of stages, one POST per reset and never a second, graceful then forced, a broken BMC reported
while the others go on, busy trays refused."""

from __future__ import annotations

import json
import sys
from contextlib import ExitStack
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from redfish_mockup import MockupServer, free_port, throwaway_ca  # noqa: E402

from mctl.bmc import power  # noqa: E402
from mctl.bmc.client import BMCCredentials, RedfishClient  # noqa: E402
from mctl.bmc.inventory import Settings  # noqa: E402
from mctl.errors import EXIT_OK, EXIT_PARTIAL  # noqa: E402
from mctl.model.change import RunningWork  # noqa: E402
from mctl.model.site import Host  # noqa: E402

REAL = Path(__file__).resolve().parents[1] / "fixtures" / "real" / "redfish"
GB200 = REAL / "nvidia_gb200"
SWITCH = REAL / "nvidia_gbswitch"
CRED = BMCCredentials("root", "0penBmc")
RESET = "/redfish/v1/Systems/System_0/Actions/ComputerSystem.Reset"


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    hosts = ["127.0.0.1"] + [f"127.65.{i}.1" for i in range(1, 6)]
    ca, cert, key = throwaway_ca(tmp_path_factory.mktemp("pki"), hosts)
    return ca, (cert, key)


class Probe:
    """The OS side without SSH: a fixed boot id per host (None: the OS does not answer)."""

    def __init__(self, boots):
        self.boots = dict(boots)
        self.calls = 0

    def boot_ids(self, hosts):
        self.calls += 1
        return {h.name: self.boots.get(h.name) for h in hosts}


def _hosts(n, role="compute"):
    return [Host(f"t{i}", f"127.65.{i}.1", role, "r1", bmc=f"127.65.{i}.1") for i in range(1, n + 1)]


def _posts(srv):
    return [json.loads(b)["ResetType"] for p, b in srv.posts if p == RESET]


def _run(hosts, servers, port, ca, action, *, probe, **kw):
    settings = Settings(CRED, verify_tls=str(ca), port=port, timeout_s=3, deadline_s=10)
    kw.setdefault("work_lookup", lambda names: ([], None))
    return power.run(None, action, power.groups_of(hosts), settings=settings, probe=probe, **kw)


def test_host_system_of_the_real_captures(pki, sockets):
    ca, tls = pki
    for root, reset in ((GB200, True), (SWITCH, True)):
        with MockupServer(root, tls=tls) as srv:
            client = RedfishClient(f"https://{srv.host}:{srv.port}", CRED, verify_tls=str(ca), timeout_s=5)
            system = power.host_system(client)
            assert system.path == "/redfish/v1/Systems/System_0" and system.power_state == "On"
            assert system.reset_target == RESET
            # The capture links System_0/ResetActionInfo but did not capture it: the allowed values are unknown.
            assert system.reset_types is None


def test_stage_order_on_and_off():
    hosts = _hosts(2) + [Host("s1", "127.65.9.1", "switch", "r1", bmc="127.65.9.1")]
    on = power.plan("on", power.groups_of(hosts), None)
    off = power.plan("off", power.groups_of(hosts), None)
    assert [s.name for s in on] == ["power_shelf", "switch", "compute"]
    assert [s.name for s in off] == ["compute", "switch", "power_shelf"]
    assert on[0].state == "skipped" and "no power shelves" in on[0].note
    assert [t.host for t in off[0].trays] == ["t1", "t2"] and [t.host for t in off[1].trays] == ["s1"]


def test_off_is_graceful_then_forced_each_sent_once_and_the_deadline_reports_it(pki, sockets):
    """The static capture stays On whatever is POSTed: GracefulShutdown, then ForceOff after the graceful wait,
    then the stage deadline; each reset POSTed exactly once."""
    ca, tls = pki
    hosts = _hosts(2) + [Host("s1", "127.65.3.1", "switch", "r1", bmc="127.65.3.1")]
    port = free_port([h.bmc for h in hosts])
    with ExitStack() as st:
        srvs = [st.enter_context(MockupServer(GB200 if h.role == "compute" else SWITCH, host=h.bmc, port=port,
                                              tls=tls)) for h in hosts]
        report = _run(hosts, srvs, port, ca, "off", probe=Probe({"t1": "boot-1"}), graceful_s=0.5, stage_s=2.0)
    t1, t2 = report.stages[0].trays
    assert srvs[2].requests == [] and report.stages[1].trays[0].error_kind == "not-started"
    assert _posts(srvs[0]) == ["GracefulShutdown", "ForceOff"] and t1.sent == ["GracefulShutdown", "ForceOff"]
    assert _posts(srvs[1]) == ["ForceOff"]                    # its OS did not answer: no graceful request
    assert t1.error_kind == t2.error_kind == "timeout" and "still On" in t1.error
    assert report.exit_code == EXIT_PARTIAL
    assert [s.state for s in report.stages] == ["failed", "not-started", "skipped"]


def test_on_of_trays_already_on_sends_nothing(pki, sockets):
    ca, tls = pki
    hosts = _hosts(1)
    port = free_port([h.bmc for h in hosts])
    with MockupServer(GB200, host=hosts[0].bmc, port=port, tls=tls) as srv:
        report = _run(hosts, [srv], port, ca, "on", probe=Probe({"t1": "b"}), stage_s=5.0)
    assert srv.posts == [] and report.trays[0].ok and report.exit_code == EXIT_OK
    assert report.trays[0].before == report.trays[0].after == "On" and report.trays[0].os_after is True


@pytest.mark.parametrize("fault, kind", [("401", "auth"), ("500", "http"), ("malformed", "malformed")])
def test_a_broken_bmc_is_reported_and_the_others_go_on(pki, fault, kind, sockets):
    ca, tls = pki
    hosts = _hosts(2)
    port = free_port([h.bmc for h in hosts])
    with MockupServer(GB200, host=hosts[0].bmc, port=port, tls=tls, fault=fault,
                      fault_path="/redfish/v1/Systems/System_0"), \
            MockupServer(GB200, host=hosts[1].bmc, port=port, tls=tls):
        report = _run(hosts, [], port, ca, "status", probe=Probe({}))
    bad, good = report.trays
    assert bad.error_kind == kind and not bad.ok
    assert good.ok and good.before == "On"
    assert report.exit_code == EXIT_PARTIAL and [t.host for t in report.failed] == ["t1"]


def test_a_reset_whose_answer_is_lost_is_not_sent_again(pki, sockets):
    ca, tls = pki
    hosts = _hosts(1)
    port = free_port([h.bmc for h in hosts])
    with MockupServer(GB200, host=hosts[0].bmc, port=port, tls=tls, fault="slow", fault_path=RESET,
                      hold_s=10) as srv:
        report = _run(hosts, [srv], port, ca, "off", probe=Probe({}), stage_s=4.0)
    t = report.trays[0]
    assert _posts(srv) == ["ForceOff"] and t.sent == ["ForceOff"]
    assert t.error_kind == "timeout" and "not sent again" in t.error


def test_a_rejected_reset_is_reported_not_retried(pki, sockets):
    ca, tls = pki
    hosts = _hosts(1)
    port = free_port([h.bmc for h in hosts])
    with MockupServer(GB200, host=hosts[0].bmc, port=port, tls=tls, fault="500", fault_path=RESET) as srv:
        report = _run(hosts, [srv], port, ca, "cycle", probe=Probe({"t1": "b"}), stage_s=4.0, force=True)
    assert _posts(srv) == ["PowerCycle"] and report.trays[0].error_kind == "http"


def test_busy_trays_are_refused_unless_force(pki, sockets):
    ca, tls = pki
    hosts = _hosts(2)
    port = free_port([h.bmc for h in hosts])
    job = RunningWork("slurm", "42", "alice", "train", "R", ("t1",))
    with ExitStack() as st:
        srvs = [st.enter_context(MockupServer(GB200, host=h.bmc, port=port, tls=tls)) for h in hosts]
        one = _run(hosts, srvs, port, ca, "off", probe=Probe({}), stage_s=1.0, work_lookup=lambda n: ([job], None))
        assert one.trays[0].error_kind == "refused" and "slurm 42" in one.trays[0].error
        assert srvs[0].posts == [] and _posts(srvs[1]) == ["ForceOff"]       # the other tray went on
        assert one.work and one.work[0]["id"] == "42"
        whole = _run(hosts, srvs, port, ca, "off", probe=Probe({}), stage_s=1.0, all_or_nothing=True,
                     work_lookup=lambda n: ([job], None))
        assert all(t.error_kind == "refused" for t in whole.trays) and srvs[0].posts == []
        assert len(srvs[1].posts) == 1                                        # nothing new
        unknown = _run(hosts, srvs, port, ca, "off", probe=Probe({}), stage_s=1.0, dry_run=True,
                       work_lookup=lambda n: ([], "cannot read the Slurm queue"))
        assert all("cannot be read" in t.error for t in unknown.trays) and srvs[0].posts == []
        forced = _run(hosts, srvs, port, ca, "off", probe=Probe({}), stage_s=1.0, force=True,
                      work_lookup=lambda n: ([job], None))
        assert _posts(srvs[0]) == ["ForceOff"] and not forced.trays[0].refused


def test_the_safety_budget_is_asked_for_the_trays_the_work_leaves_and_refuses_the_command_whole(pki, sockets):
    ca, tls = pki
    hosts = _hosts(3)
    port = free_port([h.bmc for h in hosts])
    job = RunningWork("slurm", "42", "alice", "train", "R", ("t1",))
    asked: list[list[str]] = []

    def budget(limit):
        def admit(names):
            asked.append(list(names))
            return {n: "held back by the safety budget: every grant is taken" for n in names[limit:]}
        return admit

    with ExitStack() as st:
        srvs = [st.enter_context(MockupServer(GB200, host=h.bmc, port=port, tls=tls)) for h in hosts]
        over = _run(hosts, srvs, port, ca, "off", probe=Probe({}), stage_s=1.0, admit=budget(1),
                    work_lookup=lambda n: ([job], None))
        assert asked == [["t2", "t3"]]                       # t1 runs a job: refused before the budget is asked
        assert [t.error_kind for t in over.trays] == ["refused"] * 3 and all(s.posts == [] for s in srvs)
        assert "held back by the safety budget" in over.trays[2].error
        assert "the safety budget refuses t3" in over.trays[1].error
        dry = _run(hosts, srvs, port, ca, "off", probe=Probe({}), dry_run=True, admit=budget(0))
        assert len(asked) == 1 and not any(t.error for t in dry.trays)          # a dry run asks nothing
        fits = _run(hosts[1:], srvs[1:], port, ca, "off", probe=Probe({}), stage_s=1.0, admit=budget(2))
        assert all(t.error_kind != "refused" for t in fits.trays)     # sent (the capture keeps its PowerState)
        assert all(_posts(s) == ["ForceOff"] for s in srvs[1:]) and asked[-1] == ["t2", "t3"]


def test_dry_run_sends_nothing(pki, sockets):
    ca, tls = pki
    hosts = _hosts(1)
    port = free_port([h.bmc for h in hosts])
    with MockupServer(GB200, host=hosts[0].bmc, port=port, tls=tls) as srv:
        report = _run(hosts, [srv], port, ca, "off", probe=Probe({"t1": "b"}), dry_run=True)
    assert srv.requests == [] and report.exit_code == EXIT_OK and report.dry_run


# ------------------------------------------------------------------ confirmations (issue 27.6)

def _site(tmp: Path, ca: Path, port: int, bmc: str) -> Path:
    cred = tmp / "bmc.cred"
    cred.write_text("root:0penBmc\n")
    cred.chmod(0o600)
    (tmp / "mctl.yml").write_text(f"""\
site: powertest
bmc: {{credentials_file: bmc.cred, verify_tls: {ca}, port: {port}, timeout_s: 3, deadline_s: 10}}
racks:
  r1:
    shape: {{compute_trays: 1, switch_trays: 0}}
    compute: {{nodes: r1-tray1, addresses: 127.65.0.1, bmc: {bmc}}}
""")
    return tmp / "mctl.yml"


@pytest.fixture
def one_tray(pki, tmp_path):
    """`mctl power` on an inventory of one tray whose BMC is the GB200 capture (POSTs recorded, never applied)."""
    from cli_helpers import run_cli

    ca, tls = pki
    bmc = "127.65.4.1"
    port = free_port([bmc])
    inv = _site(tmp_path, ca, port, bmc)
    with MockupServer(GB200, host=bmc, port=port, tls=tls) as srv:
        yield srv, lambda capsys, *args: run_cli(capsys, "-i", str(inv), "--state-dir", str(tmp_path / "state"),
                                                 *args)


@pytest.mark.parametrize("args", [("power", "off", "r1-tray1"), ("power", "off", "r1-tray1", "--force"),
                                  ("power", "cycle", "r1-tray1", "--force", "--json"), ("power", "cycle", "r1"),
                                  ("rack", "power", "off", "r1"), ("rack", "power", "off", "r1", "--force")],
                         ids=" ".join)
def test_power_off_and_cycle_without_a_terminal_need_yes_and_send_nothing(capsys, one_tray, args, sockets):
    srv, mctl = one_tray
    r = mctl(capsys, *args)
    assert r.code == 2, r.err
    assert "needs a confirmation and there is no terminal to ask; nothing was done" in r.err
    assert "hint: add --yes" in r.err and r.out == ""
    assert srv.requests == []                 # the BMC was not even asked for its state


def test_power_off_with_yes_is_sent_and_a_dry_run_never_asks(capsys, one_tray, sockets):
    srv, mctl = one_tray
    dry = mctl(capsys, "power", "off", "r1-tray1", "--force", "--dry-run", "--json")
    assert dry.code == 0, dry.err
    assert json.loads(dry.out)["dry_run"] and srv.posts == []
    # the stage's deadline covers the OS probe, the state read and the POST (a loaded machine needs seconds),
    # then runs out: the capture stays On whatever is POSTed
    sent = mctl(capsys, "power", "off", "r1-tray1", "--force", "--yes", "--deadline", "6", "--json")
    (t,) = [t for s in json.loads(sent.out)["stages"] for t in s["trays"]]
    assert _posts(srv) == ["ForceOff"] and t["sent"] == ["ForceOff"]
    assert sent.code == 3 and t["error_kind"] == "timeout" and "still On" in t["error"]
    assert "confirmation" not in sent.err
