"""A tray that arrived with its OS only: what provisioning will install, told apart from what blocks bring-up.

On a fresh tray nvidia-smi is not installed yet, so the inventory sees no GPU; that is
provisioning's to fix, not a fault, when the tray's BMC and the rack's NMX-M both show all its
GPUs. What blocks bring-up: a GPU that one of them does not show (wrong shape), a witness that
could not be read, a tray no witness can vouch for, and two trays whose BMCs report one chassis
serial (two inventory addresses reaching one tray). Pure: the caller reads the BMCs and NMX-M
(mctl.rackinv.bare).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping, Sequence

from mctl.checks._base import fail
from mctl.checks.gpu_count import FACTS
from mctl.model.findings import Finding

if TYPE_CHECKING:
    from mctl.model.site import Rack
    from mctl.model.tray import TrayFacts

CHECK = "gpu.out-of-band"
SERIAL = "bmc.serial-duplicate"


@dataclass(frozen=True)
class Witness:
    """What one out-of-band source says about one tray's GPUs."""

    source: str                           # "BMC" | "NMX-M"
    gpus: tuple[str, ...] | None          # the GPUs it shows (None: not read)
    error: str | None = None              # why it was not read


def _deferrable(t: "TrayFacts", witnesses: Sequence[Witness], want: int) -> tuple[str | None, Finding | None]:
    """(what provisioning will install, None) or (None, the blocking finding) for a tray without GPU tools."""
    if not witnesses:
        return None, fail(t.host, CHECK, f"{t.gpu_error}, and neither a BMC nor NMX-M is configured to show its GPUs",
                          "provision it first (mctl provision HOST), or add the inventory's bmc section or the "
                          "rack's nmx endpoint so bring-up can tell a bare tray from a faulty one",
                          short="no gpu tools, no witness")
    unread = [w for w in witnesses if w.gpus is None]
    if unread:
        return None, fail(t.host, CHECK, f"{t.gpu_error}, and "
                          + "; ".join(f"the {w.source} could not be read ({w.error})" for w in unread),
                          "bring-up needs the tray's BMC and NMX-M to show its GPUs before provisioning: fix the "
                          "connection, then --resume", short="no gpu tools, witness unread")
    short = [w for w in witnesses if len(w.gpus or ()) != want]
    if short:
        return None, fail(t.host, CHECK, "; ".join(f"the {w.source} shows {len(w.gpus or ())} GPUs, expected {want}"
                                                   + (f" ({', '.join(w.gpus)})" if w.gpus else "")
                                                   for w in short) + " (no GPU tools on the tray yet)",
                          "a GPU is missing from the tray: reseat or replace it before bring-up (check the BMC's "
                          "HGX_GPU chassis and NMX-M's compute node)", short=f"gpu count {len(short[0].gpus or ())}/{want}",
                          sources={w.source: list(w.gpus or ()) for w in witnesses}, expected=want)
    said = ", ".join(f"{w.source} {len(w.gpus or ())}/{want}" for w in witnesses)
    return f"nvidia-smi not installed yet: provisioning installs the GPU tools ({said} GPUs)", None


def judge(rack: "Rack", trays: Sequence["TrayFacts"], findings: Sequence[Finding],
          witnesses: Mapping[str, Sequence[Witness]], serials: Mapping[str, str]) -> tuple[list[Finding], dict[str, str]]:
    """(the findings that still stand, tray -> what provisioning will install there).

    *findings*: the inventory's (mctl.checks.inventory.validate_rack); *witnesses*: per tray without GPU tools,
    its BMC's and NMX-M's view; *serials*: tray -> the chassis serial its BMC reports."""
    deferred: dict[str, str] = {}
    added: list[Finding] = []
    for t in trays:
        if not t.gpu_tools_missing:
            continue
        note, blocking = _deferrable(t, list(witnesses.get(t.host, ())), rack.gpus_per_tray)
        if note:
            deferred[t.host] = note
        if blocking:
            added.append(blocking)
    owners: dict[str, list[str]] = {}
    for host, serial in serials.items():
        if serial:
            owners.setdefault(serial, []).append(host)
    for serial, hosts in sorted(owners.items()):
        if len(hosts) > 1:
            for h in hosts:
                deferred.pop(h, None)
                added.append(fail(h, SERIAL, f"its BMC reports chassis serial {serial}, as the BMC of "
                                  + ", ".join(o for o in hosts if o != h) + " does",
                                  "two inventory entries reach one tray (or its BMC): fix the bmc addresses in the "
                                  "inventory", serial=serial, trays=hosts))
    replaced = {t.host for t in trays if t.gpu_tools_missing}
    kept = [f for f in findings if not (f.check == FACTS and f.host in replaced)]
    return kept + added, deferred
