#!/usr/bin/python3
"""nccl-tests' all_reduce_perf for the trays of the mctl virtual rack (`-b MIN -e MAX -f FACTOR -g GPUS [-n ITERS]`).

Installed by the lab's package nccl-tests as /usr/bin/all_reduce_perf; it runs under the tray's
/usr/bin/python3 with the standard library and the lab's nvidia-smi emulator module (gpus.json and
faults.json through nvidia_smi.Rack), so its table follows the lab's faults:

  healthy tray               a bus bandwidth near NVLink 5's (BUS_PEAK_GBS at the largest sizes)
  nvlink_down [[g, l]]       the ring runs at the slowest GPU's share of its 18 links: peak * (18 - down) / 18
  nvlink_all_down [g]        no NVLink for GPU g: NCCL goes through host memory (FALLBACK_GBS)
  fell_off_bus / xid 79      the run fails: "Test CUDA failure common.cu:... 'unknown error'" (exit 1)
  -g more than the GPUs      "Test CUDA failure ... 'invalid device ordinal'" (a missing GPU)
  tool_faults.all_reduce_perf  hang | crash | garbage | truncated (nvidia_smi.misbehave)

The layout is nccl-tests 2.17's (the header line, the device list, the two-level column header, one
row a size, "# Out of bounds values", "# Avg bus bandwidth", "# Collective test concluded"), as in
tests/fixtures/real/issue-coreweave-nccl-tests-pr43-gb200-nvl72-all-reduce.txt; failures print as in
tests/fixtures/real/issue-nccl-tests-322-all-reduce-nccl-failure.txt. The numbers are the lab's model.
"""

from __future__ import annotations

import os
import sys

LIB = os.path.dirname(os.path.abspath(__file__))
if LIB not in sys.path:
    sys.path.insert(0, LIB)

TOOL = "all_reduce_perf"
NVLINKS = 18
BUS_PEAK_GBS = 770.0       # the lab's healthy tray at 8 GiB (a real GB200 NVL72 run reached 835-847)
FALLBACK_GBS = 45.0        # no NVLink on one GPU: NCCL's path through host memory
LATENCY_US = 18.0
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def size_arg(text):
    text = str(text).strip().upper()
    unit = text[-1:] if text[-1:] in "KMG" else ""
    return int(float(text[: len(text) - len(unit)]) * _UNITS[unit])


def _args(argv):
    opts = {"b": 8, "e": 128 << 20, "f": 2, "g": 1, "n": 20, "w": 5}
    i = 0
    long = {"--minbytes": "b", "--maxbytes": "e", "--stepfactor": "f", "--ngpus": "g", "--iters": "n",
            "--warmup_iters": "w"}
    while i < len(argv):
        a = argv[i]
        key = long.get(a) or (a[1:] if a in ("-b", "-e", "-f", "-g", "-n", "-w") else None)
        if key is None or i + 1 >= len(argv):
            raise ValueError(a)
        value = argv[i + 1]
        opts[key] = size_arg(value) if key in ("b", "e") else int(value)
        i += 2
    if opts["f"] < 2 or opts["b"] < 1 or opts["e"] < opts["b"] or opts["g"] < 1:
        raise ValueError("sizes")
    return opts


def peak_busbw(gpus):
    """The lab's bus bandwidth for a ring over *gpus* (GpuViews): the slowest GPU's links set it."""
    if any(g.all_links_down for g in gpus):
        return FALLBACK_GBS
    up = min((NVLINKS - len(g.down_links)) for g in gpus) if gpus else NVLINKS
    if up <= 0:
        return FALLBACK_GBS
    return BUS_PEAK_GBS * up / NVLINKS


def _time(us):
    if us >= 10000:
        return "%.0f" % us
    if us >= 100:
        return "%.1f" % us
    return "%.2f" % us


def rows(opts, ranks, busbw_peak):
    factor = 2.0 * (ranks - 1) / ranks if ranks > 1 else 0.0
    alg_peak = busbw_peak / factor if factor else busbw_peak
    out, total, n = [], 0.0, 0
    size = opts["b"]
    while size <= opts["e"]:
        count = size // 4
        if count == 0:
            size *= opts["f"]
            continue
        nbytes = count * 4
        cells = []
        for wobble in (1.0, 0.985):
            us = LATENCY_US + nbytes / (alg_peak * 1e3 * wobble)
            alg = nbytes / us / 1e3
            bus = alg * factor
            total += bus
            n += 1
            cells.append("%9s%8.2f%8.2f%7d" % (_time(us), alg, bus, 0))
        out.append("%12d  %12d  %8s  %6s  %6d%s%s" % (nbytes, count, "float", "sum", -1, cells[0], cells[1]))
        size *= opts["f"]
    return out, (total / n if n else 0.0)


def header(opts, host, gpus):
    lines = ["# Collective test starting: all_reduce_perf",
             "# nThread 1 nGpus %d minBytes %d maxBytes %d step: %d(factor) warmup iters: %d iters: %d agg iters: 1 "
             "validation: 1 graph: 0" % (opts["g"], opts["b"], opts["e"], opts["f"], opts["w"], opts["n"]),
             "#", "# Using devices"]
    pid = os.getpid()
    for rank, g in enumerate(gpus):
        domain, bus, device = g.pci_parts()
        lines.append("#  Rank %2d Group  0 Pid %6d on %10s device %2d [%s:%s:%s] %s"
                     % (rank, pid, host, rank, domain, bus, device, g.name))
    lines += ["#",
              "#                                                              out-of-place                       in-place          ",
              "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong",
              "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)       "]
    return lines


def main(argv=None, env=None, stdout=None, stderr=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    stdout = stdout or sys.stdout
    import nvidia_smi as smi

    try:
        opts = _args(argv)
    except ValueError as exc:
        stdout.write("invalid option or value: %s\nUSAGE: all_reduce_perf [-b MINBYTES] [-e MAXBYTES] [-f STEPFACTOR] "
                     "[-g NGPUS] [-n ITERS]\n" % exc)
        return 1
    host = os.uname().nodename
    try:
        state, faults = smi.load(env)
    except smi.DriverMissing:
        stdout.write("%s: Test CUDA failure common.cu:1022 'CUDA driver version is insufficient for CUDA runtime "
                     "version'\n .. %s pid %d: Test failure common.cu:906\n" % (host, host, os.getpid()))
        return 1
    rack = smi.Rack(state, faults)
    gpus = rack.gpus[: opts["g"]]
    lines = header(opts, host, gpus)
    rc = 0
    if len(rack.gpus) < opts["g"]:
        lines += ["%s: Test CUDA failure common.cu:1022 'invalid device ordinal'" % host,
                  " .. %s pid %d: Test failure common.cu:906" % (host, os.getpid())]
        rc = 1
    elif any(g.lost for g in gpus):
        lines += ["%s: Test CUDA failure common.cu:1279 'unknown error'" % host,
                  " .. %s pid %d: Test failure common.cu:1142" % (host, os.getpid())]
        rc = 1
    else:
        table, avg = rows(opts, len(gpus), peak_busbw(gpus))
        lines += table + ["# Out of bounds values : 0 OK", "# Avg bus bandwidth    : %g " % round(avg, 4), "#",
                          "# Collective test concluded: all_reduce_perf", "#"]
    text = "\n".join(lines) + "\n"
    smi.write_output(TOOL, text, faults, env, stdout)
    return rc


if __name__ == "__main__":
    sys.exit(main())
