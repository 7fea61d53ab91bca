"""The recovery ladder's GPU reset as NVIDIA documents it (nvidia-smi -r/--gpu-reset), on the tray in one command.

nvidia-smi's manual: a reset needs root and no application using the GPUs (a CUDA program, a monitoring
program, a daemon holding the device open: nvidia-persistenced with persistence mode on is one), and
GPUs connected by NVLink are reset in the same command. A reset that ignores this fails with "In use by
another client" or leaves persistence mode off behind it (the failure other tools are known for). So the
script, for the set of GPUs given:

1. asks which compute processes hold those GPUs (`--query-compute-apps`) and refuses, naming each
   (PID and name), when any does; nothing is changed;
2. turns persistence mode off on each of them that has it on (`-pm 0`), remembering which;
3. resets them all in one `--gpu-reset -i A,B,...` under its deadline;
4. turns persistence mode back on where it was on (also when the reset failed);
5. verifies: every GPU enumerates again with persistence mode as it was.

On a GB200 or GB300 tray the set is every GPU of the tray (mctl.health.ladder.reset_scope says so): its
GPUs share the Grace CPU's coherent NVLink-C2C memory and the rack's NVLink fabric, so one GPU is not
reset on its own. Every step prints a marker line; `parse` reads them back (pure).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

MARK = "@@mctl-reset"
RC_BUSY = 11


def script(gpus: tuple[str, ...], deadline_s: float) -> str:
    """The POSIX sh program that resets *gpus* (PCI bus ids as nvidia-smi prints them) together."""
    ids = ",".join(gpus)
    padded = " " + " ".join(gpus) + " "
    per = max(10, int(deadline_s))
    return f"""T={shlex.quote(padded)}
M={MARK}
q() {{ timeout -k 2 20 nvidia-smi "$@"; }}
apps=$(q --query-compute-apps=gpu_bus_id,pid,process_name --format=csv,noheader 2>&1) || {{
  echo "$M error query-compute-apps exit $?: $(printf '%s' "$apps" | tail -n 1)"; exit 10; }}
busy=0
while IFS=', ' read -r bus pid name; do
  case "$T" in *" $bus "*) echo "$M busy $bus $pid $name"; busy=1;; esac
done <<EOF_APPS
$apps
EOF_APPS
[ "$busy" = 0 ] || exit {RC_BUSY}
pm=$(q --query-gpu=pci.bus_id,persistence_mode --format=csv,noheader 2>&1) || {{
  echo "$M error query-gpu exit $?: $(printf '%s' "$pm" | tail -n 1)"; exit 12; }}
on=
while IFS=', ' read -r bus mode; do
  case "$T" in *" $bus "*) [ "$mode" = Enabled ] && on="$on $bus";; esac
done <<EOF_PM
$pm
EOF_PM
rc=0
for b in $on; do
  if q -i "$b" -pm 0 >/dev/null 2>&1; then echo "$M pm-off $b"; else echo "$M pm-off-failed $b"; rc=13; fi
done
if [ "$rc" = 0 ]; then
  said=$(timeout -k 2 {per} nvidia-smi --gpu-reset -i {shlex.quote(ids)} 2>&1); r=$?
  echo "$M reset exit $r"
  printf '%s\\n' "$said" | while IFS= read -r l; do [ -z "$l" ] || echo "$M said $l"; done
  [ "$r" = 0 ] || rc=14
fi
for b in $on; do
  if q -i "$b" -pm 1 >/dev/null 2>&1; then echo "$M pm-on $b"; else echo "$M pm-on-failed $b"; rc=15; fi
done
after=$(q --query-gpu=pci.bus_id,persistence_mode --format=csv,noheader 2>&1)
for b in $T; do
  line=$(printf '%s\\n' "$after" | grep -F "$b," | head -n 1)
  if [ -z "$line" ]; then echo "$M verify missing $b"; [ "$rc" != 0 ] || rc=16; continue; fi
  mode=${{line##*, }}
  case " $on " in *" $b "*) [ "$mode" = Enabled ] || {{ echo "$M verify persistence-off $b"; [ "$rc" != 0 ] || rc=16; }};; esac
done
[ "$rc" = 0 ] && echo "$M verified"
exit $rc
"""


@dataclass
class ResetResult:
    status: str                                        # ok | refused | failed
    busy: list[tuple[str, str, str]] = field(default_factory=list)     # (GPU, PID, process name)
    persistence_off: list[str] = field(default_factory=list)
    persistence_restored: list[str] = field(default_factory=list)
    said: list[str] = field(default_factory=list)      # what nvidia-smi --gpu-reset printed
    problems: list[str] = field(default_factory=list)
    verified: bool = False

    @property
    def text(self) -> str:
        if self.status == "refused":
            return "refused: processes hold the GPUs: " + ", ".join(f"{g} pid {p} {n}".rstrip() for g, p, n in self.busy)
        parts = []
        if self.persistence_off:
            parts.append(f"persistence mode off on {len(self.persistence_off)}, restored on "
                         f"{len(self.persistence_restored)}")
        parts += self.problems
        if self.said:
            parts.append("nvidia-smi: " + " / ".join(self.said[-3:]))
        if self.verified:
            parts.append("verified: every GPU back" + (" with persistence mode on" if self.persistence_off else ""))
        return "; ".join(parts) or self.status


def parse(stdout: str, exit_code: int | None) -> ResetResult:
    """The script's marker lines -> what happened (a missing marker is a problem, never a success)."""
    r = ResetResult("failed")
    for line in stdout.splitlines():
        if not line.startswith(MARK + " "):
            continue
        word, _, rest = line[len(MARK) + 1:].partition(" ")
        if word == "busy":
            bus, _, more = rest.partition(" ")
            pid, _, name = more.partition(" ")
            r.busy.append((bus, pid, name))
        elif word == "pm-off":
            r.persistence_off.append(rest)
        elif word == "pm-on":
            r.persistence_restored.append(rest)
        elif word == "said":
            r.said.append(rest)
        elif word == "verified":
            r.verified = True
        elif word in ("error", "pm-off-failed", "pm-on-failed", "verify"):
            r.problems.append(f"{word} {rest}".strip())
        elif word == "reset" and rest != "exit 0":
            r.problems.append(f"nvidia-smi --gpu-reset {rest}")
    if r.busy or exit_code == RC_BUSY:
        r.status = "refused"
    elif exit_code == 0 and r.verified and not r.problems:
        r.status = "ok"
    elif exit_code is None:
        r.problems.append("no exit status (the tray went away under the command)")
    return r
