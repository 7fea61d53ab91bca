#!/usr/bin/python3 -IS
"""PID 1 inside a lab host (installed as /usr/lib/mctl-lab/init; stdlib only).

A real host's init starts sshd and keeps it running, and adopts and reaps every
orphan (a daemon that double-forked, a logged-out session's leftovers). This is
that and no more, so 72 trays stay small: it starts the services listed in
/var/lib/mctl-lab/services.json, restarts one that exits (with back-off),
re-reads the list on SIGHUP, and on SIGTERM stops everything in the host's PID
namespace and exits, which ends the namespace and its mounts.

Started through its #! line, so the kernel names the process `init` (as
/proc/1/comm on a real host reads): tools that identify the service manager
by PID 1's name then fall through to the systemd canary below, as they do in
containers that run the systemctl replacement.
"""

import json
import os
import signal
import sys
import time

SERVICES = "/var/lib/mctl-lab/services.json"
RUN_DIR = "/run/mctl-lab"
ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8",
       "HOME": "/root", "TERM": "dumb"}
HANDLED = {signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGHUP}


def log(msg):
    sys.stdout.write(f"mctl-lab-init[{time.strftime('%H:%M:%S')}]: {msg}\n")
    sys.stdout.flush()


class Service:
    def __init__(self, spec):
        self.name = spec["name"]
        self.argv = list(spec["argv"])
        self.dirs = list(spec.get("dirs") or [])
        self.restart = bool(spec.get("restart", True))
        self.log = spec.get("log") or f"/var/log/mctl-lab/{self.name}.log"
        self.pid = None
        self.next_start = 0.0
        self.backoff = 1.0
        self.started = 0.0

    def start(self):
        for d in self.dirs:
            os.makedirs(d, mode=0o755, exist_ok=True)
        os.makedirs(os.path.dirname(self.log), exist_ok=True)
        out = os.open(self.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640)
        pid = os.fork()
        if pid == 0:
            try:
                os.setsid()
                os.dup2(os.open("/dev/null", os.O_RDONLY), 0)
                os.dup2(out, 1)
                os.dup2(out, 2)
                for sig in HANDLED:
                    signal.signal(sig, signal.SIG_DFL)
                signal.pthread_sigmask(signal.SIG_SETMASK, [])
                os.chdir("/")
                os.execve(self.argv[0], self.argv, ENV)
            except OSError as exc:
                os.write(2, f"mctl-lab-init: cannot start {self.name}: {exc}\n".encode())
            os._exit(127)
        os.close(out)
        self.pid = pid
        self.started = time.monotonic()
        _write(os.path.join(RUN_DIR, self.name + ".pid"), f"{pid}\n")
        log(f"started {self.name} (pid {pid})")

    def exited(self, status):
        ran = time.monotonic() - self.started
        self.pid = None
        self.backoff = 1.0 if ran > 10 else min(self.backoff * 2, 30.0)
        self.next_start = time.monotonic() + self.backoff
        log(f"{self.name} exited ({_describe(status)}) after {ran:.1f}s"
            + (f"; restarting in {self.backoff:.0f}s" if self.restart else ""))


def _describe(status):
    if os.WIFSIGNALED(status):
        return f"signal {os.WTERMSIG(status)}"
    return f"status {os.WEXITSTATUS(status)}"


def _write(path, text):
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


def load():
    try:
        with open(SERVICES) as fh:
            return [Service(s) for s in json.load(fh).get("services", [])]
    except (OSError, ValueError) as exc:
        log(f"cannot read {SERVICES}: {exc}")
        return []


def reload(services):
    fresh = {s.name: s for s in load()}
    for name, svc in list(services.items()):
        if name not in fresh or fresh[name].argv != svc.argv:
            if svc.pid:
                os.kill(svc.pid, signal.SIGTERM)
            svc.restart = False
            if name in fresh:
                services[name + "~old"] = services.pop(name)
    for name, svc in fresh.items():
        if name not in services:
            services[name] = svc
            svc.start()


def shutdown(services):
    log("stopping")
    for svc in services.values():
        svc.restart = False
    try:
        os.kill(-1, signal.SIGTERM)     # every process in this PID namespace but init
        os.kill(-1, signal.SIGCONT)     # a stopped process acts on SIGTERM only once continued
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            time.sleep(0.05)
    try:
        os.kill(-1, signal.SIGKILL)
    except ProcessLookupError:
        pass


# Written by `mctl lab fault host --reboot`: from then on every boot of this host starts its enabled
# units, as systemd does at boot (the first boot after `lab up` does not: the playbooks set them up).
BOOT_UNITS = "/var/lib/mctl-lab/boot-units.json"
BOOT_UNITS_SCRIPT = r"""
# $1: GPUs whose device nodes the driver makes at boot (as nvidia-modprobe does); then the units, in order
n=$1; shift; i=0
while [ "$i" -lt "$n" ]; do
  [ -e /dev/nvidia$i ] || mknod -m 0666 /dev/nvidia$i c 195 $i
  i=$((i + 1))
done
[ "$n" -gt 0 ] && { [ -e /dev/nvidiactl ] || mknod -m 0666 /dev/nvidiactl c 195 255; }
for u in "$@"; do
  on=
  for w in /etc/systemd/system/*.wants/"$u"; do [ -e "$w" ] && on=1; done
  [ -n "$on" ] || continue
  echo "boot: starting $u"
  timeout 120 systemctl start "$u" || echo "boot: $u failed to start (exit $?)"
done
"""


def boot_units():
    """The one-shot that makes the GPU device nodes and starts the enabled units of BOOT_UNITS, or None."""
    try:
        with open(BOOT_UNITS) as fh:
            doc = json.load(fh)
        units = [str(u) for u in doc.get("units", [])]
        gpus = int(doc.get("gpus", 0))
    except (OSError, ValueError, AttributeError, TypeError):
        return None
    if not units and not gpus:
        return None
    return Service({"name": "boot-units", "argv": ["/bin/sh", "-c", BOOT_UNITS_SCRIPT, "boot-units", str(gpus), *units],
                    "restart": False})


def main():
    os.makedirs(RUN_DIR, exist_ok=True)
    # The canary that Ansible's service facts and deb-systemd-helper look for: units on this
    # host are driven through `systemctl` (the image's docker-systemctl-replacement).
    os.makedirs("/run/systemd/system", exist_ok=True)
    _write(os.path.join(RUN_DIR, "init.pid"), f"{os.getpid()}\n")
    signal.pthread_sigmask(signal.SIG_BLOCK, HANDLED)
    services = {s.name: s for s in load()}
    for svc in services.values():
        svc.start()
    units = boot_units()
    if units is not None:
        services[units.name] = units
        units.start()
    _write(os.path.join(RUN_DIR, "ready"), "ok\n")
    while True:
        now = time.monotonic()
        waits = [s.next_start - now for s in services.values() if s.pid is None and s.restart]
        timeout = max(0.05, min(waits)) if waits else 60.0
        info = signal.sigtimedwait(HANDLED, timeout)
        if info is not None and info.si_signo in (signal.SIGTERM, signal.SIGINT):
            shutdown(services)
            return 0
        if info is not None and info.si_signo == signal.SIGHUP:
            reload(services)
        while True:             # reap everything: services and adopted orphans
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            for name, svc in list(services.items()):
                if svc.pid == pid:
                    svc.exited(status)
                    if name.endswith("~old"):
                        del services[name]
        now = time.monotonic()
        for svc in services.values():
            if svc.pid is None and svc.restart and now >= svc.next_start:
                svc.start()


if __name__ == "__main__":
    sys.exit(main())
