"""mctl's own node feature in Slurm: `nvl_degraded` on the trays of a partition whose NVLink fabric is degraded.

    marked(node) -> bool                          the feature is on the node (AvailableFeatures)
    update(node, mark) -> FeatureStep | None      the step that adds or removes it, None when it is so already
    script(steps, limit_s) -> str                 one script for a sweep's steps (scontrol bounded)
    parse(stdout, hosts) -> {host: StepResult}    each step's `@@mctl-feature HOST rc=N`

Only this one feature is mctl's: every other feature of the node (the rack's, the site's) is
kept as it is, in its order. Each step is a compare-and-set: it updates the node only when its
AvailableFeatures are still what the sweep read, else it is refused (someone changed them;
the next sweep decides again). `scontrol update NodeName=N AvailableFeatures=... ActiveFeatures=...`
(SchedMD scontrol(1)): a feature set this way lasts until slurmctld restarts without its state,
or `scontrol reconfigure`, which is why the watch re-reads and re-marks every sweep.
Jobs keep off the trays with `--constraint` (e.g. `--constraint='[!nvl_degraded]'` where the
site's Slurm supports NOT, or a job_submit rule); the feature does not drain anything.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from mctl.sched.slurm.drain import StepResult, _bounded_scontrol

if TYPE_CHECKING:
    from mctl.sched.slurm.facts import NodeState

FEATURE = "nvl_degraded"
MARK = "@@mctl-feature"
REFUSED_RC = 3


def _features(value: str | None) -> list[str]:
    if not value or value.strip() in ("(null)", "none", ""):
        return []
    return [f for f in value.split(",") if f]


def features_of(node: "NodeState") -> tuple[list[str], list[str]]:
    """(AvailableFeatures, ActiveFeatures) as `scontrol show node -o` prints them ("(null)": none)."""
    fields = node.fields or {}
    available = _features(fields.get("AvailableFeatures", fields.get("Features")))
    active = _features(fields.get("ActiveFeatures", fields.get("AvailableFeatures", fields.get("Features"))))
    return available, active


def marked(node: "NodeState") -> bool:
    return FEATURE in features_of(node)[0]


@dataclass(frozen=True)
class FeatureStep:
    host: str
    mark: bool
    seen: str                  # AvailableFeatures as read (the compare of the compare-and-set)
    available: str
    active: str

    def lines(self) -> list[str]:
        h = shlex.quote(self.host)
        seen = shlex.quote(self.seen)
        update = (f"scontrol update NodeName={h} AvailableFeatures={shlex.quote(self.available)} "
                  f"ActiveFeatures={shlex.quote(self.active)}")
        return [
            f"cur=$(scontrol show node -o {h} | tr ' ' '\\n' | sed -n 's/^AvailableFeatures=//p'); "
            f"if [ \"$cur\" = {seen} ]; then out=$({update} 2>&1); rc=$?; "
            f"else out=\"AvailableFeatures are now $cur, not {self.seen}\"; rc={REFUSED_RC}; fi; "
            f"printf '%s\\n' \"$out\" | sed 's/^/  /'; echo \"{MARK} {self.host} rc=$rc\"",
        ]


def update(node: "NodeState", mark: bool) -> FeatureStep | None:
    """The step that puts mctl's feature on (*mark*) or off the node, keeping every other feature."""
    available, active = features_of(node)
    if (FEATURE in available) == mark and (FEATURE in active) == mark:
        return None
    avail2 = [f for f in available if f != FEATURE] + ([FEATURE] if mark else [])
    active2 = [f for f in active if f != FEATURE] + ([FEATURE] if mark else [])
    seen = (node.fields or {}).get("AvailableFeatures", "(null)")
    return FeatureStep(node.name, mark, seen, ",".join(avail2), ",".join(active2))


def script(steps: Sequence[FeatureStep], limit_s: float | None = None) -> str:
    lines = _bounded_scontrol(limit_s) if limit_s else []
    for step in steps:
        lines += step.lines()
    text = "\n".join(lines) + "\n"
    if limit_s:
        text = text.replace("$(scontrol ", "$(sc ")
    return text


def parse(stdout: str, hosts: Sequence[str]) -> dict[str, StepResult]:
    """Each host's result: done (rc 0), refused (the features changed meanwhile), failed, or unreachable
    (no marker: the script was cut)."""
    out: dict[str, StepResult] = {}
    said: list[str] = []
    for line in stdout.splitlines():
        if line.startswith(MARK + " "):
            parts = line.split()
            host, rc = parts[1], parts[2].removeprefix("rc=") if len(parts) > 2 else "?"
            text = " ".join(s.strip() for s in said).strip()
            status = "done" if rc == "0" else "refused" if rc == str(REFUSED_RC) else "failed"
            out[host] = StepResult(host, status, text or f"rc={rc}")
            said = []
        elif line.startswith("  "):
            said.append(line)
    for h in hosts:
        out.setdefault(h, StepResult(h, "unreachable", "no result from the controller"))
    return out
