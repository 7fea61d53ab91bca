"""The sweep and the trays' BMCs (issues 27.4, 27.5): `health check` reads every BMC before judging; the watch's
sweep takes each BMC's view as it is and never waits for one (a hung BMC is bmc.stale, the sweep keeps its
length); each switch tray's leak detectors are in the result (`switch_bmcs`, `--json`'s `switch_trays`) and in
the findings (host: the switch tray, details: its rack).

The BMCs are the real captures served over TLS by the static mockup server (two GB200 compute trays, one
NVLink switch tray); the SSH side is a stand-in pool whose trays answer at once (the probe is not under test).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from redfish_mockup import MockupServer, credentials_file, free_port, throwaway_ca  # noqa: E402

from mctl.checks import leak  # noqa: E402
from mctl.health import sweep as sweep_mod  # noqa: E402
from mctl.health.engine import Engine  # noqa: E402
from mctl.model.findings import Severity  # noqa: E402
from mctl.model.tray import TrayFacts  # noqa: E402
from mctl.transport import HostResult, HostStatus, SSHConfig  # noqa: E402

REAL = Path(__file__).resolve().parents[1] / "fixtures" / "real" / "redfish"
IPS = ["127.66.1.1", "127.66.2.1", "127.66.3.1"]
SWITCH_DETECTORS = "/redfish/v1/Chassis/MGX_BMC_0/ThermalSubsystem/LeakDetection/LeakDetectors"


class _Pool:
    """Every tray answers the probe at once (what it answers is replaced below: the BMC side is under test)."""

    config = SSHConfig(known_hosts=Path("/nonexistent"), command_timeout=60.0)

    async def run(self, targets, command, *, timeout=None, deadline=None, on_result=None):
        out = [HostResult(t.name, t.address, HostStatus.OK, stdout="stand-in", exit_code=0) for t in targets]
        for r in out:
            if on_result is not None:
                on_result(r)
        return out


@pytest.fixture
def rack(tmp_path, monkeypatch, processes, sockets):
    """(site, servers by tray): r1 with two compute trays and a switch tray, each BMC a mockup server."""
    from mctl.inventory import load_site

    ca, cert, key = throwaway_ca(tmp_path / "pki", IPS)
    port = free_port(IPS)
    credentials_file(tmp_path)
    (tmp_path / "mctl.yml").write_text(f"""\
site: bmcsweep
bmc: {{credentials_file: bmc.cred, verify_tls: {ca}, port: {port}, timeout_s: 1, deadline_s: 2}}
health: {{interval: 0.5, bmc_stale_after: 2}}
racks:
  r1:
    shape: {{compute_trays: 2, switch_trays: 1}}
    compute: {{nodes: "r1-tray[1-2]", addresses: "127.67.0.[1-2]", bmc: "127.66.[1-2].1"}}
    switches: {{nodes: r1-nvsw1, addresses: 127.67.1.1, bmc: 127.66.3.1}}
