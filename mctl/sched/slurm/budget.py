"""The site's safety budget, kept by slurmctld: one grant per tray out of service by mctl's decision (pure).

Every actor of mctl that takes a tray out of service — the watch, every tray's node check,
`health check --remediate`, a partition change's or a rollout's hold — runs on its own host, so the
budget's state must be shared and each grant decided atomically. slurmctld, which every one of them
already reaches to drain, does both (decision D67):

- `mctl deploy slurm` renders one Slurm *license* per rack (`mctl_budget_rack_<rack>`, its count the
  rack's limit) and one for the site (`mctl_budget_site`, the site's limit), plus `mctl_budget_trip:1`;
- a **grant** is a reservation `mctl_budget_<tray>` holding one license of its rack and one of the
  site (`Flags=ANY_NODES`: licenses only, no node reserved, no job touched). slurmctld creates a
  reservation whole or not at all and refuses one whose licenses are all reserved, and a name is
  unique, so two node checks that ask at the same instant never both get the last slot, and a tray
  asks once however often it is drained;
- a refused grant **trips** the budget: the reservation `mctl_budget_tripped` (its comment says which
  tray was refused and why). While it exists every new grant is refused (sticky); a person lifts it
  (`mctl health breaker reset`). Resumes are never refused: returning capacity is always safe;
- a grant is **released** when its tray is resumed (in the same script as the resume), and the
  watch releases grants whose tray is back in service by other hands (an operator's resume).

The grant is asked in the same guarded script as the drain (mctl.sched.slurm.drain), right before
`scontrol update`, and given back if the drain does not happen. Standard library only (the node
check carries it to the trays).
"""

from __future__ import annotations

import re
import shlex
from typing import Mapping

from mctl.model.budget import BudgetView, Grant

PREFIX = "mctl_budget_"
SITE_LICENSE = "mctl_budget_site"
TRIP_LICENSE = "mctl_budget_trip"
TRIPPED = "mctl_budget_tripped"           # the reservation that says the budget is tripped
RC_BUDGET = 5                             # the script's word for a drain the budget refused
RC_NO_BUDGET = 6                          # ... refused because the budget is not in Slurm (not deployed)
_NAME_OK = re.compile(r"[A-Za-z0-9_.-]+")


def rack_license(rack: str | None) -> str:
    return f"{PREFIX}rack_{rack or 'none'}"


def grant_name(tray: str) -> str:
    return f"{PREFIX}{tray}"


def caps(limits: Mapping[str, int], site_limit: int) -> dict[str, int]:
    """license name -> count: each rack's limit, the site's, the trip marker."""
    out = {SITE_LICENSE: max(0, site_limit)}
    out.update({rack_license(r): max(0, n) for r, n in sorted(limits.items())})
    out[TRIP_LICENSE] = 1
    return out


def licenses(limits: Mapping[str, int], site_limit: int) -> str:
    """slurm.conf's `Licenses=` value for the budget: each rack's limit, the site's, the trip marker."""
    return ",".join(f"{name}:{n}" for name, n in caps(limits, site_limit).items())


def site_caps(site) -> dict[str, int]:
    """*site*'s budget (mctl.model.settings.BudgetSettings) as license counts: each rack's limit from its
    compute trays, the site's from all of them."""
    b = site.safety.budget
    per_rack = {name: len(r.compute) for name, r in site.racks.items()}
    return caps({name: b.rack_limit(n) for name, n in per_rack.items()}, b.site_limit(sum(per_rack.values())))


def site_licenses(site) -> str:
    """The `Licenses=` value for *site*'s budget."""
    return ",".join(f"{name}:{n}" for name, n in site_caps(site).items())


def usable(name: str) -> bool:
    """A rack or tray name Slurm takes in a license or reservation name as it is."""
    return bool(_NAME_OK.fullmatch(name))


# ------------------------------------------------------------------ script lines (inside a drain step)

