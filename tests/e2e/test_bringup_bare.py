"""`mctl rack bring-up` from bare trays, in one command: a lab of its own started OS-only (`mctl lab up`'s default).

The trays have the OS image only: no nvidia-smi, no IMEX, no DCGM. The inventory phase asks the
trays' BMCs and NMX-M for the GPUs and leaves the tools to provisioning; provisioning installs
them through the lab's apt repository; the rack is inventoried again (the full shape) and opened
in Slurm. Before that, one case that must block: a tray whose BMC does not answer (so nothing
vouches for its GPUs) stops the run at the inventory, before anything is installed.

The shared session lab stays pre-tooled (tests/lab_fixture.py): its other tests read the GPUs
before they provision anything; the shared lab's own bring-up is tests/e2e/test_bringup.py.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

TIMEOUT = 1800
BARE_TRAYS_ENV = "MCTL_TEST_BARE_TRAYS"     # trays of the bare lab (default 2)


@pytest.fixture(scope="module")
def bare(own_lab, long_run, tmp_path_factory):
    with own_lab(tmp_path_factory.mktemp("mctl-state-bare"), trays=int(os.environ.get(BARE_TRAYS_ENV) or 2),
                 label="bare lab", os_only=True) as handle:
        yield handle


def bring_up(lab, *args: str, inventory=None):
    prefix = ("-i", str(inventory)) if inventory else ()
    proc = lab.mctl(*prefix, "--json", "rack", "bring-up", lab.rack, "--trust-new-keys", *args, timeout=TIMEOUT)
    try:
        data = json.loads(proc.stdout)
    except ValueError:
        data = None
    return proc, data


def phase(data: dict, name: str) -> dict:
    return next(p for p in data["phases"] if p["phase"] == name)


def test_a_tray_whose_bmc_cannot_vouch_for_its_gpus_blocks_before_anything_is_installed(bare, tmp_path):
    """Missing GPU tools are provisioning's only where the BMC and NMX-M show the GPUs: a hung BMC shows nothing."""
    hung = bare.trays[-1]
    doc = yaml.safe_load(bare.inventory.read_text())
    doc["bmc"]["deadline_s"] = 5.0                          # the hung BMC costs 5 s, not the default minute
    site = tmp_path / "mctl.yml"
    site.write_text(yaml.safe_dump(doc, sort_keys=False))
    fault = bare.mctl("lab", "fault", "bmc", hung, "--hang", "--dir", str(bare.dir))
    assert fault.returncode == 0, fault.stderr
    try:
        proc, data = bring_up(bare, "--until", "provision", inventory=site)
    finally:
        bare.clear_faults(hung)
    assert proc.returncode == 1, proc.stderr + proc.stdout[-3000:]
    inv = phase(data, "inventory")
    assert data["failed_phase"] == "inventory" and inv["status"] == "failed"
    said = "\n".join(inv["details"])
    assert f"{hung} gpu.out-of-band: nvidia-smi is not installed (command not found), and the BMC could not be " \
           "read" in said, said
    # the others were vouched for (BMC and NMX-M show their 4 GPUs): not findings (the journal keeps which)
    journal = json.loads(Path(data["journal"]).read_text())
    artifacts = next(p for p in journal["phases"] if p["name"] == "inventory")["artifacts"]
    assert sorted(artifacts["to_install"]) == [t for t in bare.trays if t != hung], artifacts
    assert phase(data, "provision")["status"] == "pending"
    for tray in bare.trays:                                 # nothing was installed
        out = bare.run(tray, "dpkg-query -W nvidia-utils-570 2>&1; command -v nvidia-smi; true").stdout
        assert "no packages found matching nvidia-utils-570" in out and "/usr/bin/nvidia-smi" not in out


def test_bare_trays_to_schedulable_in_one_command(bare):
    proc, data = bring_up(bare)
    assert proc.returncode == 0, f"bring-up failed ({proc.returncode}): {proc.stderr}\n{proc.stdout[-4000:]}"
    assert data["status"] == "succeeded" and not data["already_up"]
    inv = phase(data, "inventory")
    assert "provisioning installs the GPU tools on" in inv["summary"], inv
    for tray in bare.trays:
        assert f"{tray}: nvidia-smi not installed yet: provisioning installs the GPU tools (BMC 4/4, NMX-M 4/4 " \
               "GPUs)" in inv["details"], inv["details"]
    prov = phase(data, "provision")
    gpus = 4 * len(bare.trays)
    assert prov["status"] == "done" and f"inventory again: {len(bare.trays)} trays, {gpus} GPUs" in prov["summary"]
    assert data["summary"]["trays"]["open"] == len(bare.trays), data["summary"]
    # every component of the image is on the trays now, read from dpkg's database and the tools
    diff = bare.mctl("--json", "image", "diff", bare.rack, timeout=120)
    assert diff.returncode == 0, diff.stdout + diff.stderr
    for tray in json.loads(diff.stdout)["trays"]:
        statuses = {c["component"]: c["status"] for c in tray["components"]}
        assert set(statuses.values()) == {"match"}, statuses
        assert {"imex", "dcgm", "doca_ofed", "munge", "enroot", "pyxis", "slurm"} <= set(statuses)
    # run again: already up, nothing changed (no second look at the BMCs: every tray has its tools)
    again, redo = bring_up(bare)
    assert again.returncode == 0 and redo["already_up"], again.stderr
