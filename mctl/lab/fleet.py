"""Fleet mode (`mctl lab up --fleet`): a lab whose trays are served cheaply, so 64 racks fit on a machine
where the full lab tops out near 30 (docs/lab.md, "Fleet mode").

Per rack, ONE lab host (`hosts/<rack>-fleet/`: the same namespaces, overlay root and init as a full
lab host) runs the rack's sshd listening on every address of the rack (its trays' and its head node's;
OpenSSH listens on at most 16 addresses, so a rack of 18 trays and a head node has two sshd processes). sshd
tells the identities apart by the address the client connected to (`Match LocalAddress`) and runs each
session through FLEET_SESSION, which gives the session the identity's own view in a private mount
and UTS namespace: its hostname, its `/var/lib/mctl-lab` (gpus.json, faults.json: what the GPU, IMEX
and DCGM emulators read) and its `/var/log/kern.log`. Each identity's files live in the rack host's
root under FLEET_STATE/<name>/; `mctl.lab.hosts.host_path` maps a tray's paths there, so `mctl lab
fault gpu`, the NMX-M emulator and status reach the right tray as in the full lab.

Per rack, ONE BMC emulator process (mctl.lab.bmc_emulator with every tray's config) answers as each
tray's BMC on the tray's own BMC address with its own certificate; a fleet tray's power is the BMC's
own state (bmc/power.json), as a switch tray's.

Pure helpers here (names, the sshd drop-in, the session script); control.py starts and stops.
"""

from __future__ import annotations

from mctl.lab.layout import LabHost, LabLayout

# The paths a tray's emulators and tools read (mctl.lab.hosts takes them from here: this module is below it)
STATE_IN_HOST = "/var/lib/mctl-lab"
KERN_LOG = "/var/log/kern.log"
FLEET_STATE = "/var/lib/mctl-fleet"          # in the rack host's root: one folder per identity
FLEET_SESSION = "/usr/lib/mctl-lab/fleet-session"
HOST_SUFFIX = "-fleet"
MAX_STARTUPS = "256:30:1024"                 # one sshd takes the connections of up to 16 hosts at once
MAX_LISTEN = 16                              # OpenSSH's MAX_LISTEN_SOCKS: addresses one sshd can listen on
# OpenSSH (9.8+) charges a client address for its connections that end badly (noauth: closed before
# authenticating, as a connect given up in a storm is) and refuses that address once `min` seconds accrued.
# A real tray's sshd keeps its own account; one sshd here answers as up to MAX_LISTEN hosts, so its account
# gets MAX_LISTEN times the thresholds (the per-event charges are OpenSSH's defaults): the lab does not refuse
# a client before the trays it stands for would. (docs/lab.md "Fleet mode", D124)
PENALTIES = (f"crash:90 authfail:5 noauth:1 grace-exceeded:10 refuseconnection:10 "
             f"max:{600 * MAX_LISTEN} min:{15 * MAX_LISTEN}")


def rack_host(rack: str) -> str:
    """The lab host (hosts/<name>/) that serves every tray and the head node of *rack*."""
    return rack + HOST_SUFFIX


def identities(layout: LabLayout, rack: str) -> list[LabHost]:
    """The hosts *rack*'s sshd answers as: its head node and its compute trays."""
    return [h for h in layout.hosts() if h.rack == rack]


def inner_path(name: str, inner: str) -> str:
    """Where *inner*, as identity *name* sees it in its sessions, lies in the rack host's root."""
    inner = "/" + inner.lstrip("/")
    base = f"{FLEET_STATE}/{name}"
    if inner == STATE_IN_HOST or inner.startswith(STATE_IN_HOST + "/"):
        return base + "/state" + inner[len(STATE_IN_HOST):]
    if inner == KERN_LOG:
        return base + "/kern.log"
    if inner == "/etc/hostname":
        return base + "/hostname"
    return inner


def sshd_config(layout: LabLayout, rack: str) -> str:
    """The rack host's sshd drop-in: every identity's address, and each address's session identity."""
    lines = ["# Written by `mctl lab up --fleet`: the rack's sshd answers as every host of the rack; the address",
             "# a client connected to names the host (mctl/lab/fleet.py). Its addresses are on its command line",
             "# (sshd_argvs: at most 16 an sshd). Not part of the image."]
    hosts_ = identities(layout, rack)
    lines += ["HostKey /etc/ssh/ssh_host_ed25519_key", "PermitRootLogin prohibit-password",
              "PasswordAuthentication no", "KbdInteractiveAuthentication no", "UsePAM no", "UseDNS no",
              f"MaxStartups {MAX_STARTUPS}", f"PerSourcePenalties {PENALTIES}"]
    for h in hosts_:
        lines += [f"Match LocalAddress {h.address}", f"    ForceCommand {FLEET_SESSION} {h.name}"]
    return "\n".join(lines) + "\n"


def sshd_argvs(layout: LabLayout, rack: str) -> list[list[str]]:
    """The rack host's sshd command lines: one sshd for every MAX_LISTEN addresses of the rack (OpenSSH
    listens on at most 16; a rack of 18 trays and a head node has 19), each with its own pid file."""
    addrs = [h.address for h in identities(layout, rack)]
    chunks = [addrs[i:i + MAX_LISTEN] for i in range(0, len(addrs), MAX_LISTEN)]
    return [["/usr/sbin/sshd", "-D", "-e", "-o", f"PidFile=/run/sshd-{n}.pid",
             *[arg for a in chunk for arg in ("-o", f"ListenAddress={a}:22")]]
            for n, chunk in enumerate(chunks, 1)]


# Run by sshd (ForceCommand) for every session: the identity's view, then the client's command (or a
# login shell), whose exit status and output are the session's. A mount that fails ends the session
# with 255, as a refused session does: a tray must never answer with another's state.
SESSION_SCRIPT = r"""#!/bin/sh
# mctl lab fleet mode (mctl/lab/fleet.py): give this SSH session the view of the host it reached.
name=$1
d=@STATE@/$name
case "$name" in ""|*/*|.*) echo "mctl lab fleet: bad host name" >&2; exit 255 ;; esac
[ -d "$d/state" ] || { echo "mctl lab fleet: no host $name here" >&2; exit 255; }
exec unshare --mount --uts --propagation private -- /bin/sh -c '
d=$1; name=$2
mount --bind "$d/hostname" /etc/hostname || exit 255
if [ -e "$d/kern.log" ]; then mount --bind "$d/kern.log" @KERNLOG@ || exit 255; fi
mount --bind "$d/state" @TRAYSTATE@ || exit 255
hostname "$name" || exit 255
shell=/bin/bash; [ -x "$shell" ] || shell=/bin/sh
cd "${HOME:-/root}" 2>/dev/null
if [ -n "${SSH_ORIGINAL_COMMAND+set}" ]; then exec "$shell" -c "$SSH_ORIGINAL_COMMAND"; fi
exec "$shell" -l' mctl-fleet-session "$d" "$name"
""".replace("@STATE@", FLEET_STATE).replace("@TRAYSTATE@", STATE_IN_HOST).replace("@KERNLOG@", KERN_LOG)