""")
    monkeypatch.setattr(sweep_mod, "from_result", lambda purpose, r, nonce, **kw: TrayFacts(
        r.host, address=r.address, reach="ok"))
    critical = json.loads((REAL / "nvidia_gbswitch" / SWITCH_DETECTORS.lstrip("/") / "leakage2" / "index.json")
                          .read_text())
    critical.update(DetectorState="Critical", Status={"Health": "Critical", "State": "Degraded"})
    with ExitStack() as stack:
        servers = {
            "r1-tray1": MockupServer(REAL / "nvidia_gb200", host=IPS[0], port=port, tls=(cert, key), expand=True),
            "r1-tray2": MockupServer(REAL / "nvidia_gb200", host=IPS[1], port=port, tls=(cert, key), expand=True,
                                     hold_s=60),
            "r1-nvsw1": MockupServer(REAL / "nvidia_gbswitch", host=IPS[2], port=port, tls=(cert, key), expand=True,
                                     overrides={f"{SWITCH_DETECTORS}/leakage2": json.dumps(critical).encode()}),
        }
        for s in servers.values():
            stack.enter_context(s)
        yield load_site(tmp_path / "mctl.yml"), servers, tmp_path


def _engine(site, tmp: Path, **kw) -> Engine:
    from mctl.health.site_view import resolve_scope, settings_of

    return Engine(site, resolve_scope(site, "r1"), settings_of(site), tmp / "state", _Pool(), **kw)


def _of(result, host: str) -> dict:
    return {f.check: f for f in result.findings if f.host == host and f.check.startswith(("bmc.", "leak.", "power."))}


def test_health_check_reads_every_bmc_and_carries_the_switch_trays_leaks(rack):
    site, servers, tmp = rack
    engine = _engine(site, tmp)
    result = asyncio.run(engine.sweep())
    engine.close()
    sw = result.switch_bmcs["r1-nvsw1"]
    assert sw.answered and not sw.power_asked and len(sw.detectors) == 7 and sw.age is None
    assert {d.chassis for d in sw.detectors} == {"MGX_BMC_0"}
    found = _of(result, "r1-nvsw1")
    assert set(found) == {leak.BMC, leak.LEAK}                          # no power, no tray probe of a switch tray
    crit = found[leak.LEAK]
    assert crit.severity is Severity.CRITICAL and "leakage2 Critical" in crit.message
    assert crit.details["rack"] == "r1" and crit.details["role"] == "switch" and crit.details["read"] is True
    assert result.tray_status("r1-nvsw1") == "unknown"                 # not a compute tray: no verdict of its own
    doc = result.to_dict()
    (row,) = doc["switch_trays"]
    assert row["host"] == "r1-nvsw1" and row["rack"] == "r1" and len(row["bmc"]["detectors"]) == 7
    assert json.dumps(doc)                                              # --json: serialisable as it is
    # the compute trays as before: their BMC read once before judging (the capture's 1_ColdPlate is Critical)
    t1 = _of(result, "r1-tray1")
    assert t1[leak.LEAK].severity is Severity.CRITICAL and t1[leak.POWER].severity is Severity.OK
    assert result.facts["r1-tray1"].bmc.age is None


def test_a_site_without_switch_trays_keeps_its_json(rack):
    site, _servers, tmp = rack
    rack_ = site.racks["r1"]
    site.racks["r1"] = replace(rack_, switches=())
    engine = _engine(site, tmp)
    result = asyncio.run(engine.sweep())
    engine.close()
    assert result.switch_bmcs == {} and "switch_trays" not in result.to_dict()


def test_the_watchs_sweep_never_waits_for_a_hung_bmc_and_names_it_stale(rack):
    site, servers, tmp = rack
    engine = _engine(site, tmp, interval=0.5, bmc_watch=True)
    try:
        async def sweeps(n: int, fault_at: int | None = None, release_at: int | None = None):
            out = []
            for i in range(n):
                if i == fault_at:
                    servers["r1-tray2"].fault = "slow"                  # every answer held from now on
                if i == release_at:
                    servers["r1-tray2"].release.set()
                    servers["r1-tray2"].fault = "none"
                t0 = time.monotonic()
                result = await engine.sweep()
                out.append((time.monotonic() - t0, result))
                await asyncio.sleep(0.5)
            return out

        async def main():
            await asyncio.sleep(1.0)                                    # the reader's first reads (beside sweep 1)
            return await sweeps(14, fault_at=1, release_at=9)

        run = asyncio.run(main())
    finally:
        engine.close()
    took = [t for t, _r in run]
    assert max(took) < 0.5, took                                        # the BMC deadline is 2 s: never waited
    stale = [i for i, (_t, r) in enumerate(run) if leak.STALE in _of(r, "r1-tray2")]
    assert stale and all(i > 1 for i in stale), stale
    first = _of(run[stale[0]][1], "r1-tray2")
    assert first[leak.LEAK].severity is Severity.WARN and "not read" in first[leak.LEAK].message
    assert "more than the 1s health.bmc_stale_after allows" in first[leak.STALE].message
    assert not any(leak.STALE in _of(r, "r1-tray1") for _t, r in run)  # the other BMCs are read on
    assert leak.STALE not in _of(run[-1][1], "r1-tray2")               # answered again: fresh
    assert _of(run[-1][1], "r1-nvsw1")[leak.LEAK].severity is Severity.CRITICAL
