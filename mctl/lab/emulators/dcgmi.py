#!/usr/bin/python3
"""dcgmi (DCGM 4) for the trays of the mctl virtual rack: `diag -r 1|2|3 [-j]`, `health -s|-c [-j]`, `-v`, and
from DCGM 4.3 `mndiag --hostList 'h1;h2;...' [--run mnubergemm] [--json]` (MNDIAG below).

Installed by the lab's package datacenter-gpu-manager-4-core as /usr/bin/dcgmi; it runs under the
tray's /usr/bin/python3 with the standard library and the lab's nvidia-smi emulator module (installed
by nvidia-utils, as DCGM needs the driver's NVML). Every call reads the tray's gpus.json and faults.json
through that module, so its results follow the lab's faults as a real diagnostic's would:

  ecc_uncorrectable {g: n}   software (row remap pending) fails on GPU g; at -r 2 and 3 so does memory
  nvlink_down / all down     pcie (DCGM checks the NVLinks there) fails on the GPU with the link down
  fell_off_bus / xid 79      every test fails on the lost GPU
  gpu_missing                the GPU is not in the results at all (DCGM never saw it)
  tool_faults.dcgmi          hang | crash | garbage | truncated: the tool itself misbehaves

The JSON is DCGM 4's (`dcgmi diag -j`, 4.2.3 and 4.5.2 alike): "DCGM Diagnostic" -> test_categories
[{category, tests: [{name, results: [{entity_group, entity_group_id, entity_id, status, info|warnings}],
test_summary: {status}}]}], entity_groups, metadata {"Driver Version Detected", version}, written the
way jsoncpp writes it (tab indent, `"key" : value`, keys sorted): tests/fixtures/real/
glimmer-dcgm-4.5.2-diag-r2-gb10.json. dcgmi exits 226 when a test failed, as the real one does.

Its version is the tray's package's (datacenter-gpu-manager-4-core in /var/lib/dpkg/status, as dpkg and
mctl.facts.packages read it; VERSION when dpkg knows none): `-v` prints it, and `mndiag` exists from 4.3.

MNDIAG, the multi-node diagnostic (DCGM >= 4.3). The real one: dcgmi asks the head node's host engine,
which connects to every host's engine and launches mnubergemm on them through MPI (docs.nvidia.com,
"Multi-Node Diagnostics"). The lab's: run inside a Slurm job (SLURM_JOB_ID, as `mctl rack validate` runs it:
salloc of the block, one step on the first tray), the head launches one worker on every host of the list
with `srun --overlap --jobid=$SLURM_JOB_ID` (as Open MPI launches its ranks inside a Slurm allocation);
each worker reports its tray's GPUs under the tray's faults, and the head prints one response:
  nvlink_down / all down     mnubergemm Fail on that GPU ("GPU g's NvLink link L is currently down")
  fell_off_bus / xid 79      Fail on the lost GPU ("GPU g is lost ...")
  ecc_uncorrectable {g: n}   Fail on GPU g ("Detected n volatile double-bit ECC error(s) in GPU g.")
  gpu_missing                the GPU is absent from the host's results
  a host not reached         the run does not complete: "runtime_error", exit 253 (the lab's words)
  tool_faults.dcgmi          on the head: hang | crash | garbage | truncated, as for diag
The host-spec grammar is the real one (host, host:port, host:unix:///path, each optionally =gpu-list of
ids and ranges or *; at most 72; a host and transport at most once). The JSON follows dcgmi's contract,
from the source (NVIDIA/DCGM dcgmi/MnDiag.cpp at commit 1477d8785e899ab3450fdff2b486102e9bed096b,
HelperJsonBuildOutput, and dcgmi/tests/TestMnDiag.cpp; key names from nvvs/include/NvvsJsonStrings.h), not a
capture; it is printed as jsoncpp's toStyledString lays it out (3-space indent, `"key" : value`, sorted
keys), approximately. The text form follows HelperDisplayAsCli's rows. A completed run exits 0 whatever
its result, as dcgmi does (RunStartMnDiag returns the display's status). The messages are the lab's model.
"""

from __future__ import annotations

import os
import re
import sys

LIB = os.path.dirname(os.path.abspath(__file__))
if not __package__ and LIB not in sys.path:       # run on a tray (not imported by mctl for LAUNCHER's text)
    sys.path.insert(0, LIB)

