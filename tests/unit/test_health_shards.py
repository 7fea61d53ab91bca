"""Shards and the leader lease's settings (issue 29.6/29.7): the inventory's `health.shards` and
`health.failover`, `--shard`/`--rack-set` of `mctl health watch`: bad input is exit 2 with a hint, before
anything starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from mctl.errors import InventoryError, UsageError
from mctl.health.failover import lease_key
from mctl.health.site_view import resolve_shard
from mctl.inventory import load_site
from mctl.model.settings import FailoverSettings, HealthSettings
from tests.unit.cli_helpers import run_cli

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "inventories" / "example-gb200" / "mctl.yml"


def site_with(tmp_path: Path, health_extra: str) -> Path:
    text = EXAMPLE.read_text().replace("images_dir: ../../images", f"images_dir: {REPO / 'images'}")
    text = text.replace("health:\n  interval: 60\n", "health:\n  interval: 60\n" + health_extra, 1)
    d = tmp_path / "site"
    d.mkdir(exist_ok=True)
    (d / "mctl.yml").write_text(text)
    return d


SHARDS = "  shards:\n    pod-a: [rack-a]\n    pod-b: [rack-b]\n"


def test_shards_and_failover_are_read_from_the_inventory(tmp_path):
    site = load_site(site_with(tmp_path, SHARDS + "  failover:\n    etcd: [http://10.0.0.1:2379, "
                                                  "http://10.0.0.2:2379]\n    ttl: 20s\n"))
    assert site.health.shards == {"pod-a": ("rack-a",), "pod-b": ("rack-b",)}
    f = site.health.failover
    assert f.enabled and f.etcd == ("http://10.0.0.1:2379", "http://10.0.0.2:2379") and f.ttl_s == 20
    assert f.ttl_for(60) == 20 and f.key_prefix == "/mctl"
    assert lease_key(f, site.name, "pod-a") == f"/mctl/{site.name}/watch/pod-a"
    # travels with the node check's settings and comes back the same
    assert HealthSettings.from_dict(site.health.to_dict()) == site.health


def test_without_configuration_the_watch_runs_alone():
    f = HealthSettings().failover
    assert not f.enabled and HealthSettings().shards == {}
    assert f.ttl_for(60) == 60 and f.ttl_for(0.5) == 2      # the interval, at least etcd's shortest lease
    assert FailoverSettings(ttl_s=7.2).ttl_for(60) == 8


@pytest.mark.parametrize("extra, words", [
    ("  shards:\n    pod-a: [rack-a, rack-x]\n", "unknown rack 'rack-x' in shard pod-a"),
    ("  shards:\n    pod-a: [rack-a]\n    pod-b: [rack-a, rack-b]\n", "rack rack-a is in shards pod-a and pod-b"),
    ("  shards:\n    pod-a: []\n", "shard pod-a has no racks"),
    ("  failover:\n    etcd: [10.0.0.1:2379]\n", "is not a URL"),
    ("  failover:\n    etcd: [http://10.0.0.1:2379]\n    ttl: 1s\n", "shorter than 2s"),
])
def test_bad_shards_and_failover_settings_are_refused_at_their_line(tmp_path, extra, words):
    with pytest.raises(InventoryError) as exc:
        load_site(site_with(tmp_path, extra))
    text = str(exc.value) + " ".join(str(p) for p in getattr(exc.value, "problems", ()))
    assert words in text, text


def test_resolve_shard(tmp_path):
    site = load_site(site_with(tmp_path, SHARDS))
    assert resolve_shard(site, None, None).whole_site
    assert resolve_shard(site, "pod-b", None).racks == ("rack-b",)
    assert resolve_shard(site, None, "rack-a").name == "pod-a"          # the map's shard with those racks
    with pytest.raises(UsageError, match="cuts across"):
        resolve_shard(site, None, "rack-a,rack-b")
    with pytest.raises(UsageError, match="unknown shard 'pod-c'") as exc:
        resolve_shard(site, "pod-c", None)
    assert "pod-a, pod-b" in exc.value.hint
    with pytest.raises(UsageError, match="unknown rack rack-z") as exc:
        resolve_shard(site, None, "rack-z")
    assert "rack-a, rack-b" in exc.value.hint
    with pytest.raises(UsageError, match="both given"):
        resolve_shard(site, "pod-a", "rack-a")
    bare = load_site(site_with(tmp_path, ""))
    assert resolve_shard(bare, None, "rack-a,rack-b") == resolve_shard(bare, None, "rack-b,rack-a")
    assert resolve_shard(bare, None, "rack-a,rack-b").name == "racks-rack-a+rack-b"


@pytest.mark.parametrize("args, words", [
    (["--shard", "pod-c"], "unknown shard 'pod-c'"),
    (["--rack-set", "rack-z"], "unknown rack rack-z"),
    (["--rack-set", "rack-a", "rack-a-tray01"], "--rack-set/--shard both given"),
])
def test_watch_refuses_bad_shards_with_exit_2(tmp_path, capsys, args, words):
    site = site_with(tmp_path, SHARDS)
    r = run_cli(capsys, "-i", str(site), "--state-dir", str(tmp_path / "state"), "health", "watch", *args,
                "--sweeps", "1")
    assert r.code == 2, (r.out, r.err)
    assert words in r.err, r.err
