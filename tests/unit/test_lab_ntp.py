"""The lab's NTP server: the reply to a client request (RFC 5905 server mode), nothing to anything else."""

from __future__ import annotations

import struct

from mctl.lab import ntp


def _request(version=4, mode=3, transmit=b"\x01\x02\x03\x04\x05\x06\x07\x08"):
    return bytes([(version << 3) | mode, 0, 6, 0xEC]) + b"\0" * 36 + transmit


def test_reply_echoes_the_clients_transmit_time_as_origin():
    t = 1_764_600_000.25
    reply = ntp.answer(_request(), received=t - 0.001, now=lambda: t)
    assert len(reply) == 48
    first, stratum, poll, precision = struct.unpack("!BBBb", reply[:4])
    assert (first >> 6, (first >> 3) & 7, first & 7) == (0, 4, 4)      # no leap warning, v4, server
    assert (stratum, poll, precision) == (1, 6, -20) and reply[12:16] == b"LOCL"
    assert reply[24:32] == b"\x01\x02\x03\x04\x05\x06\x07\x08"          # origin = the client's transmit
    secs, frac = struct.unpack("!II", reply[40:48])
    assert secs == int(t) + ntp.NTP_EPOCH and abs(frac / 2**32 - 0.25) < 1e-6


def test_only_client_requests_are_answered():
    assert ntp.answer(_request(mode=4), received=0.0) is None          # a server's packet
    assert ntp.answer(_request(version=0), received=0.0) is None
    assert ntp.answer(b"\x23" * 47, received=0.0) is None              # short
