"""The watch session: what configure() makes of the options and the inventory (nothing started), and no rich."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from mctl.errors import UsageError
from mctl.health.session import NO_SCHEDULER, WatchSession
from tests.helpers import site_with

HEALTH = Path(__file__).resolve().parents[2] / "mctl" / "health"


def test_defaults_from_the_inventory_and_the_view(tmp_path):
    site = site_with(tmp_path)
    warned: list[str] = []
    s = WatchSession.configure(site, tmp_path / "state", None, on_warning=warned.append)
    assert warned == []
    assert s.interval == float(s.settings.interval) and s.remediate is s.settings.remediate
    assert s.locks is (s.settings.remediate and not s.dry_run)
    assert s.view.racks == {"r1": ["r1-tray01", "r1-tray02", "r1-tray03", "r1-tray04"]}
    assert s.view.interval == s.interval and s.view.site == site.name and s.sweeps_done == 0
    assert s.port is None and s.textfile is None and s.listen == "127.0.0.1"


def test_options_win_and_a_dry_run_takes_no_lock(tmp_path):
    site = site_with(tmp_path)
    s = WatchSession.configure(site, tmp_path, "r1-tray[02-03]", interval=3, remediate=True, dry_run=True,
                               metrics_port=9999, metrics_textfile=tmp_path / "m.prom", sweeps=2, timeout=4.0)
    assert s.interval == 3.0 and s.remediate and s.dry_run and not s.locks
    assert s.view.racks == {"r1": ["r1-tray02", "r1-tray03"]}
    assert (s.port, s.textfile, s.max_sweeps, s.timeout) == (9999, tmp_path / "m.prom", 2, 4.0)


def test_no_scheduler_watches_without_remediation(tmp_path):
    site = site_with(tmp_path, scheduler=None)
    warned: list[str] = []
    s = WatchSession.configure(site, tmp_path, None, remediate=True, on_warning=warned.append)
    assert warned == [NO_SCHEDULER] and not s.remediate and not s.locks and not s.view.remediate


def test_bad_listen_address_and_listen_without_port(tmp_path):
    site = site_with(tmp_path)
    with pytest.raises(UsageError, match="^--metrics-listen: ") as exc:
        WatchSession.configure(site, tmp_path, None, metrics_port=9464, metrics_listen="not an address")
    assert exc.value.exit_code == 2 and "127.0.0.1" in exc.value.hint
    with pytest.raises(UsageError, match="needs a port"):
        WatchSession.configure(site, tmp_path, None, metrics_listen="127.0.0.1")


def test_health_library_imports_no_renderer():
    """The watch's screen lives in mctl/cli; mctl/health never imports rich."""
    offenders = []
    for path in sorted(HEALTH.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            offenders += [f"{path.name}: {n}" for n in names if n == "rich" or n.startswith("rich.")]
    assert offenders == []
