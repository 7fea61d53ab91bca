"""`mctl rack validate` takes the rack's lock (it allocates Slurm nodes): refused while another command holds it,
and its dry run is not (mctl/cli/rack_validate.py)."""

from __future__ import annotations

from tests.helpers import site_with
from tests.unit.cli_helpers import run_cli


def test_validate_is_refused_while_the_rack_is_locked_and_its_dry_run_is_not(tmp_path, capsys, held_lock):
    from mctl.state.lock import rack_lock_path

    site = tmp_path / "site"
    site.mkdir()
    site_with(site, trays=4, parts=[{"name": "p0", "trays": "r1-tray[01-04]"}])
    state = tmp_path / "state"
    base = ("-i", str(site), "--state-dir", str(state), "rack", "validate", "r1")
    with held_lock(rack_lock_path(state, "r1"), "mctl rack bring-up") as pid:
        refused = run_cli(capsys, *base)
        assert refused.code == 2 and str(pid) in refused.err and "mctl rack bring-up" in refused.err, refused.err
        dry = run_cli(capsys, *base, "--dry-run")
        assert dry.code == 0 and "r1-tray[01-04]" in dry.out and "is locked" in dry.err, (dry.out, dry.err)