VERSION = "4.3.1"           # when dpkg knows no DCGM package on the tray (tests; an unpackaged install)
PACKAGE = "datacenter-gpu-manager-4-core"
DPKG_STATUS = "/var/lib/dpkg/status"
MNDIAG_FROM = (4, 3)
MNDIAG_MAX_HOSTS = 72
MNDIAG_WORKERS_S = 60.0      # how long the head waits for every host's worker (the lab's engine timeout)
MNDIAG_NAME = "DCGM Multi-Node Diagnostic"
# /usr/bin/dcgmi on a lab tray (@LIB@: where this module is installed). Every health sweep asks each tray
# for `health -c -j`, whose answer depends only on gpus.json, faults.json and the watches file, so the
# emulator stores the answer it gives with the key the launcher computed before calling it (the device,
# inode, size, mtime and ctime of the three files; see nvidia_smi.LAUNCHER) and the launcher replays it
# while the key holds: a few ms of a tray's CPU instead of a ~20 ms Python start per sweep, as a real
# dcgmi is a small client of the host engine. Not stored while a tool fault or a time-dependent fault is
# set. Replay file: key, exit status, then stdout.
REPLAY_FILE_ENV = "MCTL_LAB_DCGMI_REPLAY"
REPLAY_KEY_ENV = "MCTL_LAB_DCGMI_KEY"
LAUNCHER = r"""#!/bin/sh
# Written by `mctl lab up`: dcgmi of the lab, emulated by @LIB@/dcgmi.py (mctl/lab/emulators): see LAUNCHER
# there for the replay of unchanged `health -c -j` answers.
S=${MCTL_LAB_GPU_STATE:-/var/lib/mctl-lab/gpus.json}
F=${MCTL_LAB_FAULTS:-/var/lib/mctl-lab/faults.json}
if [ "$*" = "health -c -j" ] && [ -e "$S" ]; then
  W=${S%/*}/dcgm-health-watches
  k=$(stat -L --printf '%d:%i:%s:%.9Y:%.9Z;' "$S" "$F" "$W" 2>/dev/null)
  R=${S%/*}/.dcgmi.health-c-j
  if [ -n "$k" ] && [ -r "$R" ]; then
    {
      if IFS= read -r v && [ "$v" = "$k" ] && IFS= read -r rc; then
        cat
        exit "$rc"
      fi
    } < "$R"
  fi
  [ -z "$k" ] || export MCTL_LAB_DCGMI_REPLAY="$R" MCTL_LAB_DCGMI_KEY="$k"
fi
exec /usr/bin/python3 -IS -c 'import sys; sys.path.insert(0, "@LIB@"); import dcgmi; sys.exit(dcgmi.main())' "$@"
"""
EXIT_FAILED = 226           # DCGM_ST_NVVS_ERROR as dcgmi's exit status (an unsigned -30)
DEVICE_ID = "2941"          # GB200's PCI device id (as nvidia-smi's lab emulator uses)
TOOL = "dcgmi"

# (category, test) per level, in the order DCGM 4 runs them
LEVEL_TESTS = {
    1: [("Deployment", "software")],
    2: [("Deployment", "software"), ("Integration", "pcie"), ("Hardware", "memory")],
    3: [("Deployment", "software"), ("Integration", "pcie"), ("Hardware", "memory"), ("Hardware", "diagnostic"),
        ("Stress", "targeted_stress"), ("Stress", "targeted_power"), ("Stress", "memory_bandwidth")],
}
USAGE = ("dcgmi -- Command Line Interface for the NVIDIA Data Center GPU Manager (the mctl lab's).\n"
         "Usage: dcgmi diag -r 1|2|3 [-j]   dcgmi health -s a | -c [-j]   dcgmi -v\n"
         "       dcgmi mndiag --hostList <host-spec>[;<host-spec>...] [--run mnubergemm] [--json]  (DCGM >= 4.3)\n")


# What dcgmi prints when it cannot reach nv-hostengine (here: the driver is missing), for every subcommand.
NO_HOST_ENGINE = ("Error: unable to establish a connection to the specified host: localhost\n"
                  "Error: Unable to connect to host engine. Host engine connection invalid/disconnected.\n")