def grant_lines(tray: str, rack: str | None, comment: str, *, trip: bool = True) -> list[str]:
    """Ask the grant for *tray* (once `rc` is still empty): refused when the budget is tripped, when the
    rack's or the site's licenses are all granted (which trips it), or when the budget is not in Slurm.
    Sets `g` when this step created the grant (so a drain that does not happen gives it back). *trip*
    False: a refusal is said but does not trip the budget (an operator's own command asking). Every
    scontrol is written `$(scontrol ` or `{ scontrol ` so a bounded script bounds it too (drain.script)."""
    name, rl = grant_name(tray), rack_license(rack)
    lic = f"{SITE_LICENSE}:1,{rl}:1"
    note = shlex.quote(comment[:200])
    tripped = shlex.quote(f"refused {tray}: {comment}"[:200])
    where = f"rack {rack or 'none'}"
    return [
        "g=",
        f"[ -n \"$rc\" ] || {{ t=$(scontrol show reservation {TRIPPED} 2>&1) && {{ c=${{t#*Comment=}}; "
        f"[ \"$c\" = \"$t\" ] && c=; echo \"held back by the safety budget: it is tripped ($c); 'mctl health breaker "
        f"reset' once a person looked\"; rc={RC_BUDGET}; }}; }}",
        f"[ -n \"$rc\" ] || {{ o=$(scontrol create reservation ReservationName={name} Licenses={lic} StartTime=now "
        f"Duration=UNLIMITED Users=root Flags=ANY_NODES Comment={note} 2>&1); case \"$o\" in "
        "*created*) g=1;; *[Dd]uplicate*) ;; *) "
        f"l=$(scontrol show license {SITE_LICENSE} 2>&1); m=$(scontrol show license {rl} 2>&1); "
        f"case \"$l $m\" in *LicenseName={SITE_LICENSE}*LicenseName={rl}*) "
        f"echo \"held back by the safety budget: every grant of {where} or of the site is taken: $(printf '%s %s' "
        f"\"$l\" \"$m\" | tr -s ' \\n' ' ')\"; "
        + (f"{{ scontrol create reservation ReservationName={TRIPPED} Licenses={TRIP_LICENSE}:1 StartTime=now "
           f"Duration=UNLIMITED Users=root Flags=ANY_NODES Comment={tripped} >/dev/null 2>&1; }}; " if trip else "")
        + f"rc={RC_BUDGET};; "
        f"*) echo \"the safety budget is not in Slurm (no license {SITE_LICENSE} or {rl}): run 'mctl deploy "
        f"slurm'\"; rc={RC_NO_BUDGET};; esac;; esac; }}",
    ]


def give_back_lines(tray: str) -> list[str]:
    """After the drain: a grant this step created goes back when the drain did not happen."""
    return [f"[ \"$rc\" = 0 ] || [ -z \"$g\" ] || {{ scontrol delete reservation={grant_name(tray)} >/dev/null 2>&1; }}"]


def release_lines(tray: str) -> list[str]:
    """After a resume that took effect: the tray's grant is released (none held is fine)."""
    return [f"[ \"$rc\" != 0 ] || {{ scontrol delete reservation={grant_name(tray)} >/dev/null 2>&1; }} || true"]


# ------------------------------------------------------------------ what slurmctld holds

SHOW_RESERVATIONS = "scontrol show reservation -o"
_FIELD = re.compile(r"(\w+)=(.*?)(?= \w+=|$)")


def parse_reservations(text: str) -> BudgetView:
    """`scontrol show reservation -o` -> the budget's grants and trip (other reservations ignored)."""
    grants: dict[str, Grant] = {}
    tripped = tripped_at = None
    for line in text.splitlines():
        line = line.strip()
        head, sep, comment_text = line.partition(" Comment=")     # the comment is the last field, and free text
        fields = dict(_FIELD.findall(head))
        if sep:
            fields["Comment"] = comment_text
        name = fields.get("ReservationName", "")
        if not name.startswith(PREFIX):
            continue
        comment = fields.get("Comment")
        comment = None if comment in (None, "(null)") else comment
        if name == TRIPPED:
            tripped, tripped_at = comment or "tripped", fields.get("StartTime")
            continue
        grants[name[len(PREFIX):]] = Grant(name[len(PREFIX):], fields.get("Licenses", ""), fields.get("StartTime"),
                                          comment)
    return BudgetView(grants, tripped, tripped_at)


