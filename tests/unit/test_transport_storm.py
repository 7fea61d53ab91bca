"""The fan-out's adaptive window and its deadlines (D124): pure parts, no hosts."""

from __future__ import annotations

import asyncio

import pytest

from mctl.transport import ssh as ssh_mod
from mctl.transport.ssh import MIN_WINDOW, _Window, fanout_deadline


def test_the_window_halves_once_per_hold_never_below_its_floor_and_grows_back():
    w = _Window(64, hold=0.0)
    w.congested()
    assert int(w.limit) == 32
    for _ in range(10):
        w.congested()
    assert int(w.limit) == MIN_WINDOW and w.smallest == MIN_WINDOW
    grown = 0
    while w.limit < 64.0 and grown < 10000:
        w.success()
        grown += 1
    assert w.limit == 64.0 and grown > 64     # additive: about one per window's worth of successes


def test_a_burst_of_timeouts_is_one_signal_within_the_hold():
    w = _Window(64, hold=60.0)
    for _ in range(30):
        w.congested()
    assert int(w.limit) == 32 and w.shrinks == 1


def test_places_are_served_in_order_and_a_shrunk_window_admits_fewer():
    async def main():
        w = _Window(4, hold=0.0)
        for _ in range(4):
            await w.acquire()
        w.congested()                   # the floor is min(MIN_WINDOW, cap): a window of 4 stays 4
        order: list[int] = []

        async def one(i: int):
            async with w:
                order.append(i)
                await asyncio.sleep(0)

        tasks = [asyncio.ensure_future(one(i)) for i in range(6)]
        await asyncio.sleep(0)
        assert order == [] and len(w.waiting) == 6
        for _ in range(4):
            w.release()
        await asyncio.gather(*tasks)
        return order, w

    order, w = asyncio.run(main())
    assert order == list(range(6)) and w.active == 0


def test_a_cancelled_waiter_gives_its_place_on():
    async def main():
        w = _Window(1, hold=0.0)
        await w.acquire()
        waiter = asyncio.ensure_future(w.acquire())
        await asyncio.sleep(0)
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)
        w.release()
        await asyncio.wait_for(w.acquire(), 1.0)      # the place was not lost to the cancelled waiter
        return w

    assert asyncio.run(main()).active == 1


@pytest.mark.parametrize("hosts, concurrency, expected", [
    (18, 64, 15.0), (64, 64, 15.0), (65, 64, 30.0), (288, 64, 75.0), (1152, 64, 270.0), (0, 64, 15.0),
])
def test_fanout_deadline_is_one_tray_deadline_per_wave(hosts, concurrency, expected):
    assert fanout_deadline(15.0, hosts, concurrency) == expected


def test_the_storm_rule_needs_another_in_flight():
    assert not ssh_mod.SSHPool._storm(1) and ssh_mod.SSHPool._storm(2)