def version(path=None):
    """The tray's DCGM version: its package's upstream version in dpkg's status file, else VERSION."""
    try:
        with open(path or DPKG_STATUS, encoding="utf-8", errors="replace") as fh:
            text = fh.read()
    except OSError:
        return VERSION
    for stanza in text.split("\n\n"):
        fields = {}
        for line in stanza.splitlines():
            key, sep, value = line.partition(":")
            if sep and not line.startswith(" "):
                fields[key.strip()] = value.strip()
        if fields.get("Package") == PACKAGE and " installed" in " " + fields.get("Status", ""):
            v = fields.get("Version", "")
            v = v.split(":", 1)[1] if ":" in v.split("-")[0] else v
            return v.rsplit("-", 1)[0] if "-" in v else v
    return VERSION


def has_mndiag(ver):
    try:
        major, minor = (int(x) for x in ver.split(".")[:2])
    except ValueError:
        return False
    return (major, minor) >= MNDIAG_FROM


def _smi():
    import nvidia_smi            # the lab's driver emulator: gpus.json, faults.json, GpuView
    return nvidia_smi


# --- the JSON, as dcgmi's jsoncpp writer prints it ---------------------------------------------

def _dump(value, level=0):
    """Tab indent, `"key" : value`, keys sorted, a non-empty container on the line after its key."""
    ind = "\t" * level
    if isinstance(value, (dict, list)) and value:
        if isinstance(value, dict):
            items = [(k, value[k]) for k in sorted(value)]
            open_, close = "{", "}"
        else:
            items = [(None, v) for v in value]
            open_, close = "[", "]"
        parts = []
        for key, child in items:
            head = ind + "\t" + ("" if key is None else _str(key) + " : ")
            if key is not None and isinstance(child, (dict, list)) and child:
                parts.append(head + "\n" + ind + "\t" + _dump(child, level + 1))
            else:
                parts.append(head + _dump(child, level + 1))
        return open_ + "\n" + ",\n".join(parts) + "\n" + ind + close
    if isinstance(value, dict):
        return "{}"
    if isinstance(value, list):
        return "[]"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    return _str(value)


def _str(text):
    out = ['"']
    for ch in str(text):
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\n":
            out.append("\\n")
        elif ord(ch) < 0x20:
            out.append("\\u%04x" % ord(ch))
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def dumps(doc):
    return _dump(doc) + "\n"


# --- the diagnostic --------------------------------------------------------------------------

def _result(gpu_id, status, info=None, warning=None):
    r = {"entity_group": "GPU", "entity_group_id": 1, "entity_id": gpu_id, "status": status}
    if info:
        r["info"] = list(info)
    if warning:
        r["warnings"] = [{"warning": w} for w in warning]
    return r


def judge_gpu(g, test):
    """(status, info, warnings) of *test* on GpuView *g*."""
    if g.lost:
        return "Fail", None, [f"GPU {g.index} is lost: the GPU has fallen off the bus or is otherwise "
                              f"inaccessible (PCI {g.kernel_bus}); NVML returned GPU_IS_LOST."]
    if test == "software" and g.dram_unc:
        return "Fail", None, [f"GPU {g.index} had uncorrectable memory errors and row remapping is pending. "
                              "Run nvidia-smi -r to reset the GPU."]
    if test == "memory" and g.dram_unc:
        return "Fail", None, [f"Detected {g.dram_unc} volatile double-bit ECC error(s) in GPU {g.index}."]
    if test == "pcie" and g.down_links:
        links = g.down_links
        return "Fail", None, [f"GPU {g.index}'s NvLink link {link} is currently down" for link in links[:4]]
    if test == "memory":
        return "Pass", [f"Allocated {int(g.memory_total * 1048576 * 0.9)} bytes (90.0%)"], None
    if test == "pcie":
        return "Pass", ["GPU to Host bandwidth:\t\t372.41 GB/s", "Host to GPU bandwidth:\t\t375.92 GB/s",
                        "bidirectional bandwidth:\t636.10 GB/s"], None
    return "Pass", None, None


def diag_doc(rack, level, driver_version):
    cats = {}
    order = []
    failed = False
    for category, test in LEVEL_TESTS[level]:
        results = []
        statuses = []
        for g in rack.gpus:
            status, info, warnings = judge_gpu(g, test)
            statuses.append(status)
            results.append(_result(g.index, status, info, warnings))
        summary = "Fail" if "Fail" in statuses else "Pass"
        failed = failed or summary == "Fail"
        if category not in cats:
            cats[category] = []
            order.append(category)
        cats[category].append({"name": test, "results": results, "test_summary": {"status": summary}})
    doc = {
        "DCGM Diagnostic": {"test_categories": [{"category": c, "tests": cats[c]} for c in order]},
        "entity_groups": [{"entity_group": "GPU", "entity_group_id": 1,
                           "entities": [{"device_id": DEVICE_ID, "entity_id": g.index, "serial_num": g.serial}
                                        for g in rack.gpus]}],
        "metadata": {"Driver Version Detected": driver_version, "version": version()},
    }
    return doc, failed


