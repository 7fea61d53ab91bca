"""The rack inventory's rules: what a rack really is against what an NVL72 rack must be.

The ids, severities and purposes are mctl.checks.catalogue's; gpu.facts, gpu.count,
fabric.state and fabric.health are the health catalogue's own rules (the same
modules), so a tray is judged alike by `mctl rack inventory` and a health sweep.

Rules (each yields findings, never an exception; nothing is guessed):
- every compute tray answered (unreachable, hung and refused trays are critical);
- each tray shows Rack.gpus_per_tray GPUs, readable from nvidia-smi, and as many as the
  driver counts (fewer <gpu> blocks than attached_gpus is a finding, never a shorter list);
- each GPU's fabric is Completed/Success and in an NVLink domain (an all-zero
  cluster UUID is no domain);
- one cluster UUID per tray and per rack, the one the inventory declares, and
  no cluster UUID shared with another rack;
- the GPUs of one tray in one clique (a tray is never split across partitions);
- one driver version across the rack; trays' hostnames match the inventory.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Iterable, Mapping, Sequence

from mctl.checks import driver, fabric_health, fabric_state, gpu_count, partial
from mctl.checks._base import fail
from mctl.model.findings import Finding, Severity
from mctl.model.tray import TrayExpectation

if TYPE_CHECKING:
    from mctl.model.settings import HealthSettings
    from mctl.model.site import Rack
    from mctl.model.tray import TrayFacts


def _short(uuid: str) -> str:
    return uuid.split("-")[0]


def _reach_finding(t: "TrayFacts") -> Finding:
    if t.reach == "timeout":
        return fail(t.host, "ssh.timeout", f"tray hung: {t.error}",
                    "check the tray's console (BMC); a host that accepts SSH but never answers is wedged",
                    address=t.address)
    if t.reach == "host-key-mismatch":
        return fail(t.host, "ssh.host-key", t.error or "host key refused",
                    f"verify the key out of band; if the tray was reinstalled: mctl ssh trust {t.host} --replace",
                    address=t.address, **(t.host_key.to_dict() if t.host_key else {}))
    return fail(t.host, "ssh.unreachable", f"unreachable: {t.error}",
                "check power, network and sshd on the tray (BMC console)", address=t.address)


def _tray_findings(rack: "Rack", t: "TrayFacts", settings: "HealthSettings") -> list[Finding]:
    out: list[Finding] = []
    if not t.reached:
        return [_reach_finding(t)]
    if t.hostname and t.hostname.split(".")[0] != t.host:
        out.append(fail(t.host, "host.name", f"answers as {t.hostname!r}, not {t.host!r}",
                        "check the inventory's address list: the address may belong to another tray",
                        hostname=t.hostname))
    out.extend(partial(t))
    expect = TrayExpectation(host=t.host, rack=rack.name, gpus_per_tray=rack.gpus_per_tray,
                             nvlink_domain=rack.nvlink_domain)
    # the rules the health catalogue shares: gpu.facts, gpu.count, fabric.state (the inventory reports problems only)
    out.extend(f for f in gpu_count.check(t, expect, settings) if f.severity is not Severity.OK)
    if t.gpus is None:
        return out
    report = t.gpus
    out.extend(f for f in fabric_state.check(t, expect, settings) if f.severity is not Severity.OK)
    no_domain = [g for g in report.gpus if g.fabric.cluster_uuid is None]
    if no_domain:
        out.append(fail(t.host, "fabric.no-domain",
                        f"GPU {','.join(str(g.index) for g in no_domain)} in no NVLink domain "
                        "(cluster UUID absent or all-zero)",
                        "an NVL72 tray's GPUs must join the rack's NVLink domain: check the fabric",
                        gpus=[g.index for g in no_domain]))
    uuids = report.cluster_uuids
    if len(uuids) > 1:
        per = {u: [g.index for g in report.gpus if g.fabric.cluster_uuid == u] for u in uuids}
        out.append(fail(t.host, "fabric.cluster-uuid-conflict",
                        "GPUs report different NVLink domains: "
                        + "; ".join(f"{u} on GPU {','.join(map(str, ix))}" for u, ix in per.items()),
                        "not resolvable from here: inspect the tray's fabric state with NMX-M", domains=per))
    cliques = report.clique_ids
    if len(cliques) > 1:
        per_clique = {c: [g.index for g in report.gpus if g.fabric.clique_id == c] for c in cliques}
        out.append(fail(t.host, "fabric.clique-split",
                        "GPUs of one tray in different cliques: "
                        + "; ".join(f"clique {c} on GPU {','.join(map(str, ix))}" for c, ix in per_clique.items()),
                        "a tray belongs to one NVLink partition: fix the partition in NMX-M",
                        cliques={str(k): v for k, v in per_clique.items()}))
    out.extend(f for f in fabric_health.check(t, expect, settings) if f.severity is not Severity.OK)
    return out


def validate_rack(rack: "Rack", trays: Sequence["TrayFacts"], *,
                  other_domains: Mapping[str, str] | None = None,
                  settings: "HealthSettings | None" = None) -> list[Finding]:
    """Findings for one rack. *other_domains* maps cluster UUIDs seen on other racks to their names;
    *settings* (the site's health settings; defaults when None) set the shared rules' severities."""
    from mctl.model.settings import HealthSettings

    settings = settings if settings is not None else HealthSettings()
    findings: list[Finding] = []
    for t in trays:
        findings.extend(_tray_findings(rack, t, settings))
    reached = [t for t in trays if t.gpus is not None]
    # Rack-wide NVLink domain: one, the declared one, nobody else's.
    seen: dict[str, list[str]] = {}
    for t in reached:
        for u in t.gpus.cluster_uuids:
            seen.setdefault(u, []).append(t.host)
    if len(seen) > 1:
        major = max(seen, key=lambda u: len(seen[u]))
        from mctl.model.site import fold

        findings.append(fail(rack.name, "fabric.rack-domains",
                             f"{len(seen)} NVLink domains in one rack: "
                             + "; ".join(f"{_short(u)} on {fold(h)}" for u, h in sorted(seen.items())),
                             "an NVL72 rack is one NVLink domain: check the trays outside "
                             f"{_short(major)} and their NVLink cabling/switch trays",
                             domains={u: h for u, h in seen.items()}))
    if rack.nvlink_domain:
        wrong = sorted(u for u in seen if u != rack.nvlink_domain)
        if wrong:
            findings.append(fail(rack.name, "fabric.domain-mismatch",
                                 f"inventory declares NVLink domain {rack.nvlink_domain}, trays report "
                                 + ", ".join(wrong),
                                 "fix nvlink_domain in the inventory, or find why the rack joined another domain"))
    elif len(seen) == 1:
        only = next(iter(seen))
        findings.append(Finding(Severity.OK, rack.name, "fabric.domain-undeclared",
                                f"NVLink domain observed: {only} (the inventory declares none)",
                                f"add 'nvlink_domain: {only}' to rack {rack.name} in the inventory"))
    for u, hosts in sorted(seen.items()):
        other = (other_domains or {}).get(u)
        if other and other != rack.name:
            findings.append(fail(rack.name, "fabric.domain-shared",
                                 f"NVLink domain {u} is also rack {other}'s",
                                 "two racks cannot share an NVLink domain: check which inventory entry is wrong",
                                 domain=u, other_rack=other))
    drivers = Counter(t.gpus.driver_version for t in reached if t.gpus.driver_version)
    if len(drivers) > 1:
        common = drivers.most_common(1)[0][0]
        for t in reached:
            if t.gpus.driver_version and t.gpus.driver_version != common:
                findings.append(Finding(settings.driver_mismatch, t.host, driver.CHECK,
                                        f"driver {t.gpus.driver_version}, the rack runs {common}",
                                        "reprovision the tray with the rack's image (mctl provision)"))
    uuid_owner: dict[str, str] = {}
    for t in reached:
        for g in t.gpus.gpus:
            if g.uuid in uuid_owner and uuid_owner[g.uuid] != t.host:
                findings.append(fail(t.host, "gpu.duplicate",
                                     f"GPU {g.uuid} is also reported by {uuid_owner[g.uuid]}",
                                     "two inventory addresses reach the same tray: fix the address list"))
            uuid_owner.setdefault(g.uuid, t.host)
    return findings


def rack_domains(trays: Iterable["TrayFacts"]) -> set[str]:
    """Cluster UUIDs the rack's trays report (for the cross-rack check)."""
    return {u for t in trays if t.gpus is not None for u in t.gpus.cluster_uuids}
