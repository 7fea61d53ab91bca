"""The lab's own emulators, as `mctl lab up` wires them: an NMX-M per rack, IMEX on every tray.

Only what the registry adds is checked here; the emulators' behaviour has its
own tests (test_nmx_emulator.py, test_imex_emulator.py).
"""

from __future__ import annotations

import json
import stat
import time
from pathlib import Path

from mctl.inventory import load_site


def test_rack_has_an_nmx_endpoint_with_private_credentials(lab):
    site = load_site(lab.inventory)
    nmx = site.racks[lab.rack].nmx
    assert nmx is not None and nmx.verify_tls is False
    assert nmx.url == f"http://{lab.addresses[lab.trays[0]].rsplit('.', 1)[0]}.200:8443"
    cred = Path(nmx.credentials_file)
    assert cred.is_relative_to(lab.dir)                    # removed by `lab down` with the rest
    assert stat.S_IMODE(cred.stat().st_mode) == 0o600
    user, password = cred.read_text().strip().split(":", 1)
    assert user == "admin" and len(password) >= 16


def test_nmx_emulator_knows_the_racks_trays_and_domain(lab):
    from mctl.fabric.nmx import NMXClient

    site = load_site(lab.inventory)
    rack = site.racks[lab.rack]
    client = NMXClient.for_rack(site, rack)
    nodes = client.compute_nodes()
    assert sorted(n.name for n in nodes) == sorted(lab.trays)
    assert {n.domain_uuid.lower() for n in nodes} == {rack.nvlink_domain.lower()}
    assert len(client.gpus()) == 4 * len(lab.trays)
    status = lab.mctl("lab", "status", "--dir", str(lab.dir), "--json")
    assert status.returncode == 0, status.stderr
    svc = json.loads(status.stdout)["rack_services"]
    assert [(s["rack"], s["name"], s["running"], s["listening"]) for s in svc] == [
        (lab.rack, "nmx", True, True), (lab.rack, "aptrepo", True, True),     # + the lab's apt repository (issue 21)
        (lab.rack, "ntp", True, None)]          # + its time server (issue 21.7; UDP: no TCP listener to check)


def test_imex_emulator_is_installed_as_the_nvidia_imex_unit(lab):
    tray = lab.trays[0]
    out = lab.run(tray, "test -x /usr/bin/nvidia-imex && test -x /usr/bin/nvidia-imex-ctl && "
                        "grep -c '^ExecStart=/usr/bin/nvidia-imex -c /etc/nvidia-imex/config.cfg$' "
                        "/lib/systemd/system/nvidia-imex.service").stdout
    assert out.strip() == "1"
    # Installing it kept the image's merged /usr: /lib is still the link, the packages' units are still there.
    assert lab.run(tray, "readlink /lib").stdout.strip() == "usr/lib"
    assert lab.run(tray, "test -f /lib/systemd/system/munge.service", check=False).returncode == 0
    head = lab.run(lab.head, "test -e /usr/bin/nvidia-imex", check=False)
    assert head.returncode != 0                              # trays only: a head node has no GPUs


def test_refresh_rewrites_the_config_and_the_emulator_reloads(lab):
    """A tray that restarts gets a new /proc/<init>/root: refresh_nmx tells the running emulator."""
    from mctl.lab import control, services

    record = control.load_record(lab.dir)
    layout = control.layout_of(record)
    ctx = services.RackContext(layout, lab.rack, 1, layout.service_address(1), lab.dir, lab.dir / "racks" / lab.rack)
    log = services.nmx_files(ctx)["log"]
    before = log.read_text().count("reloaded tray paths")
    assert services.refresh_nmx(ctx) is not None
    deadline = time.monotonic() + 10
    while log.read_text().count("reloaded tray paths") == before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert log.read_text().count("reloaded tray paths") == before + 1