def diag_table(doc):
    """The text table (DCGM 4.2.3's layout, NVIDIA/DCGM issue 253)."""
    bar = "+---------------------------+------------------------------------------------+"
    out = ["Successfully ran diagnostic for group.", bar,
           "| Diagnostic                | Result                                         |",
           "+===========================+================================================+",
           "|-----  Metadata  ----------+------------------------------------------------|",
           "| %-25s | %-46s |" % ("DCGM Version", doc["metadata"]["version"]),
           "| %-25s | %-46s |" % ("Driver Version Detected", doc["metadata"]["Driver Version Detected"])]
    for cat in doc["DCGM Diagnostic"]["test_categories"]:
        out.append("|-----  %s  %s+------------------------------------------------|"
                   % (cat["category"], "-" * max(0, 27 - 9 - len(cat["category"]))))
        for test in cat["tests"]:
            out.append("| %-25s | %-46s |" % (test["name"], test["test_summary"]["status"]))
            for r in test["results"]:
                out.append("| %-25s | %-46s |" % ("", "GPU%d: %s" % (r["entity_id"], r["status"])))
                for w in r.get("warnings") or []:
                    out.append("| %-25s | %-46s |" % ("", ("Warning: GPU%d " % r["entity_id"] + w["warning"])[:46]))
    out.append(bar)
    return "\n".join(out) + "\n"


# `dcgmi health -c -j`: DCGM's own report tree (NVIDIA/DCGM dcgmi/Health.cpp HandleOneEntity and
# dcgmi/DcgmiOutput.h, DCGM 3.3 to 4.6; tests/fixtures/real/README.md): every node {"value", "overflow",
# "children"}; body."Overall Health", then body.GPU.children.<id> with the entity's result and, under
# children.Errors.children.<system>, that system's result and its messages cut at 54 characters a piece.
# The messages are DCGM's (dcgmlib/dcgm_errors.h): DCGM_FR_VOLATILE_DBE_DETECTED_MSG, DCGM_FR_FALLEN_OFF_BUS_MSG,
# DCGM_FR_NVLINK_DOWN_MSG. Which system reports what (and how bad) is the lab's model of DCGM's watches.
HEALTH_PIECE = 54                # Health.cpp MAX_SIZE_OF_HEALTH_INFO
EXIT_GENERIC = 253               # DCGM_ST_GENERIC_ERROR (-3) as dcgmi's exit status
EXIT_CONNECTION = 235            # DCGM_ST_CONNECTION_NOT_VALID (-21)
WATCHES_FILE = "dcgm-health-watches"      # beside gpus.json: the systems `dcgmi health -s` set


def pieces(message):
    """The message cut at word boundaries into pieces of at most HEALTH_PIECE characters (as dcgmi does)."""
    out, line = [], ""
    for word in message.replace("\n", " ").split(" "):
        if line and len(line) + 1 + len(word) > HEALTH_PIECE:
            out.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    if line:
        out.append(line)
    return out


def incidents(g):
    """[(system, result, message)] of GpuView *g*."""
    out = []
    if g.lost:
        out.append(("PCIe system", "Failure", f"GPU {g.index} has fallen off the bus"))
    if g.dram_unc:
        out.append(("Memory system", "Failure", f"Detected {g.dram_unc} volatile double-bit ECC error(s) in GPU {g.index}."))
    if g.down_links and not g.lost:
        out.append(("NVLINK system", "Warning", ", ".join(f"GPU {g.index}'s NvLink link {link} is currently down"
                                                          for link in g.down_links[:4])))
    return out


def health_doc(rack):
    body = {}
    rank = {"Healthy": 0, "Warning": 1, "Failure": 2}
    overall = "Healthy"
    gpus = {}
    for g in rack.gpus:
        found = incidents(g)
        if not found:
            continue
        worst = max((r for _s, r, _m in found), key=rank.__getitem__)
        gpus[str(g.index)] = {"children": {"Errors": {"children": {
            system: {"overflow": pieces(message), "value": result} for system, result, message in found}}},
            "value": worst}
        overall = max(overall, worst, key=rank.__getitem__)
    body["Overall Health"] = {"value": overall}
    if gpus:
        body["GPU"] = {"children": gpus}
    return {"body": body, "header": ["Health Monitor Report"]}, overall


