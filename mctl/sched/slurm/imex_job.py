"""Per-job IMEX scope: the Slurm prolog and epilog that build an IMEX domain for each exclusive job.

The alternative to static per-partition domains (imex.py). The prolog runs as
root on every node of a job (slurm.conf needs `PrologFlags=Alloc` so it runs at
allocation on all nodes at once). For exclusive jobs only, since restarting
IMEX would break another job's memory imports, it writes the job's node
addresses (Slurm's NodeAddr, sorted by node name so every node writes the same
list), creates channel0 and restarts the daemon, then waits for the domain to be
UP. The epilog empties the node list, stops the daemon and removes channel0.
Between jobs a tray's IMEX config names an empty node list: the health probe
reads that as no domain wanted (not checked).

Both always exit 0: a failing prolog or epilog drains the node in Slurm, and an
IMEX domain that did not form is a job problem the health checks report, not a
reason to take trays out of service. Both log through logger(1) with tag
`mctl-imex`.

A Slurm deployment's file (slurm.conf names the scripts, `mctl deploy slurm` installs them
under scheduler.slurm.conf_dir), so it lives with Slurm; the IMEX daemon's settings and its
config.cfg text come from mctl.model.imex, the same ones the static domains write
(docs/decisions.md D60).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from mctl.model.fabric import ImexDomain, ImexMember
from mctl.model.imex import CONFIG_FILE, NODES_CONFIG_FILE, ImexSettings, render_config

# Where the Slurm deployment installs the scripts, under scheduler.slurm.conf_dir (slurm.conf names them).
PROLOG_NAME = "prolog.d/90-mctl-imex.sh"
EPILOG_NAME = "epilog.d/90-mctl-imex.sh"


@dataclass(frozen=True)
class JobScopeSettings:
    nodes_config: str = NODES_CONFIG_FILE
    imex_config: str = CONFIG_FILE
    scontrol: str = "scontrol"
    imex_ctl: str = "nvidia-imex-ctl"
    restart: str = "systemctl restart nvidia-imex"
    stop: str = "systemctl stop nvidia-imex"
    ready_timeout_s: int = 60

    @classmethod
    def from_imex(cls, imex: ImexSettings) -> "JobScopeSettings":
        """The site's vars.imex: the node list the daemon reads and how it is restarted."""
        return cls(nodes_config=imex.node_config_file, restart=imex.restart_command)


_COMMON = r'''NODES_CONFIG=@@NODES_CONFIG@@
IMEX_CONFIG=@@IMEX_CONFIG@@
SCONTROL=@@SCONTROL@@
IMEX_CTL=@@IMEX_CTL@@
CHANNEL_DIR=/dev/nvidia-caps-imex-channels

log() {
    logger -t mctl-imex -- "@@WHAT@@ job ${SLURM_JOB_ID:-?}: $*" 2>/dev/null \
        || echo "mctl-imex: @@WHAT@@ job ${SLURM_JOB_ID:-?}: $*" >&2
}

# Exclusive jobs only: Slurm sets SLURM_JOB_OVERSUBSCRIBE in the prolog/epilog
# environment (NO, or TOPO for --exclusive=topo); older Slurm: ask scontrol.
exclusive() {
    case "${SLURM_JOB_OVERSUBSCRIBE:-}" in
        NO|TOPO) return 0 ;;
        "") "$SCONTROL" show job -o "${SLURM_JOB_ID:-}" 2>/dev/null | grep -Eq '(^| )OverSubscribe=(NO|TOPO)( |$)' ;;
        *) return 1 ;;
    esac
}

write_nodes_config() {
    local tmp
    tmp=$(mktemp "${NODES_CONFIG}.XXXXXX") || return 1
    printf '%s' "$1" > "$tmp" && chmod 644 "$tmp" && mv -f "$tmp" "$NODES_CONFIG" || { rm -f "$tmp"; return 1; }
}

[ -n "${SLURM_JOB_ID:-}" ] || { log "not started by Slurm (no SLURM_JOB_ID); nothing done"; exit 0; }
if ! exclusive; then
    log "job is not exclusive; IMEX left as it is"
    exit 0
fi
'''