SHOW_LICENSES = "scontrol show license -o"


def parse_licenses(text: str) -> dict[str, int]:
    """`scontrol show license -o` -> the budget's caps as slurmctld enforces them (license -> Total)."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        fields = dict(_FIELD.findall(line.strip()))
        name, total = fields.get("LicenseName", ""), fields.get("Total", "")
        if name.startswith(PREFIX) and total.isdigit():
            out[name] = int(total)
    return out


RESERVATIONS_MARK = "@@mctl-reservations"
LICENSES_MARK = "@@mctl-licenses"
NOW_MARK = "@@mctl-now "


def with_reservations(command: str) -> str:
    """*command* (a read of the nodes), then the reservations (the budget's grants), the licenses (its caps)
    and the controller's clock (a grant's age is the controller's to tell); *command*'s exit status is the
    script's."""
    return (f"{command}; rc=$?; echo {RESERVATIONS_MARK}; {SHOW_RESERVATIONS} 2>/dev/null; "
            f"echo {LICENSES_MARK}; {SHOW_LICENSES} 2>/dev/null; "
            f"echo \"{NOW_MARK}$(date +%Y-%m-%dT%H:%M:%S)\"; exit $rc")


def split_reservations(stdout: str) -> tuple[str, BudgetView]:
    """What `with_reservations` printed -> (the nodes' part, the budget's grants, trip and caps)."""
    from dataclasses import replace

    nodes, _, rest = stdout.partition(RESERVATIONS_MARK + "\n")
    rest, _, now = rest.partition(NOW_MARK)
    reservations, _, lics = rest.partition(LICENSES_MARK + "\n")
    return nodes, replace(parse_reservations(reservations), now=now.strip() or None, limits=parse_licenses(lics))


def reset_script() -> str:
    """Lift the trip (the grants stay: they are trays still out of service)."""
    return f"scontrol delete reservation={TRIPPED} 2>&1; true\n"


def release_script(trays) -> str:
    """Release the grants of *trays* (back in service by other hands)."""
    return "".join(f"scontrol delete reservation={grant_name(t)} >/dev/null 2>&1 && echo \"released {t}\"\n"
                   for t in trays) + "true\n"


# ------------------------------------------------------------------ the round trips (a command's own grants)

def grant_script(trays: Mapping[str, str | None], comment: str, *, count_only: bool = False) -> str:
    """One grant per tray (*trays*: tray -> its rack), each printing `@@mctl-grant TRAY rc=N` (0 granted or
    held already, RC_BUDGET refused, RC_NO_BUDGET not deployed); *count_only*: refused is said, not tripped."""
    lines: list[str] = []
    for tray, rack in trays.items():
        lines += ["rc="] + grant_lines(tray, rack, comment, trip=not count_only)
        lines.append(f"printf '\\n@@mctl-grant %s rc=%d\\n' {shlex.quote(tray)} \"${{rc:-0}}\"")
    return "\n".join(lines) + "\n"


def parse_grants(stdout: str, trays) -> tuple[list[str], dict[str, str]]:
    """(granted, {tray: why not}) from what grant_script printed; a tray without its line was not asked."""
    granted: list[str] = []
    refused: dict[str, str] = {}
    said: list[str] = []
    seen: set[str] = set()
    for line in stdout.splitlines():
        m = re.match(r"@@mctl-grant (\S+) rc=(\d+)$", line.strip())
        if not m:
            if line.strip():
                said.append(line.strip())
            continue
        seen.add(m[1])
        if m[2] == "0":
            granted.append(m[1])
        else:
            refused[m[1]] = " ".join(said) or f"refused (rc {m[2]})"
        said = []
    for t in trays:
        if t not in seen:
            refused[t] = "no answer from the controller"
    return granted, refused
