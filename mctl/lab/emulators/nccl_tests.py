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

Under Slurm's srun with more than one task (SLURM_NTASKS > 1; one task per tray, each with -g GPUS) the
tasks are the ranks of one job, bootstrapped as NCCL does: rank 0 listens on its tray's address (the first
node of SLURM_STEP_NODELIST, resolved through the tray's /etc/hosts), the others connect to it over TCP
(each under BOOTSTRAP_S) and send their tray's state (its GPUs, its ring bandwidth, a lost GPU, its tool
fault); rank 0 prints the table, its device list naming every rank on its host, at the bus bandwidth of the
slowest participant. A rank that cannot join, or a peer that dies, fails the run with NCCL's words
("Test NCCL failure ... 'remote process exited or there was a network error / '", a "NCCL WARN" line);
a rank whose GPU is lost fails with its CUDA failure; a peer's hang or crash holds or breaks the
collective (rank 0 waits on it, as a real ring does), a peer's garbage or truncated output is rank 0's.

The layout is nccl-tests 2.17's (the header line, the device list, the two-level column header, one
row a size, "# Out of bounds values", "# Avg bus bandwidth", "# Collective test concluded"), as in
tests/fixtures/real/issue-coreweave-nccl-tests-pr43-gb200-nvl72-all-reduce.txt; failures print as in
tests/fixtures/real/issue-nccl-tests-322-all-reduce-nccl-failure.txt. The numbers are the lab's model.
"""

from __future__ import annotations

import json
import os
import re
import socket
import sys
import time

LIB = os.path.dirname(os.path.abspath(__file__))
if LIB not in sys.path:
    sys.path.insert(0, LIB)

TOOL = "all_reduce_perf"
NVLINKS = 18
BUS_PEAK_GBS = 770.0       # the lab's healthy tray at 8 GiB (a real GB200 NVL72 run reached 835-847)
FALLBACK_GBS = 45.0        # no NVLink on one GPU: NCCL's path through host memory
LATENCY_US = 18.0
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
BOOTSTRAP_S = 30.0         # how long rank 0 waits for the others to join, and a rank tries to reach rank 0
PORT_BASE, PORT_SPAN = 20000, 40000
REMOTE_ERROR = "remote process exited or there was a network error"
SYSTEM_ERROR = "unhandled system error (run with NCCL_DEBUG=INFO for details)"


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


def expand_nodelist(text):
    """Slurm's hostlist expression (lab-r1-tray[01-03,05],lab-r1-head) -> the names, in order."""
    out, depth, item = [], 0, ""
    for ch in (text or "") + ",":
        if ch == "," and depth == 0:
            if item:
                out.extend(_expand_one(item))
            item = ""
            continue
        depth += ch == "["
        depth -= ch == "]"
        item += ch
    return out


def _expand_one(item):
    m = re.match(r"^([^\[]*)\[([^\]]*)\](.*)$", item)
    if not m:
        return [item]
    head, ranges, tail = m.groups()
    names = []
    for part in ranges.split(","):
        lo, _, hi = part.partition("-")
        hi = hi or lo
        for n in range(int(lo), int(hi) + 1):
            names.extend(head + str(n).zfill(len(lo)) + rest for rest in _expand_one(tail))
    return names


def _warn(host, rank, text):
    return "%s:%d:%d [%d] NCCL WARN %s\n" % (host, os.getpid(), os.getpid(), rank, text)


def _nccl_failure(host, line, error):
    return "%s: Test NCCL failure common.cu:%d '%s / '\n .. %s pid %d: Test failure common.cu:915\n" % (
        host, line, error, host, os.getpid())