_PROLOG = r'''#!/bin/bash
# mctl: IMEX per-job scope, Slurm prolog. Rendered by 'mctl imex render --scope job'; do not edit by hand.
# For an exclusive job: write the job's node addresses into nodes_config.cfg (sorted by node name, so
# every node writes the same list), create IMEX channel0, restart the daemon, wait for the domain.
# Always exits 0 (a failing prolog would drain the node).
set -u
READY_TIMEOUT=@@READY_TIMEOUT@@
RESTART=(@@RESTART@@)
''' + _COMMON + r'''
nodelist=${SLURM_JOB_NODELIST:-${SLURM_NODELIST:-}}
[ -n "$nodelist" ] || { log "no SLURM_JOB_NODELIST; nothing done"; exit 0; }
addresses=$("$SCONTROL" show node -o "$nodelist" 2>/dev/null \
    | sed -n 's/^NodeName=\([^ ]*\) .*NodeAddr=\([^ ]*\).*/\1 \2/p' | LC_ALL=C sort -V -k1,1 | awk '{print $2}')
if [ -z "$addresses" ]; then
    log "scontrol returned no NodeAddr for $nodelist; IMEX left as it is"
    exit 0
fi
write_nodes_config "$addresses"$'\n' || { log "cannot write $NODES_CONFIG"; exit 0; }

major=$(awk '$2 == "nvidia-caps-imex-channels" {print $1}' /proc/devices 2>/dev/null)
if [ -n "$major" ]; then
    mkdir -p "$CHANNEL_DIR"
    [ -e "$CHANNEL_DIR/channel0" ] || mknod -m 666 "$CHANNEL_DIR/channel0" c "$major" 0 \
        || log "cannot create $CHANNEL_DIR/channel0"
else
    log "no nvidia-caps-imex-channels in /proc/devices; channel0 not created"
fi

"${RESTART[@]}" || log "restarting the IMEX daemon failed: ${RESTART[*]}"

deadline=$((SECONDS + READY_TIMEOUT))
while :; do
    if "$IMEX_CTL" -c "$IMEX_CONFIG" -N 2>/dev/null | grep -q '^Domain State: UP'; then
        log "IMEX domain UP: $(echo $addresses)"
        exit 0
    fi
    [ "$SECONDS" -lt "$deadline" ] || break
    sleep 1
done
log "IMEX domain not UP after ${READY_TIMEOUT}s (daemon: $("$IMEX_CTL" -c "$IMEX_CONFIG" -q 2>/dev/null || echo no answer))"
exit 0
'''

_EPILOG = r'''#!/bin/bash
# mctl: IMEX per-job scope, Slurm epilog. Rendered by 'mctl imex render --scope job'; do not edit by hand.
# Undoes the prolog for an exclusive job: empties nodes_config.cfg (first: a node check that runs meanwhile
# then expects no daemon), stops the daemon, removes channel0.
# Always exits 0 (a failing epilog would drain the node).
set -u
STOP=(@@STOP@@)
''' + _COMMON + r'''
write_nodes_config "" || log "cannot empty $NODES_CONFIG"
"${STOP[@]}" || log "stopping the IMEX daemon failed: ${STOP[*]}"
rm -f "$CHANNEL_DIR/channel0" || log "cannot remove $CHANNEL_DIR/channel0"
log "IMEX job scope removed"
exit 0
'''


def _fill(template: str, values: dict[str, str]) -> str:
    out = template
    for key, value in values.items():
        out = out.replace(f"@@{key}@@", value)
    if "@@" in out:
        raise ValueError("unfilled placeholder in IMEX job script template")
    return out


def _values(settings: JobScopeSettings, what: str) -> dict[str, str]:
    return {"NODES_CONFIG": shlex.quote(settings.nodes_config), "IMEX_CONFIG": shlex.quote(settings.imex_config),
            "SCONTROL": shlex.quote(settings.scontrol), "IMEX_CTL": shlex.quote(settings.imex_ctl),
            "READY_TIMEOUT": str(int(settings.ready_timeout_s)), "WHAT": what,
            "RESTART": " ".join(shlex.quote(w) for w in shlex.split(settings.restart)),
            "STOP": " ".join(shlex.quote(w) for w in shlex.split(settings.stop))}


def render_prolog(settings: JobScopeSettings = JobScopeSettings()) -> str:
    return _fill(_PROLOG, _values(settings, "prolog"))


def render_epilog(settings: JobScopeSettings = JobScopeSettings()) -> str:
    return _fill(_EPILOG, _values(settings, "epilog"))


def render_job_config(settings: ImexSettings, rack: str, tray: str, address: str) -> str:
    """config.cfg of *tray* under the per-job scope: the same keys as a static domain's, bound to the
    tray's address; the node list it names is written by the prolog and emptied by the epilog."""
    text = render_config(settings, ImexMember(tray, address), ImexDomain("per-job", rack, (ImexMember(tray, address),)))
    first, rest = text.split("\n", 1)
    return (f"# nvidia-imex configuration for {tray} of rack {rack}, IMEX per-job scope (Slurm prolog/epilog).\n"
            + rest.replace("edits are overwritten by 'mctl imex apply'", "edits are overwritten by 'mctl deploy slurm'"))
