"""The lab's time server: an NTP server (RFC 5905 server mode, the SNTP subset of RFC 4330) on each
rack's service address, serving this machine's clock.

A site gives its trays time servers (inventory `time_servers`); the lab gives each rack this one, so
the trays' chronyd (in the lab image, configured by provisioning) has a real source to select, over
UDP on loopback, and nothing of the lab reaches an outside pool. It answers client requests (mode 3)
only, as a stratum-1 server whose reference is its own clock (reference id `LOCL`); the lab's
chronyd never adjusts the clock it shares with the machine (`-x`, docs/provisioning.md), so syncing
here proves the daemon runs, reads its configuration and selects the site's source, not that it can
steer a clock.
"""

from __future__ import annotations

import argparse
import socket
import struct
import sys
import time

NTP_PORT = 123
NTP_EPOCH = 2208988800          # seconds from 1900-01-01 to 1970-01-01
STRATUM = 1
PRECISION = -20                 # log2 seconds, ~1 microsecond


def ntp_time(t: float) -> bytes:
    secs = int(t) + NTP_EPOCH
    frac = int((t - int(t)) * (1 << 32)) & 0xFFFFFFFF
    return struct.pack("!II", secs & 0xFFFFFFFF, frac)


def answer(request: bytes, received: float, now=time.time) -> bytes | None:
    """The server's reply to one client packet, or None for anything that is not a client request."""
    if len(request) < 48:
        return None
    first = request[0]
    version, mode = (first >> 3) & 7, first & 7
    if mode != 3 or not 1 <= version <= 4:
        return None
    poll = request[2]
    header = struct.pack("!BBBb", (0 << 6) | (version << 3) | 4, STRATUM, poll, PRECISION)
    root = struct.pack("!II", 0, 1 << 4)      # root delay 0, root dispersion ~0.25 ms (16.16 fixed point)
    t = now()
    return header + root + b"LOCL" + ntp_time(t - 1.0) + request[40:48] + ntp_time(received) + ntp_time(now())


def serve(address: str, port: int) -> int:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((address, port))
    try:
        while True:
            data, peer = sock.recvfrom(1024)
            reply = answer(data, time.time())
            if reply is not None:
                sock.sendto(reply, peer)
    except KeyboardInterrupt:
        return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mctl.lab.ntp")
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve", help="answer NTP client requests with this machine's clock")
    s.add_argument("--address", required=True)
    s.add_argument("--port", type=int, default=NTP_PORT)
    args = ap.parse_args(argv)
    return serve(args.address, args.port)


if __name__ == "__main__":
    sys.exit(main())