def _local(opts, host, rack, faults, driver_missing, tool_fault):
    """What this rank tells the others: its GPUs, its ring's bandwidth, why it cannot run."""
    gpus = rack.gpus[: opts["g"]] if rack else []
    failure = None
    if driver_missing:
        failure = ("%s: Test CUDA failure common.cu:1022 'CUDA driver version is insufficient for CUDA runtime "
                   "version'\n .. %s pid %d: Test failure common.cu:906\n" % (host, host, os.getpid()))
    elif len(rack.gpus) < opts["g"]:
        failure = ("%s: Test CUDA failure common.cu:1022 'invalid device ordinal'\n .. %s pid %d: Test failure "
                   "common.cu:906\n" % (host, host, os.getpid()))
    elif any(g.lost for g in gpus):
        failure = ("%s: Test CUDA failure common.cu:1279 'unknown error'\n .. %s pid %d: Test failure "
                   "common.cu:1142\n" % (host, host, os.getpid()))
    return {"host": host, "pid": os.getpid(), "gpus": [list(g.pci_parts()) + [g.name] for g in gpus],
            "busbw": peak_busbw(gpus) if gpus else 0.0, "failure": failure, "fault": tool_fault}


def _send(sock, doc):
    sock.sendall((json.dumps(doc) + "\n").encode())


def _recv(reader):
    line = reader.readline()
    return json.loads(line) if line else None


def _bootstrap_address(env):
    nodes = expand_nodelist(env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or "")
    if not nodes:
        raise OSError("no SLURM_STEP_NODELIST")
    job = int(env.get("SLURM_JOB_ID") or 0)
    step = int(env.get("SLURM_STEP_ID") or 0)
    return nodes[0], socket.gethostbyname(nodes[0]), PORT_BASE + (job * 16 + step) % PORT_SPAN


def multi_node(opts, env, stdout, rank, ntasks):
    """One rank of a job of *ntasks* trays (module docstring); returns the exit status."""
    import nvidia_smi as smi

    host = os.uname().nodename
    driver_missing = False
    rack = faults = None
    try:
        state, faults = smi.load(env)
        rack = smi.Rack(state, faults)
    except smi.DriverMissing:
        driver_missing = True
    mine = _local(opts, host, rack, faults, driver_missing, smi.tool_fault(faults, TOOL))
    try:
        root_name, address, port = _bootstrap_address(env)
    except (OSError, ValueError) as exc:
        stdout.write(_warn(host, rank, "Bootstrap : no address for rank 0 (%s)" % exc)
                     + _nccl_failure(host, 1122, SYSTEM_ERROR))
        return 1
    if rank == 0:
        return _root(opts, env, stdout, host, mine, address, port, ntasks, faults)
    return _peer(env, stdout, host, mine, rank, root_name, address, port, faults)


def _peer(env, stdout, host, mine, rank, root_name, address, port, faults):
    import nvidia_smi as smi

    deadline = time.monotonic() + BOOTSTRAP_S
    sock, why = None, ""
    while sock is None and time.monotonic() < deadline:
        try:
            sock = socket.create_connection((address, port), timeout=max(0.1, deadline - time.monotonic()))
        except OSError as exc:
            why = exc.strerror or str(exc)
            time.sleep(0.1)
    if sock is None:
        stdout.write(_warn(host, rank, "socketConnect: Connect to %s<%d> (%s) failed : %s" % (address, port, root_name, why))
                     + _nccl_failure(host, 1122, SYSTEM_ERROR))
        return 1
    sock.settimeout(None)
    with sock, sock.makefile("r") as reader:
        _send(sock, dict(mine, rank=rank))
        if mine["failure"]:
            stdout.write(mine["failure"])
            stdout.flush()
            return 1
        if mine["fault"] in ("hang", "crash"):
            smi.misbehave(mine["fault"], TOOL, "", env, stdout)      # hang until cleared; crash never returns
        _send(sock, {"ready": rank})
        done = _recv(reader)
    if not done:
        stdout.write(_nccl_failure(host, 1204, REMOTE_ERROR))
        return 1
    return int(done.get("rc") or 0)


