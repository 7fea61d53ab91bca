"""First process of a lab host, run by `unshare` inside the host's new namespaces.

Runs as PID 1 of the new PID namespace with a private copy of the machine's
mounts, so everything it mounts (the overlay root, a fresh /proc, /sys, a
minimal /dev, tmpfs /run and /tmp, and a new boot id over the kernel's) exists
only for this host and disappears with it. It then chroots into the overlay and execs the host's own init
(/usr/lib/mctl-lab/init, hostinit.py). Executed by path with `python3 -I -S`,
so it uses the standard library only.

Usage: python3 -I -S nsinit.py HOST_JSON
"""

import ctypes
import errno
import json
import os
import socket
import sys
import time
import uuid

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]

# name -> (major, minor): the character devices every Linux userland expects
DEVICES = {"null": (1, 3), "zero": (1, 5), "full": (1, 7), "random": (1, 8), "urandom": (1, 9), "tty": (5, 0)}
LINKS = {"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1",
         "stderr": "/proc/self/fd/2", "ptmx": "pts/ptmx"}


def mount(source, target, fstype, flags=0, data=None):
    rc = _libc.mount(source.encode() if source else None, target.encode(),
                     fstype.encode() if fstype else None, flags, data.encode() if data else None)
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {fstype or source} on {target}: {os.strerror(err)}")


def write_atomic(path, text):
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


def setup(spec):
    root = spec["root"]
    # Nothing mounted from here on may leak back to the machine's namespace.
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    socket.sethostname(spec["hostname"])
    mount_overlay(root, spec)
    mount("proc", os.path.join(root, "proc"), "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    # The kernel is the machine's: a tray's `sysctl -w` must not change the host.
    for sub in ("sys", "sysrq-trigger"):
        path = os.path.join(root, "proc", sub)
        if not os.path.exists(path):
            continue
        mount(path, path, None, MS_BIND)
        mount(None, path, None, MS_BIND | MS_REMOUNT | MS_RDONLY)
    bind_boot_id(root, spec.get("boot_id_file"))
    bind_proc_devices(root, spec.get("proc_devices"))
    mount("sysfs", os.path.join(root, "sys"), "sysfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)
    dev = os.path.join(root, "dev")
    mount("tmpfs", dev, "tmpfs", MS_NOSUID, "mode=755,size=64k")
    old = os.umask(0)
    try:
        for name, (major, minor) in DEVICES.items():
            os.mknod(os.path.join(dev, name), 0o20666, os.makedev(major, minor))
        for name, target in LINKS.items():
            os.symlink(target, os.path.join(dev, name))
        for name, mode in (("pts", 0o755), ("shm", 0o1777)):
            os.mkdir(os.path.join(dev, name), mode)
    finally:
        os.umask(old)
    mount("devpts", os.path.join(dev, "pts"), "devpts", MS_NOSUID | MS_NOEXEC,
          "newinstance,ptmxmode=0666,mode=0620,gid=5")
    mount("tmpfs", os.path.join(dev, "shm"), "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777,size=64m")
    mount("tmpfs", os.path.join(root, "run"), "tmpfs", MS_NOSUID | MS_NODEV, "mode=755,size=32m")
    mount("tmpfs", os.path.join(root, "tmp"), "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777,size=256m")
    os.chroot(root)
    os.chdir("/")


def mount_overlay(root, spec):
    """The host's root. Right after a reboot the previous boot's overlay may still be going away
    (the kernel tears a mount namespace down after its last process): retry while its layers are busy."""
    data = f"lowerdir={spec['lower']},upperdir={spec['upper']},workdir={spec['work']}"
    deadline = time.monotonic() + 15
    while True:
        try:
            mount("overlay", root, "overlay", 0, data)
            return
        except OSError as exc:
            if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def bind_boot_id(root, path):
    """A new boot id for every boot of the host: the kernel's own is the machine's, read-only over it."""
    if not path:
        return
    write_atomic(path, str(uuid.uuid4()) + "\n")
    target = os.path.join(root, "proc/sys/kernel/random/boot_id")
    mount(path, target, None, MS_BIND)
    mount(None, target, None, MS_BIND | MS_REMOUNT | MS_RDONLY)


def free_char_major(taken):
    """The major the kernel would hand a driver that asks for a dynamic one (alloc_chrdev_region):
    the highest free of 254..234, then of 511..384."""
    for major in list(range(254, 233, -1)) + list(range(511, 383, -1)):
        if major not in taken:
            return major
    raise OSError("no free character device major for the lab's /proc/devices")


def proc_devices_text(text, names):
    """The machine's /proc/devices with a line `MAJOR NAME` added under "Character devices:" for each
    of *names*, in major order, as a loaded driver's registration (register_chrdev) shows there."""
    char, rest, section = [], [], None
    for line in text.splitlines():
        if line.endswith(":"):
            section = line
            (char if section == "Character devices:" else rest).append(line)
            continue
        (char if section == "Character devices:" else rest).append(line)
    entries = []
    for line in char[1:]:
        parts = line.split(None, 1)
        if len(parts) == 2 and parts[0].isdigit():
            entries.append((int(parts[0]), parts[1]))
    for name in names:
        if any(n == name for _, n in entries):
            continue
        entries.append((free_char_major({m for m, _ in entries}), name))
    entries.sort(key=lambda e: e[0])      # stable: names sharing a major keep their order
    lines = ["Character devices:"] + [f"{m:3d} {n}" for m, n in entries] + [""]
    tail = rest if rest and rest[0] else rest[1:]
    return "\n".join(lines + tail).rstrip("\n") + "\n"


def bind_proc_devices(root, spec):
    """/proc/devices as the host sees it: the machine's, plus the character devices of the drivers the
    host emulates (a tray: nvidia-caps-imex-channels, which the NVIDIA driver registers and Slurm's
    switch/nvidia_imex and the IMEX prolog read), bound read-only over the host's /proc/devices.
    Fixed at boot: a driver the machine loads later does not appear in the host's view."""
    if not spec or not spec.get("char"):
        return
    target = os.path.join(root, "proc/devices")
    with open(target) as fh:
        text = fh.read()
    write_atomic(spec["file"], proc_devices_text(text, [str(n) for n in spec["char"]]))
    mount(spec["file"], target, None, MS_BIND)
    mount(None, target, None, MS_BIND | MS_REMOUNT | MS_RDONLY)


def main(argv):
    with open(argv[1]) as fh:
        spec = json.load(fh)
    # /proc is still the machine's here, so /proc/self names this process as the
    # machine sees it: that is the pid `lab down` and `lab status` need.
    write_atomic(spec["pidfile"], os.readlink("/proc/self") + "\n")
    setup(spec)
    init = spec["init"]
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8", "HOME": "/root"}
    os.execve(init[0], init, env)


if __name__ == "__main__":
    try:
        main(sys.argv)
    except OSError as exc:
        sys.stderr.write(f"mctl-lab nsinit: {exc}\n")
        sys.exit(1)
