"""State directory helpers: atomic writes, locks that name their holder, snapshots."""

import json
import os
import time
from datetime import datetime, timedelta, timezone

import pytest

from mctl.errors import EnvironmentProblem
from mctl.state import (LockBusy, atomic_write, latest_snapshot, list_snapshots, rack_lock, rack_lock_path,
                        read_json, save_snapshot, write_json)


def test_atomic_write_replaces_whole_file_and_keeps_mode(tmp_path):
    p = tmp_path / "sub" / "f.txt"
    atomic_write(p, "one\n", mode=0o600)
    assert p.read_text() == "one\n" and (p.stat().st_mode & 0o777) == 0o600
    atomic_write(p, b"two\n")
    assert p.read_text() == "two\n" and (p.stat().st_mode & 0o777) == 0o600
    assert [x.name for x in p.parent.iterdir()] == ["f.txt"]   # no temp files left behind


def test_atomic_write_failure_leaves_old_content(tmp_path):
    p = tmp_path / "f.json"
    write_json(p, {"a": 1})
    with pytest.raises(TypeError):
        atomic_write(p, 12345)  # not str/bytes
    assert read_json(p) == {"a": 1}
    assert [x.name for x in tmp_path.iterdir()] == ["f.json"]


def test_read_json_reports_damage_as_operator_error(tmp_path):
    p = tmp_path / "bad.json"
    p.write_text("{not json")
    with pytest.raises(EnvironmentProblem) as err:
        read_json(p)
    assert "bad.json" in err.value.message


def test_rack_lock_is_exclusive_and_names_holder(tmp_path, held_lock):
    with held_lock(rack_lock_path(tmp_path, "rack-a"), "bring-up") as pid:
        with pytest.raises(LockBusy) as err:
            with rack_lock(tmp_path, "rack-a"):
                pass
        assert f"pid {pid}" in err.value.message and "bring-up" in err.value.message
        with rack_lock(tmp_path, "rack-b"):   # other racks are independent
            pass
    with rack_lock(tmp_path, "rack-a", timeout=2):  # free again once the holder ended
        pass


def test_lock_waits_up_to_timeout(tmp_path, held_lock):
    with held_lock(rack_lock_path(tmp_path, "rack-a"), "bring-up"):
        start = time.monotonic()
        with pytest.raises(LockBusy):
            with rack_lock(tmp_path, "rack-a", timeout=0.5):
                pass
        assert time.monotonic() - start >= 0.45


def test_snapshots_are_time_ordered_and_pruned(tmp_path):
    t0 = datetime(2025, 9, 13, 10, 0, tzinfo=timezone.utc)
    for i in range(5):
        save_snapshot(tmp_path, "inventory", "rack-a", {"n": i}, taken_at=t0 + timedelta(minutes=i), keep=3)
    paths = list_snapshots(tmp_path, "inventory", "rack-a")
    assert len(paths) == 3
    latest = latest_snapshot(tmp_path, "inventory", "rack-a")
    assert latest.data == {"n": 4} and latest.taken_at == t0 + timedelta(minutes=4)
    assert latest_snapshot(tmp_path, "inventory", "rack-b") is None
    # same instant twice: both kept, order preserved
    save_snapshot(tmp_path, "inventory", "rack-c", {"n": 1}, taken_at=t0)
    save_snapshot(tmp_path, "inventory", "rack-c", {"n": 2}, taken_at=t0)
    assert latest_snapshot(tmp_path, "inventory", "rack-c").data == {"n": 2}
    assert json.loads(list_snapshots(tmp_path, "inventory", "rack-c")[0].read_text()) == {"n": 1}
    assert os.path.basename(paths[-1]).startswith("20250913T100400")
