"""DCGM's health check on a tray: `dcgmi health -c -j` -> mctl.model.tray.DcgmHealth. Pure; standard library only.

The shape is dcgmi's own (NVIDIA/DCGM dcgmi/Health.cpp, HandleOneEntity, 3.3 to 4.6; the JSON writer
dcgmi/DcgmiOutput.{h,cpp}; tests/fixtures/real/README.md "dcgmi health -c -j"): a tree under "body" whose
every node is {"value": TEXT, "overflow": [TEXT...], "children": {NAME: node}}:

    body."Overall Health".value                                  Healthy | Warning | Failure
    body.<entity group>.children.<entity id>.value               the entity's worst result
    body.<entity group>.children.<entity id>.children.Errors.children.<system>.value     that system's result
    body.<entity group>.children.<entity id>.children.Errors.children.<system>.overflow  its messages, cut at
                                                                                       54 characters a piece

Entity groups are DCGM's names ("GPU", "Switch", "CPU", "ConnectX"); systems are "PCIe system", "NVLINK
system", "Memory system", "SM system", "InfoROM system", "Thermal system", "Power system", "Driver" ...
dcgmi prints no error code in this report, only the message. On failure dcgmi prints a line on stdout
("Error: Unable to connect to host engine. ...", "Error: Health watches not enabled. ...") and exits
non-zero.

Bad input is never healthy: no JSON, truncated JSON, a missing "Overall Health", an overall or system
result that is none of DCGM's three words, or an entity node that is not the shape above gives a
DcgmHealth with `error` set (mctl.checks.dcgm warns on it), naming the field.
"""

from __future__ import annotations

import json
import re
from typing import Any

from mctl.model.tray import DCGM_FAILURE, DCGM_HEALTHY, DCGM_RESULTS, DcgmHealth, DcgmIncident

OVERALL = "Overall Health"
ERRORS = "Errors"
TIMEOUT_RCS = (124, 137)          # timeout(1): the command ran out of time (137: killed after the grace)
NOT_INSTALLED_RC = 127
WATCHES_SET_NOTE = "mctl: set the DCGM health watches (dcgmi health -s a)"   # the probe's stderr line
_PRINTABLE = re.compile(r"[^\x20-\x7e]")


def said(text: str, limit: int = 160) -> str:
    """The tool's own words, short and printable: its last non-empty line."""
    lines = [_PRINTABLE.sub("?", ln).strip() for ln in (text or "").splitlines()]
    lines = [ln for ln in lines if ln]
    return lines[-1][:limit] if lines else "(no output)"


def _node(value: Any, where: str) -> dict:
    if not isinstance(value, dict):
        raise ValueError(f"{where} is not an object")
    return value


def _children(node: dict, where: str) -> dict:
    kids = node.get("children", {})
    if not isinstance(kids, dict):
        raise ValueError(f"{where}.children is not an object")
    return kids


def _value(node: dict, where: str) -> str:
    v = node.get("value")
    if not isinstance(v, str):
        raise ValueError(f"{where}.value missing" if v is None else f"{where}.value is not a string")
    return v


def _message(node: dict, where: str) -> str:
    parts = node.get("overflow", [])
    if not isinstance(parts, list) or not all(isinstance(p, str) for p in parts):
        raise ValueError(f"{where}.overflow is not a list of strings")
    return " ".join(p.strip() for p in parts if p.strip())


def _clean(text: str, limit: int) -> str:
    """A field of the report as a finding (and a drain reason) may carry it: printable, bounded."""
    return _PRINTABLE.sub("?", str(text)).strip()[:limit]


def _incident(group, eid, system, health, message) -> DcgmIncident:
    return DcgmIncident(_clean(group, 24), _clean(eid, 16), _clean(system, 40), _clean(health, 40), _clean(message, 400))


