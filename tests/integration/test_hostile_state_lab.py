"""Damaged state and held locks against the lab (issue 17): refused, named, nothing done on the trays."""

from __future__ import annotations

import json

from mctl.health import store
from mctl.state import rack_lock_path


def test_damaged_health_state_stops_remediation_before_any_tray_is_asked(lab):
    path = store.state_path(lab.state_dir)
    saved = path.read_bytes() if path.exists() else None
    log = store.actions_path(lab.state_dir)
    log_before = log.read_bytes() if log.exists() else None
    damaged = json.dumps({"schema": 1, "trays": {lab.trays[0]: {"host": lab.trays[0], "misses": "many"}}}).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(damaged)
    try:
        for words in (("health", "check", "--remediate"), ("health", "watch", "--remediate", "--sweeps", "1")):
            proc = lab.mctl(*words, timeout=120)
            assert proc.returncode == 2, (words, proc.stdout, proc.stderr)
            assert str(path) in proc.stderr and f"trays.{lab.trays[0]}.misses" in proc.stderr
            assert "Traceback" not in proc.stderr and proc.stdout == ""
            assert path.read_bytes() == damaged
            assert (log.read_bytes() if log.exists() else None) == log_before
    finally:
        if saved is None:
            path.unlink()
        else:
            path.write_bytes(saved)


def test_imex_apply_is_refused_while_a_bring_up_holds_the_rack(lab, held_lock):
    with held_lock(rack_lock_path(lab.state_dir, lab.rack), "mctl rack bring-up") as pid:
        result = lab.mctl("imex", "apply", lab.rack, "--restart")
        assert result.returncode == 2 and result.stdout == ""
        assert f"rack {lab.rack} is locked by pid {pid}" in result.stderr and "rack bring-up" in result.stderr
        dry = lab.mctl("imex", "apply", lab.rack, "--dry-run")
        assert dry.returncode in (0, 1, 3), dry.stderr          # a dry run goes on, naming the holder
        assert f"rack {lab.rack} is locked by pid {pid}" in dry.stderr
