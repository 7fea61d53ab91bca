"""The switch side of a tray's NVLink fabric, from its rack's NMX-M view (the sweep's, mctl.health.nmx_watch).

NMX-M's partition health words and what NVIDIA says of each (NMX-M documentation, "Partition
Health", docs.nvidia.com/networking/display/nmxmv8511000/partition+health): HEALTHY is full
bandwidth and compute; DEGRADED (some GPUs parked, NO_NVLINK) and DEGRADED_BANDWIDTH (trunk
links missing, every GPU still reaches every other at reduced bandwidth) are "considered
operational"; UNHEALTHY ("a loss of a switch or other internal failures") is "not considered
operational". `partition_level` is the one judge of those words: the audit's
nmx.partition_health uses it as it stands (UNHEALTHY critical), the sweep uses it for which
partitions are degraded (mctl.health.fabric_limit limits jobs there).

On a compute tray every switch-side finding warns (D106): the fault is the switch
tray's, not the compute tray's, so draining compute trays one by one (and running the recovery
ladder on them) would not help; each GPU keeps 16 of its 18 links when one of the 9 switch
trays is lost. What limits jobs is the degraded-fabric feature/label on the partition's trays,
and a rack hold is the escalation's.
"""

from __future__ import annotations

from mctl.model.findings import Finding, Severity

SWITCH = "nmx.switch_tray"
PORT = "nmx.switch_port"
PARTITION = "nmx.tray_partition"
VIEW = "nmx.switch_side"

_LEVEL = {"HEALTHY": Severity.OK, "NEW": Severity.OK, "DEGRADED": Severity.WARN,
          "DEGRADED_BANDWIDTH": Severity.WARN, "UNHEALTHY": Severity.CRITICAL}


def partition_level(health: str | None) -> Severity:
    """NMX-M partition health as a severity: HEALTHY/NEW ok, DEGRADED/DEGRADED_BANDWIDTH warn, UNHEALTHY
    critical; UNKNOWN or a word the model does not hold warns (never healthy by accident)."""
    return _LEVEL.get(str(health or "UNKNOWN").upper(), Severity.WARN)


def degraded(health: str | None) -> bool:
    return partition_level(health) is not Severity.OK


def judge_tray(tray: str, view) -> list[Finding]:
    """The tray's switch-side findings from its rack's SwitchSideView (None: the rack has no NMX-M)."""
    if view is None or view.read_at is None:
        return []
    parts, faults = view.for_tray(tray)
    out: list[Finding] = []
    switches = [f for f in faults if f.kind == "switch"]
    ports = [f for f in faults if f.kind == "port"]
    hint = f"see 'mctl partition show {view.rack} ...' and the NVLink switch tray's own state (NVOS, its BMC)"
    if switches:
        text = ", ".join(f"{f.switch} {f.state}" for f in switches)
        out.append(Finding(Severity.WARN, tray, SWITCH, f"NVLink switch tray {text} on NMX-M serves this tray's GPUs"
                           f" (partitions {', '.join(sorted({p for f in switches for p in f.partitions})) or '-'})",
                           hint, {"short": "switch tray " + switches[0].switch,
                                  "switches": [f.to_dict() for f in switches]}))
    else:
        out.append(Finding(Severity.OK, tray, SWITCH, "every switch tray serving its GPUs is healthy on NMX-M"))
    if ports:
        text = ", ".join(f"{f.switch} port {f.port} ({'/'.join(f.gpus) or '-'}) {f.state}" for f in ports[:4])
        more = f" and {len(ports) - 4} more" if len(ports) > 4 else ""
        out.append(Finding(Severity.WARN, tray, PORT, f"switch port down on NMX-M: {text}{more}; the GPUs route over "
                           "the other switch trays at reduced bandwidth", hint,
                           {"short": f"{ports[0].switch} port {ports[0].port} down",
                            "ports": [f.to_dict() for f in ports]}))
    else:
        out.append(Finding(Severity.OK, tray, PORT, "every switch port cabled to its GPUs is up on NMX-M"))
    bad = [p for p in parts if degraded(p.health)]
    if bad:
        text = ", ".join(f"{p.name} {p.health}" for p in bad)
        out.append(Finding(Severity.WARN, tray, PARTITION, f"its NVLink partition is {text} on NMX-M", hint,
                           {"short": f"partition {bad[0].name} {bad[0].health}",
                            "partitions": [p.to_dict() for p in bad]}))
    elif parts:
        out.append(Finding(Severity.OK, tray, PARTITION, f"its NVLink partition {parts[0].name} is healthy on NMX-M"))
    return out


def judge_view(view, stale_after_s: float) -> list[Finding]:
    """The rack's own finding: the switch side read, well-formed and recent (host: the rack)."""
    if view is None:
        return []
    rack = view.rack
    if view.error:
        age = f"; judging the read of {view.age_s:.0f} s ago" if view.read_at is not None and view.age_s else \
            "; the switch side is not judged"
        return [Finding(Severity.WARN, rack, VIEW, f"NMX-M switch side not read: {view.error}{age}",
                        "check the rack's NMX-M (racks.<rack>.nmx) and 'mctl partition list'",
                        {"subject": "switch side", "short": "nmx unread"})]
    if view.age_s is not None and view.age_s > stale_after_s:
        return [Finding(Severity.WARN, rack, VIEW, f"NMX-M switch side view is {view.age_s:.0f} s old (a read is "
                        f"still in flight; stale after {stale_after_s:g} s)", "check the rack's NMX-M",
                        {"subject": "switch side", "short": "nmx stale"})]
    return [Finding(Severity.OK, rack, VIEW, f"NMX-M switch side read: {view.switch_nodes} switch trays, "
                    f"{view.ports} ports", None, {"subject": "switch side"})]