def watches_path(env=None):
    env = os.environ if env is None else env
    state = env.get(_smi().STATE_ENV) or _smi().STATE_PATH
    return os.path.join(os.path.dirname(state), WATCHES_FILE)


def watches_set(env=None):
    try:
        with open(watches_path(env), encoding="utf-8") as fh:
            return bool(fh.read().strip())
    except OSError:
        return False


def set_watches(systems, env=None):
    path = watches_path(env)
    tmp = "%s.%d" % (path, os.getpid())
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(systems + "\n")
    os.replace(tmp, path)


def save_replay(env, faults, text, rc):
    """Store this `health -c -j` answer for LAUNCHER to replay, when it asked and nothing makes the answer change
    from call to call; never fails the call."""
    env = os.environ if env is None else env
    path, key = env.get(REPLAY_FILE_ENV), env.get(REPLAY_KEY_ENV)
    smi = _smi()
    if not path or not key or smi.tool_fault(faults, TOOL) or smi.time_dependent(faults):
        return
    tmp = "%s.%d" % (path, os.getpid())
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(f"{key}\n{rc}\n{text}")
        os.replace(tmp, path)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass


def health_table(doc):
    bar = "+---------------------------+----------------------------------------------------------+\n"
    rows = ["| %-25s | %-56s |\n" % ("Overall Health", doc["body"]["Overall Health"]["value"])]
    for gid, gnode in (doc["body"].get("GPU") or {}).get("children", {}).items():
        rows.append("| %-25s | %-56s |\n" % ("-> " + gid, gnode["value"]))
        for system, snode in gnode["children"]["Errors"]["children"].items():
            rows.append("| %-25s | %-56s |\n" % ("      -> " + system, snode["value"]))
            rows += ["| %-25s | %-56s |\n" % ("", piece) for piece in snode["overflow"]]
    return (bar + "| Health Monitor Report" + " " * 64 + "|\n"
            + bar.replace("-", "=") + "".join(rows) + bar)


# --- mndiag (module docstring, MNDIAG) --------------------------------------------------------

class HostSpecError(ValueError):
    pass


def parse_host_list(text):
    """--hostList's value -> [(host, transport, gpus or None)]: the real grammar (module docstring)."""
    specs = [s for s in (text or "").split(";")]
    if not text or any(not s.strip() for s in specs):
        raise HostSpecError("--hostList needs at least one host specification and no empty one")
    if len(specs) > MNDIAG_MAX_HOSTS:
        raise HostSpecError("at most %d host specifications, not %d" % (MNDIAG_MAX_HOSTS, len(specs)))
    out, seen = [], set()
    for spec in specs:
        spec = spec.strip()
        body, eq, gpu_text = spec.partition("=")
        if body.count(":unix://"):
            host, _, path = body.partition(":unix://")
            if not path.startswith("/"):
                raise HostSpecError("%r: a unix socket path must be absolute" % spec)
            transport = "unix://" + path
        elif ":" in body:
            host, _, port = body.partition(":")
            if not port.isdigit() or not 0 < int(port) < 65536:
                raise HostSpecError("%r: not a port" % spec)
            transport = port
        else:
            host, transport = body, "5555"
        if not host or not re.match(r"^[A-Za-z0-9][A-Za-z0-9.-]*$", host):
            raise HostSpecError("%r: not a host name" % spec)
        gpus = None
        if eq:
            gpus = _gpu_list(gpu_text, spec)
        if (host, transport) in seen:
            raise HostSpecError("%r: host %s appears twice" % (spec, host))
        seen.add((host, transport))
        out.append((host, transport, gpus))
    return out


def _gpu_list(text, spec):
    if text == "*":
        return None
    ids = set()
    for part in text.split(","):
        lo, dash, hi = part.partition("-")
        if not lo.isdigit() or (dash and not hi.isdigit()):
            raise HostSpecError("%r: not a GPU list (ids, ranges or *)" % spec)
        lo_i, hi_i = int(lo), int(hi) if dash else int(lo)
        if hi_i < lo_i:
            raise HostSpecError("%r: a GPU range runs upwards" % spec)
        ids.update(range(lo_i, hi_i + 1))
    return sorted(ids)


