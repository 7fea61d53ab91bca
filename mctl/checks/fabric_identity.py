"""NVLink domain and partition membership against the inventory's plan.

Per tray: the GPUs report the rack's cluster UUID (inventory `nvlink_domain`)
and one clique. Per rack: the trays of one planned partition share a clique,
and two planned partitions do not share one (NMX-M has not applied the plan).
"""

from __future__ import annotations

from collections import Counter
from typing import Mapping, Sequence

from mctl.checks._base import fail, finding, ok
from mctl.model.findings import Finding, Severity
from mctl.model.gpu import FABRIC_COMPLETED

DOMAIN = "fabric.domain"
CLIQUE = "fabric.clique"


def check(facts, expect, settings) -> list[Finding]:
    """The per-tray half (also what `mctl node check` can judge on its own)."""
    if facts.gpus is None or not facts.gpus.gpus:
        return []
    ready = [g for g in facts.gpus.gpus if g.fabric.state == FABRIC_COMPLETED]
    if not ready:
        return []          # fabric.state already says why there is no domain
    out: list[Finding] = []
    uuids = sorted({g.fabric.cluster_uuid for g in ready if g.fabric.cluster_uuid})
    no_domain = [g.index for g in ready if not g.fabric.cluster_uuid]
    if no_domain:
        out.append(fail(facts.host, DOMAIN,
                        f"GPU {','.join(map(str, no_domain))} in no NVLink domain (cluster UUID all-zero or N/A)",
                        "an NVL72 tray's GPUs must join the rack's NVLink domain: check NMX-M and the cabling",
                        short="no nvlink domain"))
    if len(uuids) > 1:
        out.append(fail(facts.host, DOMAIN, f"GPUs report {len(uuids)} NVLink domains: "
                        + ", ".join(uuids), "inspect the tray's fabric with NMX-M", short="nvlink domain split"))
    elif uuids and expect.nvlink_domain and uuids[0] != expect.nvlink_domain.lower():
        out.append(fail(facts.host, DOMAIN,
                        f"in NVLink domain {uuids[0]}, rack {expect.rack} is {expect.nvlink_domain}",
                        "the tray is cabled into another rack's fabric, or the inventory is wrong",
                        short="wrong nvlink domain", have=uuids[0], want=expect.nvlink_domain))
    cliques = sorted({g.fabric.clique_id for g in ready if g.fabric.clique_id is not None})
    if len(cliques) > 1:
        out.append(fail(facts.host, CLIQUE,
                        "GPUs of one tray in different cliques: " + ", ".join(map(str, cliques)),
                        "a tray belongs to one NVLink partition: re-apply the partition (mctl partition apply)",
                        short="clique split"))
    if not out:
        clique = f", clique {cliques[0]}" if cliques else ""
        out.append(ok(facts.host, DOMAIN, f"NVLink domain {uuids[0] if uuids else 'unknown'}{clique}"))
    return out


def _tray_clique(facts) -> int | None:
    if facts.gpus is None:
        return None
    cliques = {g.fabric.clique_id for g in facts.gpus.gpus
               if g.fabric.state == FABRIC_COMPLETED and g.fabric.clique_id is not None}
    return next(iter(cliques)) if len(cliques) == 1 else None


def rack_check(rack: str, trays: Sequence, plan: Mapping[str, str]) -> list[Finding]:
    """Clique against the partition plan. *plan* maps tray -> planned partition name."""
    out: list[Finding] = []
    cliques = {t.host: _tray_clique(t) for t in trays if t.reached and t.host in plan}
    groups: dict[str, dict[str, int]] = {}
    for host, clique in cliques.items():
        if clique is not None:
            groups.setdefault(plan[host], {})[host] = clique
    majority: dict[str, int] = {}
    for part, members in groups.items():
        counts = Counter(members.values())
        top, n = counts.most_common(1)[0]
        if n * 2 <= len(members) and len(counts) > 1:
            out.append(finding(Severity.WARN, rack, CLIQUE,
                               f"partition {part} has no majority clique: " + ", ".join(
                                   f"{h} in {c}" for h, c in sorted(members.items())),
                               "re-apply the partition plan (mctl partition apply)"))
            continue
        majority[part] = top
        for host, clique in sorted(members.items()):
            if clique != top:
                out.append(fail(host, CLIQUE,
                                f"in clique {clique}, its partition {part} is in clique {top}",
                                "the tray left its NVLink partition: re-apply the plan (mctl partition apply) "
                                "or check the tray's NVLinks", short=f"clique {clique} not {top}",
                                clique=clique, partition=part, expected=top))
    shared: dict[int, list[str]] = {}
    for part, clique in majority.items():
        shared.setdefault(clique, []).append(part)
    for clique, parts in sorted(shared.items()):
        if len(parts) > 1:
            out.append(finding(Severity.WARN, rack, CLIQUE,
                               f"planned partitions {', '.join(sorted(parts))} share clique {clique}: "
                               "the plan is not applied in the fabric", "mctl partition apply " + rack))
    return out
