"""Host expressions: node sets, rack names, groups, and refusing unknown names."""

from pathlib import Path

import pytest

from mctl.errors import UsageError
from mctl.inventory import load_site
from mctl.transport import resolve_hosts, targets_for

EXAMPLE = Path(__file__).resolve().parents[2] / "inventories" / "example-gb200"


@pytest.fixture(scope="module")
def site():
    return load_site(EXAMPLE)


def names(hosts):
    return [h.name for h in hosts]


def test_node_set_expands_in_inventory_order(site):
    assert names(resolve_hosts(site, "rack-a-tray[03,01-02]")) == ["rack-a-tray01", "rack-a-tray02", "rack-a-tray03"]


def test_rack_name_means_its_compute_trays(site):
    hosts = resolve_hosts(site, "rack-b")
    assert len(hosts) == 18 and all(h.role == "compute" and h.rack == "rack-b" for h in hosts)
    assert names(resolve_hosts(site, "@rack-b")) == names(hosts)


def test_operators_apply_to_rack_names_and_groups(site):
    hosts = resolve_hosts(site, "rack-a!rack-a-tray[02-18],rack-a-head")
    assert names(hosts) == ["rack-a-head", "rack-a-tray01"]
    assert len(resolve_hosts(site, "@all")) == 2 * 18 + 2 * 9 + 1
    assert len(resolve_hosts(site, "@*")) == len(resolve_hosts(site, "@all"))
    assert names(resolve_hosts(site, "@head")) == ["rack-a-head"]
    assert len(resolve_hosts(site, "@compute&rack-a-tray[01-40]")) == 18


def test_roles_filter(site):
    assert all(h.role == "compute" for h in resolve_hosts(site, "@all", roles=["compute"]))


@pytest.mark.parametrize("expr, fragment", [
    ("rack-c", "unknown host rack-c"),
    ("rack-a-tray[17-19]", "unknown host rack-a-tray19"),
    ("@nope", "unknown group @nope"),
    ("rack-a-tray[01-", "bad node set"),
    ("  ", "empty host expression"),
])
def test_unknown_names_are_usage_errors_listing_racks(site, expr, fragment):
    with pytest.raises(UsageError) as err:
        resolve_hosts(site, expr)
    assert fragment in err.value.message
    if "unknown" in fragment or "empty" in fragment:
        assert "rack-a, rack-b" in err.value.hint


def test_targets_use_site_ssh_settings_and_ansible_overrides(site):
    t = targets_for(site, resolve_hosts(site, "rack-a-tray01"))[0]
    assert (t.name, t.address, t.port, t.user) == ("rack-a-tray01", "10.20.1.11", 22, "root")