def mn_gpu(g):
    """(status, [error message]) of mnubergemm on GpuView *g* (the lab's model)."""
    if g.lost:
        return "Fail", ["GPU %d is lost: the GPU has fallen off the bus or is otherwise inaccessible (PCI %s)."
                        % (g.index, g.kernel_bus)]
    errors = []
    if g.dram_unc:
        errors.append("Detected %d volatile double-bit ECC error(s) in GPU %d." % (g.dram_unc, g.index))
    errors += ["GPU %d's NvLink link %s is currently down" % (g.index, link) for link in g.down_links[:4]]
    return ("Fail" if errors else "Pass"), errors


def worker_report(env=None):
    """One host's part: its name, DCGM and driver version, its GPUs' mnubergemm results."""
    smi = _smi()
    state, faults = smi.load(env)
    rack = smi.Rack(state, faults)
    gpus = []
    for g in rack.gpus:
        status, errors = mn_gpu(g)
        gpus.append({"id": g.index, "serial": g.serial, "status": status, "errors": errors})
    return {"host": os.uname().nodename, "dcgm": version(), "driver": smi.driver_versions(state, faults)[0],
            "gpus": gpus}


def worker():
    import json
    try:
        doc = worker_report()
    except Exception as exc:            # the head reports a host that could not run its part
        doc = {"host": os.uname().nodename, "error": "%s: %s" % (type(exc).__name__, exc)}
    sys.stdout.write("@@mndiag " + json.dumps(doc) + "\n")
    return 0


WORKER = ("import sys; sys.path.insert(0, %r); import dcgmi; sys.exit(dcgmi.worker())")


def gather(hosts, env=None, timeout=MNDIAG_WORKERS_S):
    """{host: report} from one worker on every host (srun --overlap in the job), or raise RuntimeError."""
    import json
    import subprocess

    env = dict(os.environ if env is None else env)
    job = env.get("SLURM_JOB_ID")
    me = os.uname().nodename
    if not job:
        if [h for h in hosts if h.split(".")[0] != me.split(".")[0]]:
            raise RuntimeError("the host engines of %s cannot be reached outside a Slurm job (the lab's "
                               "mndiag launches its workers inside the job's allocation)" % ", ".join(hosts))
        return {me: worker_report(env)}
    for key in [k for k in env if k.startswith("SLURM_") and k != "SLURM_JOB_ID"]:
        env.pop(key)                     # the head's step: the workers' step is a new one of the same job
    argv = ["srun", "--overlap", "--jobid=%s" % job, "--nodes=%d" % len(hosts), "--ntasks=%d" % len(hosts),
            "--ntasks-per-node=1", "--nodelist=%s" % ",".join(hosts), "--kill-on-bad-exit=0",
            "/usr/bin/python3", "-IS", "-c", WORKER % LIB]
    try:
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise RuntimeError("the hosts' workers did not report within %gs" % timeout)
    except OSError as exc:
        raise RuntimeError("cannot launch the workers: %s" % exc)
    found = {}
    for line in proc.stdout.splitlines():
        if line.startswith("@@mndiag "):
            try:
                doc = json.loads(line[9:])
            except ValueError:
                continue
            found[str(doc.get("host", "")).split(".")[0]] = doc
    missing = [h for h in hosts if h.split(".")[0] not in found]
    if missing:
        said = " ".join((proc.stderr or "").split())[:300]
        raise RuntimeError("no report from %s (srun exit %d%s)" % (", ".join(missing), proc.returncode,
                                                                  ": " + said if said else ""))
    broken = [(h, found[h.split(".")[0]]["error"]) for h in hosts if found[h.split(".")[0]].get("error")]
    if broken:
        raise RuntimeError("; ".join("%s could not run its part: %s" % hb for hb in broken))
    return {h: found[h.split(".")[0]] for h in hosts}