def parse_report(text: str) -> tuple[str, tuple[DcgmIncident, ...]]:
    """The report's (overall result, incidents); ValueError naming what is wrong with it."""
    text = (text or "").strip()
    if not text:
        raise ValueError("printed nothing")
    try:
        doc = json.loads(text)
    except ValueError as exc:
        kind = "truncated JSON" if text.startswith("{") else "no JSON"
        raise ValueError(f"printed {kind} ({getattr(exc, 'msg', exc)} at char {getattr(exc, 'pos', '?')}): "
                         f"{said(text, 80)}") from None
    body = _node(_node(doc, "the report").get("body"), "body")
    if OVERALL not in body:
        raise ValueError(f'body."{OVERALL}" missing')
    overall = _value(_node(body[OVERALL], f'body."{OVERALL}"'), f'body."{OVERALL}"')
    if overall not in DCGM_RESULTS:
        raise ValueError(f'body."{OVERALL}" is {_clean(overall, 40)!r} (not Healthy, Warning or Failure)')
    incidents: list[DcgmIncident] = []
    for group, gnode in body.items():
        if group == OVERALL:
            continue
        gwhere = f"body.{group}"
        for eid, enode in _children(_node(gnode, gwhere), gwhere).items():
            ewhere = f"{gwhere}.{eid}"
            enode = _node(enode, ewhere)
            entity = _value(enode, ewhere)
            errors = _children(enode, ewhere).get(ERRORS, {})
            systems = _children(_node(errors, f"{ewhere}.{ERRORS}"), f"{ewhere}.{ERRORS}")
            if not systems and entity != DCGM_HEALTHY:
                incidents.append(_incident(group, eid, "", entity, ""))
            for system, snode in systems.items():
                swhere = f"{ewhere}.{system}"
                snode = _node(snode, swhere)
                incidents.append(_incident(group, eid, system, _value(snode, swhere), _message(snode, swhere)))
    return overall, tuple(incidents)


def worst(overall: str, incidents: tuple[DcgmIncident, ...]) -> str | None:
    """The worst result of the report: its overall, or an incident's when that is worse (never better);
    None when an incident's result is none of DCGM's words (not reported)."""
    rank = {r: i for i, r in enumerate(DCGM_RESULTS)}
    if any(i.health not in rank for i in incidents):
        return None
    return max([overall, *(i.health for i in incidents)], key=rank.__getitem__)


def observe(rc: int | None, stdout: str, stderr: str = "", *, timeout: float | None = None) -> DcgmHealth:
    """The dcgm section of a probe (the shell function `dcgm`: rc 127 when dcgmi is not installed) -> DcgmHealth."""
    if rc == NOT_INSTALLED_RC:
        return DcgmHealth(installed=False)
    watches_set = WATCHES_SET_NOTE in (stderr or "")
    if rc in TIMEOUT_RCS:
        within = f" within {timeout:g}s" if timeout else ""
        return DcgmHealth(True, error=f"dcgmi health -c did not answer{within} (host engine hung?); killed",
                          watches_set=watches_set)
    if rc is None:
        return DcgmHealth(True, error="dcgmi health -c output cut off", watches_set=watches_set)
    if rc != 0:
        words = said(stdout if (stdout or "").strip() else stderr)
        return DcgmHealth(True, error=f"dcgmi health -c exited {rc}: {words}", watches_set=watches_set)
    try:
        overall, incidents = parse_report(stdout)
    except ValueError as exc:
        return DcgmHealth(True, error=f"dcgmi health -c -j: {exc}", watches_set=watches_set)
    judged = worst(overall, incidents)
    if judged is None:
        odd = next(i for i in incidents if i.health not in DCGM_RESULTS)
        return DcgmHealth(True, overall, incidents, error=f"dcgmi health -c -j: {odd.label} {odd.system or 'entity'} "
                          f"result {odd.health[:40]!r} (not Healthy, Warning or Failure)", watches_set=watches_set)
    return DcgmHealth(True, judged, tuple(i for i in incidents if i.health != DCGM_HEALTHY), watches_set=watches_set)


__all__ = ["observe", "parse_report", "worst", "OVERALL", "WATCHES_SET_NOTE", "DCGM_FAILURE"]
