#!/usr/bin/python3
"""dcgmi (DCGM 4) for the trays of the mctl virtual rack: `diag -r 1|2|3 [-j]`, `health -s|-c [-j]`, `-v`.

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
"""

from __future__ import annotations

import os
import sys

LIB = os.path.dirname(os.path.abspath(__file__))
if LIB not in sys.path:
    sys.path.insert(0, LIB)

VERSION = "4.3.1"
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
         "Usage: dcgmi diag -r 1|2|3 [-j]   dcgmi health -s a | -c [-j]   dcgmi -v\n")


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
        "metadata": {"Driver Version Detected": driver_version, "version": VERSION},
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


def health_doc(rack):
    body = {}
    overall = "Healthy"
    for g in rack.gpus:
        incidents = {}
        if g.lost:
            incidents["PCIe system"] = {"error": f"GPU {g.index} is lost (fallen off the bus)", "value": "Failure"}
        if g.dram_unc:
            incidents["Memory system"] = {"error": f"GPU {g.index}: {g.dram_unc} volatile double-bit ECC error(s)",
                                          "value": "Failure"}
        if g.down_links and not g.lost:
            incidents["NVLink system"] = {"error": f"GPU {g.index}'s NvLink link {g.down_links[0]} is currently down",
                                          "value": "Warning"}
        if incidents:
            worst = "Failure" if any(i["value"] == "Failure" for i in incidents.values()) else "Warning"
            body[f"GPU ID: {g.index}"] = {**incidents, "value": worst}
            if worst == "Failure" or overall == "Healthy":
                overall = worst
    body["Overall Health"] = {"value": overall}
    return {"body": body, "header": ["Health Monitor Report"]}, overall


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
        stdout.write(f"Version : {VERSION}\nBuild ID : 1\nBuild Type : Release\n")
        return 0
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
        stderr.write("Error: unable to establish a connection to the specified host: localhost\n"
                     "Error: Unable to connect to host engine. Host engine connection invalid/disconnected.\n")
        return 255
    rack = smi.Rack(state, faults)
    if sub == "diag" and opts["level"] in ("1", "2", "3"):
        doc, failed = diag_doc(rack, int(opts["level"]), smi.driver_versions(state, faults)[0])
        text = dumps(doc) if opts["json"] else diag_table(doc)
        rc = EXIT_FAILED if failed else 0
    elif sub == "health" and opts["set"] is not None:
        text, rc = "Health monitor systems set successfully.\n", 0
    elif sub == "health" and opts["check"]:
        doc, overall = health_doc(rack)
        text = dumps(doc) if opts["json"] else (
            "+---------------------------+----------------------------------------------------------+\n"
            "| Health Monitor Report                                                                |\n"
            "+===========================+==========================================================+\n"
            "| %-25s | %-56s |\n" % ("Overall Health", overall)
            + "".join("| %-25s | %-56s |\n" % (k, v["value"]) for k, v in doc["body"].items() if k != "Overall Health")
            + "+---------------------------+----------------------------------------------------------+\n")
        rc = 0
    else:
        stderr.write(USAGE)
        return 255
    _smi().write_output(TOOL, text, faults, env, stdout)
    return rc


if __name__ == "__main__":
    sys.exit(main())