def mndiag_doc(specs, reports):
    """dcgmi's JSON (module docstring) from the hosts' reports, in --hostList order."""
    hosts, results, entities = [], [], 0
    overall = "Pass"
    for hid, (host, _transport, wanted) in enumerate(specs):
        rep = reports[host]
        gpus = [g for g in rep["gpus"] if wanted is None or g["id"] in wanted]
        ents = [{"device_id": DEVICE_ID, "entity_group": "GPU", "entity_group_id": 1, "entity_id": g["id"],
                 "serial_num": g["serial"]} for g in gpus]
        entities += len(ents)
        hosts.append({"dcgm_version": rep["dcgm"], "driver_version": rep["driver"], "entities": ents,
                      "host_id": hid, "hostname": host, "num_entities": len(ents)})
        for g in gpus:
            r = {"entity_group": "GPU", "entity_group_id": 1, "entity_id": g["id"], "host_id": hid,
                 "status": g["status"]}
            if g["errors"]:
                r["warnings"] = [{"error_category": 1, "error_id": 0, "error_severity": 2, "warning": e}
                                 for e in g["errors"]]
                overall = "Fail"
            results.append(r)
    test = {"name": "MNUBERGEMM", "status": overall, "test_summary": {"status": overall}}
    if results:
        test["results"] = results
    return {"DCGM Diagnostic": MNDIAG_NAME, "hosts": hosts,
            "metadata": {"num_entities": entities, "num_hosts": len(hosts)},
            "test_categories": [{"category": "Multi-Node Tests", "tests": [test]}]}


def mndiag_failure_doc(message):
    return {"DCGM Diagnostic": MNDIAG_NAME, "metadata": {"num_entities": 0, "num_hosts": 0},
            "runtime_error": message}


def styled(doc):
    """jsoncpp's toStyledString layout, approximately: 3-space indent, `"key" : value`, sorted keys."""
    import json
    return json.dumps(doc, indent=3, sort_keys=True, separators=(",", " : "), ensure_ascii=False) + "\n"


def mndiag_table(doc):
    """HelperDisplayAsCli's rows (dcgmi/MnDiag.cpp)."""
    bar = "+---------------------------+------------------------------------------------+"

    def row(name, info):
        return "| %-25s | %-46s |" % (name, info)
    test = doc["test_categories"][0]["tests"][0]
    hosts = doc["hosts"]
    results = test.get("results") or []
    failed_hosts = {r["host_id"] for r in results if r["status"] == "Fail"}
    out = ["Successfully ran multi-node diagnostic." if test["status"] == "Pass" else "Multi-node diagnostic failed.",
           bar, row("Diagnostic", "Result"), bar.replace("-", "="),
           "|-----  Metadata  ----------+------------------------------------------------|",
           row("MNUBERGEMM Test", test["status"])]
    if hosts:
        out += [row("Driver Version", hosts[0]["driver_version"]), row("DCGM Version", hosts[0]["dcgm_version"])]
    out += [row("Hosts Found", len(hosts)), row("Hosts With Errors", len(failed_hosts))]
    for h in hosts:
        out.append(row("Host List" if h["host_id"] == 0 else "", "%d: %s" % (h["host_id"], h["hostname"])))
    out.append(row("Total GPUs", len(results)))
    out.append("|-----  Host Details  ------+------------------------------------------------|")
    for h in hosts:
        mine = [r for r in results if r["host_id"] == h["host_id"]]
        status = "Fail" if any(r["status"] == "Fail" for r in mine) else "Pass"
        out.append(row("Host %d" % h["host_id"], status))
        if status == "Pass" and mine:
            out.append(row("  GPUs: " + ", ".join(str(r["entity_id"]) for r in mine), "Pass"))
        for r in (mine if status != "Pass" else []):
            out.append(row("  GPU %d" % r["entity_id"], r["status"]))
            out += [row("", ("Error: " + w["warning"])[:46]) for w in r.get("warnings") or []]
    if failed_hosts:
        out.append("|-----  Error Summary  -----+------------------------------------------------|")
        for r in results:
            for w in r.get("warnings") or []:
                out.append(row("Host %d (GPU %d)" % (r["host_id"], r["entity_id"]), ("Error: " + w["warning"])[:46]))
    out.append(bar)
    return "\n".join(out) + "\n"


def _mndiag_args(rest):
    opts = {"hosts": None, "run": "mnubergemm", "json": False}
    i = 0
    while i < len(rest):
        a = rest[i]
        if a in ("--hostList",) and i + 1 < len(rest):
            opts["hosts"] = rest[i + 1]
            i += 1
        elif a in ("-r", "--run") and i + 1 < len(rest):
            opts["run"] = rest[i + 1]
            i += 1
        elif a in ("-j", "--json"):
            opts["json"] = True
        else:
            raise ValueError(a)
        i += 1
    if opts["hosts"] is None:
        raise ValueError("--hostList")
    return opts


