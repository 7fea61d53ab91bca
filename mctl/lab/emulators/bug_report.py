#!/usr/bin/python3
"""nvidia-bug-report.sh for the trays of the mctl virtual rack (the driver's log collector).

Installed by the lab's nvidia-utils package as /usr/bin/nvidia-bug-report.sh. As NVIDIA documents
the real script, it "collects debug logs and command outputs from the system, including kernel
logs" into "a single compressed text file, nvidia-bug-report.log.gz" in the current directory
(`--output-file FILE` writes FILE.gz); it must run as root. This one writes what the lab has: the
date, uname, the tray's gpus.json and faults.json, `nvidia-smi -q` as the emulator answers it, and
the kernel log's tail. The stdout banner is the lab's wording. `tool_faults["nvidia-bug-report.sh"]`
(hang, crash, garbage, truncated) makes it misbehave (nvidia_smi.misbehave); truncated leaves a gzip file
cut in half.
"""

from __future__ import annotations

import gzip
import io
import os
import sys
import time

LIB = os.path.dirname(os.path.abspath(__file__))
if LIB not in sys.path:
    sys.path.insert(0, LIB)

TOOL = "nvidia-bug-report.sh"
KERN_LOG = "/var/log/kern.log"
KERN_TAIL = 200_000


def _section(title, body):
    return "\n____________________________________________\n\n%s\n\n%s\n" % (title, body)


def report_text(env=None):
    import nvidia_smi as smi

    env = os.environ if env is None else env
    parts = ["____________________________________________",
             "Start of NVIDIA bug report log file (the mctl lab's stand-in).",
             "",
             "nvidia-bug-report.sh Version: mctl-lab",
             "Date: " + time.strftime("%a %b %d %H:%M:%S %Z %Y"),
             "uname: " + " ".join(os.uname())]
    text = "\n".join(parts) + "\n"
    for title, path in (("gpus.json", env.get(smi.STATE_ENV) or smi.STATE_PATH),
                        ("faults.json", env.get(smi.FAULTS_ENV) or smi.FAULTS_PATH)):
        try:
            with open(path) as fh:
                text += _section(title, fh.read())
        except OSError as exc:
            text += _section(title, "not readable: %s" % exc)
    out, err = io.StringIO(), io.StringIO()
    try:
        rc = smi.main(["-q"], env=env, stdout=out, stderr=err)
    except Exception as exc:  # noqa: BLE001 - the report says what failed, as the real script does
        rc, out = 1, io.StringIO("nvidia-smi failed: %s" % exc)
    text += _section("/usr/bin/nvidia-smi -q (exit %d)" % rc, out.getvalue() + err.getvalue())
    try:
        with open(KERN_LOG, "rb") as fh:
            fh.seek(0, 2)
            fh.seek(max(0, fh.tell() - KERN_TAIL))
            text += _section(KERN_LOG + " (tail)", fh.read().decode("utf-8", "replace"))
    except OSError as exc:
        text += _section(KERN_LOG, "not readable: %s" % exc)
    return text + "\n____________________________________________\n\nEnd of NVIDIA bug report log file.\n"


def _args(argv):
    out = "nvidia-bug-report.log"
    i = 0
    while i < len(argv):
        if argv[i] == "--output-file" and i + 1 < len(argv):
            out = argv[i + 1]
            i += 2
        elif argv[i] in ("--safe-mode", "--extra-system-data"):
            i += 1
        else:
            raise ValueError(argv[i])
    return out[:-3] if out.endswith(".gz") else out


def main(argv=None, env=None, stdout=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    stdout = stdout or sys.stdout
    from nvidia_smi import misbehave, tool_fault
    import nvidia_smi as smi

    try:
        name = _args(argv)
    except ValueError as exc:
        stdout.write("\nnvidia-bug-report.sh: unknown option '%s'\n\nUsage: nvidia-bug-report.sh [OPTION]...\n"
                     "    --output-file FILE   Write output to FILE.gz (default: nvidia-bug-report.log.gz).\n"
                     % exc)
        return 1
    if os.geteuid() != 0:
        stdout.write("ERROR: Please run nvidia-bug-report.sh as root.\n")
        return 1
    banner = ("\nnvidia-bug-report.sh will now collect information about your system and create the file\n"
              "'%s.gz' in the current directory (the mctl lab's stand-in of NVIDIA's script).\n\n" % name)
    stdout.write(banner)
    stdout.flush()
    try:
        _state, faults = smi.load(env)
    except smi.DriverMissing:
        faults = {}
    data = gzip.compress(report_text(env).encode(), mtime=0)
    mode = tool_fault(faults, TOOL)
    if mode:
        bad = misbehave(mode, TOOL, banner, env, stdout)
        if mode == "garbage":
            data = (bad or "").encode("utf-8", "replace")
        elif mode == "truncated":
            data = data[: len(data) // 2]
    with open(name + ".gz", "wb") as fh:
        fh.write(data)
    stdout.write("Running nvidia-bug-report.sh... complete.\n\nThe file %s.gz has been created.\n" % name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