def _root(opts, env, stdout, host, mine, address, port, ntasks, faults):
    import nvidia_smi as smi

    try:
        server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind((address, port))
        server.listen(ntasks)
    except OSError as exc:
        stdout.write(_warn(host, 0, "Bootstrap : cannot listen on %s<%d> : %s" % (address, port, exc.strerror or exc))
                     + _nccl_failure(host, 1122, SYSTEM_ERROR))
        return 1
    peers = {}
    deadline = time.monotonic() + BOOTSTRAP_S
    with server:
        while len(peers) < ntasks - 1 and time.monotonic() < deadline:
            server.settimeout(max(0.05, deadline - time.monotonic()))
            try:
                conn, _addr = server.accept()
            except socket.timeout:
                break
            conn.settimeout(max(1.0, deadline - time.monotonic()))
            reader = conn.makefile("r")
            try:
                doc = _recv(reader)
            except (OSError, ValueError):
                doc = None
            if not doc or "rank" not in doc:
                conn.close()
                continue
            conn.settimeout(None)
            peers[int(doc["rank"])] = (conn, reader, doc)
        missing = [r for r in range(1, ntasks) if r not in peers]
        rc = 1
        try:
            if missing:
                stdout.write(_warn(host, 0, "Bootstrap : %d of %d ranks did not join within %gs (ranks %s)" % (
                    len(missing), ntasks, BOOTSTRAP_S, ",".join(str(r) for r in missing)))
                             + _nccl_failure(host, 1122, SYSTEM_ERROR))
                return 1
            everyone = [mine] + [peers[r][2] for r in range(1, ntasks)]
            lines = _multi_header(opts, everyone)
            if mine["failure"]:
                stdout.write("\n".join(lines) + "\n" + mine["failure"])
                return 1
            if any(d["failure"] for d in everyone[1:]):
                stdout.write("\n".join(lines) + "\n" + _nccl_failure(host, 1204, REMOTE_ERROR))
                return 1
            for r in range(1, ntasks):
                try:
                    ready = _recv(peers[r][1])
                except (OSError, ValueError):
                    ready = None
                if not ready:                              # the peer died in the collective
                    stdout.write("\n".join(lines) + "\n" + _nccl_failure(host, 1204, REMOTE_ERROR))
                    return 1
            table, avg = rows(opts, opts["g"] * ntasks, min(d["busbw"] for d in everyone))
            lines += table + ["# Out of bounds values : 0 OK", "# Avg bus bandwidth    : %g " % round(avg, 4), "#",
                              "# Collective test concluded: all_reduce_perf", "#"]
            text = "\n".join(lines) + "\n"
            peer_fault = next((d["fault"] for d in everyone[1:] if d["fault"] in ("garbage", "truncated")), "")
            if peer_fault:
                text = smi.misbehave(peer_fault, TOOL, text, env, stdout)
            smi.write_output(TOOL, text, faults, env, stdout)
            rc = 0
            return 0
        finally:
            stdout.flush()
            for conn, reader, _doc in peers.values():
                try:
                    _send(conn, {"rc": rc})
                except OSError:
                    pass
                conn.close()


def _multi_header(opts, everyone):
    lines = ["# Collective test starting: all_reduce_perf",
             "# nThread 1 nGpus %d minBytes %d maxBytes %d step: %d(factor) warmup iters: %d iters: %d agg iters: 1 "
             "validation: 1 graph: 0" % (opts["g"], opts["b"], opts["e"], opts["f"], opts["w"], opts["n"]),
             "#", "# Using devices"]
    rank = 0
    for d in everyone:
        for device, (domain, bus, dev, name) in enumerate(d["gpus"]):
            lines.append("#  Rank %2d Group  0 Pid %6d on %10s device %2d [%s:%s:%s] %s"
                         % (rank, d["pid"], d["host"], device, domain, bus, dev, name))
            rank += 1
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
    senv = os.environ if env is None else env
    try:
        ntasks, rank = int(senv.get("SLURM_NTASKS") or 1), int(senv.get("SLURM_PROCID") or 0)
    except ValueError:
        ntasks, rank = 1, 0
    if ntasks > 1:
        return multi_node(opts, senv, stdout, rank, ntasks)
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