def mndiag(rest, env, stdout, stderr):
    try:
        opts = _mndiag_args(rest)
    except ValueError as exc:
        stderr.write("PARSE ERROR:\n             Argument: %s\n             Couldn't find match for argument\n\n"
                     % exc + USAGE)
        return 255
    if opts["run"].lower() != "mnubergemm":
        stdout.write("Error: unknown multi-node diagnostic %r (DCGM provides mnubergemm)\n" % opts["run"])
        return EXIT_GENERIC
    try:
        specs = parse_host_list(opts["hosts"])
    except HostSpecError as exc:
        stdout.write("Error: invalid --hostList: %s\n" % exc)
        return EXIT_GENERIC
    smi = _smi()
    try:
        _state, faults = smi.load(env)
    except smi.DriverMissing:
        stdout.write(NO_HOST_ENGINE)
        return EXIT_CONNECTION
    me = os.uname().nodename
    try:
        reports = gather([h for h, _t, _g in specs], env)
    except RuntimeError as exc:
        message = ("Error: Unable to complete multi-node diagnostic on host %s. Return: (%s) -3\n" % (me, exc))
        text = styled(mndiag_failure_doc(message)) if opts["json"] else message + "\n"
        smi.write_output(TOOL, text, faults, env, stdout)
        return EXIT_GENERIC
    doc = mndiag_doc(specs, reports)
    text = styled(doc) if opts["json"] else mndiag_table(doc)
    smi.write_output(TOOL, text, faults, env, stdout)
    return 0


def _args(argv):
    sub = argv[0] if argv else ""
    rest = argv[1:]
    opts = {"json": False, "level": None, "check": False, "set": None}
    i = 0
    while i < len(rest):
        a = rest[i]
        if a in ("-j", "--json"):
            opts["json"] = True
        elif a in ("-r", "--run") and i + 1 < len(rest):
            opts["level"] = rest[i + 1]
            i += 1
        elif a in ("-c", "--check"):
            opts["check"] = True
        elif a in ("-s", "--set") and i + 1 < len(rest):
            opts["set"] = rest[i + 1]
            i += 1
        elif a in ("-g", "--group", "-i") and i + 1 < len(rest):
            i += 1
        else:
            raise ValueError(a)
        i += 1
    return sub, opts


def main(argv=None, env=None, stdout=None, stderr=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    stdout = stdout or sys.stdout
    stderr = stderr or sys.stderr
    if argv[:1] in (["-v"], ["--version"]):
        stdout.write(f"Version : {version()}\nBuild ID : 1\nBuild Type : Release\n")
        return 0
    if argv[:1] == ["mndiag"] and has_mndiag(version()):
        return mndiag(argv[1:], env, stdout, stderr)
    try:
        sub, opts = _args(argv)
    except ValueError as exc:
        stderr.write(f"PARSE ERROR:\n             Argument: {exc}\n             Couldn't find match for argument\n\n"
                     + USAGE)
        return 255
    smi = _smi()
    try:
        state, faults = smi.load(env)
    except smi.DriverMissing:
        stdout.write(NO_HOST_ENGINE)
        return EXIT_CONNECTION
    rack = smi.Rack(state, faults)
    if sub == "diag" and opts["level"] in ("1", "2", "3"):
        doc, failed = diag_doc(rack, int(opts["level"]), smi.driver_versions(state, faults)[0])
        text = dumps(doc) if opts["json"] else diag_table(doc)
        rc = EXIT_FAILED if failed else 0
    elif sub == "health" and opts["set"] is not None:
        set_watches(opts["set"], env)
        text, rc = "Health monitor systems set successfully.\n", 0
    elif sub == "health" and opts["check"] and not watches_set(env):
        text, rc = "Error: Health watches not enabled. Please enable watches. \n", EXIT_GENERIC
        if opts["json"]:
            save_replay(env, faults, text, rc)
    elif sub == "health" and opts["check"]:
        doc, _overall = health_doc(rack)
        text = dumps(doc) if opts["json"] else health_table(doc)
        rc = 0
        if opts["json"]:
            save_replay(env, faults, text, rc)
    else:
        stderr.write(USAGE)
        return 255
    _smi().write_output(TOOL, text, faults, env, stdout)
    return rc


if __name__ == "__main__":
    sys.exit(main())
