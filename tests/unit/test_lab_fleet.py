"""Fleet mode's pure parts (mctl/lab/fleet.py): which sshd listens where, which host an address is, and
where a tray's files lie in its rack host."""

from __future__ import annotations

from mctl.lab import fleet, hosts
from mctl.lab.layout import LabLayout


def test_a_rack_of_19_addresses_gets_two_sshd_of_at_most_16_each_covering_every_host():
    layout = LabLayout("lab", 2, 18, 150)
    argvs = fleet.sshd_argvs(layout, "lab-r2")
    listened = [a.split("=", 1)[1] for argv in argvs for a in argv if a.startswith("ListenAddress=")]
    assert len(argvs) == 2 and all(sum(a.startswith("ListenAddress=") for a in v) <= fleet.MAX_LISTEN for v in argvs)
    assert sorted(listened) == sorted(f"{h.address}:22" for h in layout.hosts() if h.rack == "lab-r2")
    assert len({a for v in argvs for a in v if a.startswith("PidFile=")}) == 2       # one pid file each


def test_each_address_names_its_own_host_in_the_sshd_dropin():
    layout = LabLayout("lab", 1, 3, 150)
    text = fleet.sshd_config(layout, "lab-r1")
    assert "ListenAddress" not in text                       # on the command line (at most 16 a process)
    blocks = text.split("Match LocalAddress ")[1:]
    assert [b.split()[0] for b in blocks] == [h.address for h in layout.hosts()]
    assert [b.split()[-1] for b in blocks] == [h.name for h in layout.hosts()]
    assert all(f"ForceCommand {fleet.FLEET_SESSION} " in b for b in blocks)


def test_a_trays_paths_map_into_its_own_folder_of_the_rack_host():
    assert fleet.inner_path("lab-r1-tray02", hosts.GPUS_FILE) == "/var/lib/mctl-fleet/lab-r1-tray02/state/gpus.json"
    assert fleet.inner_path("lab-r1-tray02", hosts.KERN_LOG) == "/var/lib/mctl-fleet/lab-r1-tray02/kern.log"
    assert fleet.inner_path("lab-r1-tray02", "/etc/hostname") == "/var/lib/mctl-fleet/lab-r1-tray02/hostname"
    assert fleet.inner_path("lab-r1-tray02", "/etc/ssh/sshrc") == "/etc/ssh/sshrc"      # shared: the rack's
    assert fleet.rack_host("lab-r12") == "lab-r12-fleet"


def test_the_session_script_binds_exactly_the_paths_the_mapping_names():
    script = fleet.SESSION_SCRIPT
    assert f'mount --bind "$d/state" {hosts.STATE_IN_HOST} ' in script
    assert f'mount --bind "$d/kern.log" {hosts.KERN_LOG} ' in script
    assert 'mount --bind "$d/hostname" /etc/hostname ' in script
    assert "@" not in script                                 # every placeholder filled
