"""Recording partitions in mctl.yml: only the rack's partitions block changes; the rest stays byte for byte."""

from __future__ import annotations

from pathlib import Path

import pytest

from mctl.errors import InventoryError, UsageError
from mctl.fabric.partitions import template_partitions
from mctl.fabric.record import edit_partitions, write_edit
from mctl.inventory import load_site
from mctl.model.site import Partition

INVENTORY = """\
# Site inventory with comments that must survive.
plugin: mctl
site: t
racks:
  ra:   # first rack
    model: nvl72
    shape: {compute_trays: 4, switch_trays: 0}
    compute:
      nodes: ra-tray[01-04]
      addresses: 10.1.0.[1-4]
    # partitions follow
    partitions:
    - name: old
      trays: ra-tray[01-02]   # indentless sequence
    # a comment after the block belongs to the rack, not to the block

  rb:
    model: nvl72
    shape: {compute_trays: 4, switch_trays: 0}
    compute:
      nodes: rb-tray[01-04]
      addresses: 10.2.0.[1-4]
    # rb has no partitions key

  rc:
    model: nvl72
    shape: {compute_trays: 2, switch_trays: 0}
    compute: {nodes: "rc-tray[01-02]", addresses: "10.3.0.[1-2]"}
    partitions: [{name: z, trays: rc-tray01}]
# end of racks
scheduler:
  type: slurm
"""


@pytest.fixture()
def inv(tmp_path: Path) -> Path:
    path = tmp_path / "mctl.yml"
    path.write_text(INVENTORY)
    path.chmod(0o640)
    return path


def test_replace_indentless_block_and_keep_everything_else(inv: Path):
    site = load_site(inv)
    edit = edit_partitions(site, "ra", template_partitions(site.racks["ra"], "2x9"))
    assert edit.changed
    removed = [ln for ln in edit.old_text.splitlines() if ln not in edit.new_text.splitlines()]
    assert removed == ["    - name: old", "      trays: ra-tray[01-02]   # indentless sequence"]
    assert "    partitions:\n      - name: p0\n        trays: ra-tray[01-02]\n      - name: p1\n" \
           "        trays: ra-tray[03-04]\n    # a comment after the block" in edit.new_text
    backup = write_edit(edit)
    assert backup == inv.with_name("mctl.yml.bak") and backup.read_text() == INVENTORY
    assert oct(inv.stat().st_mode & 0o777) == "0o640"
    again = load_site(inv)
    assert [(p.name, p.nodeset) for p in again.racks["ra"].partitions] == [("p0", "ra-tray[01-02]"),
                                                                          ("p1", "ra-tray[03-04]")]
    assert write_edit(edit_partitions(again, "ra", list(again.racks["ra"].partitions))) is None


def test_add_block_where_there_was_none(inv: Path):
    site = load_site(inv)
    edit = edit_partitions(site, "rb", [Partition("all", "rb", tuple(h.name for h in site.racks["rb"].compute))])
    new = edit.new_text
    assert "      addresses: 10.2.0.[1-4]\n    partitions:\n      - name: all\n        trays: rb-tray[01-04]\n" \
           "    # rb has no partitions key\n" in new
    write_edit(edit)
    assert load_site(inv).racks["rb"].partitions[0].trays == ("rb-tray01", "rb-tray02", "rb-tray03", "rb-tray04")


def test_flow_style_and_empty(inv: Path):
    site = load_site(inv)
    edit = edit_partitions(site, "rc", [])
    assert "    partitions: []\n# end of racks\n" in edit.new_text
    assert edit.new_text.count("\n") == INVENTORY.count("\n")
    write_edit(edit)
    assert load_site(inv).racks["rc"].partitions == ()


def test_invalid_result_is_refused_before_writing(inv: Path):
    site = load_site(inv)
    with pytest.raises(InventoryError) as exc:
        edit_partitions(site, "ra", [Partition("p", "ra", ("rb-tray01",))])
    assert "belongs to rack rb" in exc.value.message and str(inv) in exc.value.message
    assert inv.read_text() == INVENTORY


def test_concurrent_change_is_detected(inv: Path):
    site = load_site(inv)
    edit = edit_partitions(site, "ra", [])
    inv.write_text(INVENTORY + "# someone else\n")
    with pytest.raises(UsageError, match="changed while mctl was editing"):
        write_edit(edit)
