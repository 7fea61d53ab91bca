"""Usage errors of exec, ssh trust and rack inventory: exit 2 before any host is contacted."""

from pathlib import Path

from tests.unit.cli_helpers import run_cli

EXAMPLE = str(Path(__file__).resolve().parents[2] / "inventories" / "example-gb200")


def test_exec_needs_a_command(capsys):
    r = run_cli(capsys, "-i", EXAMPLE, "exec", "rack-a")
    assert r.code == 2 and "no command given" in r.err and "mctl exec lab-r1 -- uname -r" in r.err


def test_exec_unknown_nodes_list_known_racks(capsys):
    r = run_cli(capsys, "-i", EXAMPLE, "exec", "rack-a-tray[18-19]", "--", "true")
    assert r.code == 2 and "unknown host rack-a-tray19" in r.err and "known racks: rack-a, rack-b" in r.err


def test_ssh_trust_unknown_group(capsys):
    r = run_cli(capsys, "-i", EXAMPLE, "ssh", "trust", "@gpu")
    assert r.code == 2 and "unknown group @gpu" in r.err


def test_rack_inventory_input_errors(capsys):
    r = run_cli(capsys, "-i", EXAMPLE, "rack", "inventory", "rack-z")
    assert r.code == 2 and "unknown rack rack-z" in r.err and "known racks: rack-a, rack-b" in r.err
    r = run_cli(capsys, "-i", EXAMPLE, "rack", "inventory")
    assert r.code == 2 and "no rack given" in r.err
    r = run_cli(capsys, "-i", EXAMPLE, "rack", "inventory", "rack-a", "--all")
    assert r.code == 2 and "not both" in r.err


def test_help_has_examples(capsys):
    for args in (("exec", "--help"), ("ssh", "trust", "--help"), ("rack", "inventory", "--help")):
        r = run_cli(capsys, *args)
        assert r.code == 0 and "Example: mctl" in r.out
