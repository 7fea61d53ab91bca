"""The lab's pure parts: layout, GPU identities, faults, its inventory, the image definition, bad input."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from mctl.errors import EnvironmentProblem, UsageError
from mctl.inventory import load_site
from mctl.lab import faults, image, prereq
from mctl.lab.gpus import DEFAULT_CLIQUE_ID, gpu_state
from mctl.lab.layout import LabLayout, etc_hosts
from mctl.lab.site import REPO_IMAGES, inventory
from tests.unit.cli_helpers import run_cli


def test_layout_follows_the_contract():
    lay = LabLayout("lab", racks=2, trays=3)
    hosts = {h.name: h for h in lay.hosts()}
    assert list(hosts) == ["lab-r1-head", "lab-r1-tray01", "lab-r1-tray02", "lab-r1-tray03",
                           "lab-r2-head", "lab-r2-tray01", "lab-r2-tray02", "lab-r2-tray03"]
    assert hosts["lab-r2-tray03"].address == "127.77.2.3" and hosts["lab-r2-tray03"].tray_index == 2
    assert hosts["lab-r1-head"].address == "127.77.1.100"
    assert lay.service_address(2) == "127.77.2.200"
    assert lay.nvlink_domain("lab-r1") == str(uuid.uuid5(uuid.NAMESPACE_URL, "mctl-lab/lab/lab-r1"))
    assert lay.nvlink_domain("lab-r1") != lay.nvlink_domain("lab-r2")
    assert LabLayout("lab", 1, 2, net=201).hosts()[1].address == "127.201.1.1"
    text = etc_hosts(lay)
    assert "127.77.2.2\tlab-r2-tray02" in text and text.startswith("127.0.0.1\tlocalhost")
    for bad in ({"racks": 0, "trays": 1}, {"racks": 1, "trays": 19}, {"racks": 1, "trays": 1, "net": 0}):
        with pytest.raises(ValueError):
            LabLayout("lab", **bad)


def test_gpu_identities_are_stable_and_distinct():
    lay = LabLayout("lab", racks=2, trays=18)
    trays = [h for h in lay.hosts() if h.kind == "tray"]
    states = [gpu_state(lay, h) for h in trays]
    assert states == [gpu_state(LabLayout("lab", 2, 18), h) for h in trays]          # stable
    uuids = [g["uuid"] for s in states for g in s["gpus"]]
    guids = [g["gpu_fabric_guid"] for s in states for g in s["gpus"]]
    assert len(set(uuids)) == len(uuids) == 144 and len(set(guids)) == 144
    s = states[2]
    assert s["hostname"] == "lab-r1-tray03" and s["tray_index"] == 2 and s["slot_number"] == 3
    assert s["cluster_uuid"] == lay.nvlink_domain("lab-r1") and s["clique_id"] == DEFAULT_CLIQUE_ID
    assert (s["fabric_state"], s["fabric_status"]) == ("Completed", "Success")
    assert [g["module_id"] for g in s["gpus"]] == [2, 1, 4, 3]
    assert s["gpus"][0]["serial"] == s["gpus"][1]["serial"] != s["gpus"][2]["serial"]   # two GPUs per board
    assert all(len(g["serial"]) == 13 and g["serial"].isdigit() for g in s["gpus"])
    assert {st["chassis_serial"] for st in states[:18]} != {st["chassis_serial"] for st in states[18:]}
    with pytest.raises(ValueError):
        gpu_state(lay, lay.hosts()[0])


def test_faults_apply_combine_and_clear():
    doc = faults.apply(None, faults.FaultRequest(xid=79, gpu=0), now=10.0)
    doc = faults.apply(doc, faults.FaultRequest(nvlink_down="1:17"), now=11.0)
    doc = faults.apply(doc, faults.FaultRequest(nvlink_down="1:17"), now=11.5)          # idempotent
    doc = faults.apply(doc, faults.FaultRequest(ecc_uncorrectable=3, gpu=2, fabric="degraded"), now=12.0)
    doc = faults.apply(doc, faults.FaultRequest(gpu_missing=3, unreachable=True), now=13.0)
    assert doc == {"fabric": "degraded", "gpu_missing": [3], "nvlink_down": [[1, 17]], "ecc_uncorrectable": {"2": 3},
                   "xid": [{"gpu": 0, "code": 79, "time": 10.0}], "unreachable": True, "hang": False}
    assert faults.active(doc) == ["fabric degraded", "gpu3 missing", "nvlink gpu1:link17 down",
                                  "gpu2 ecc uncorrectable 3", "xid 79 gpu0", "unreachable"]
    json.dumps(doc)
    assert faults.apply(doc, faults.FaultRequest(clear=True), now=14.0) == faults.empty()
    assert faults.active({}) == []


@pytest.mark.parametrize("req, words", [
    (faults.FaultRequest(), "no fault given"),
    (faults.FaultRequest(xid=79), "need --gpu"),
    (faults.FaultRequest(gpu=1), "--gpu only goes with"),
    (faults.FaultRequest(xid=79, gpu=4), "out of range"),
    (faults.FaultRequest(fabric="broken"), "unknown state"),
    (faults.FaultRequest(nvlink_down="0-3"), "expected GPU:LINK"),
    (faults.FaultRequest(nvlink_down="0:18"), "link 18 out of range"),
    (faults.FaultRequest(gpu_missing=-1), "out of range"),
    (faults.FaultRequest(ecc_uncorrectable=0, gpu=0), "at least 1"),
    (faults.FaultRequest(clear=True, hang=True), "cannot be combined"),
])
def test_fault_requests_are_validated(req, words):
    with pytest.raises(UsageError) as exc:
        faults.validate(req)
    assert words in exc.value.message or words in (exc.value.hint or "")


def test_a_fault_request_for_a_target_takes_only_its_faults_and_clears_only_them():
    doc = faults.apply(None, faults.FaultRequest(xid=79, gpu=0, nvlink_flap="1:2", hang=True, slow=2.0,
                                                 slurmd_down=True), now=1.0)
    gpu = faults.apply(doc, faults.FaultRequest(clear=True, target="gpu"), now=2.0)
    assert faults.active(gpu) == ["hang", "slow 2s", "slurmd down"] and "nvlink_flap" not in gpu
    host = faults.apply(doc, faults.FaultRequest(clear=True, target="host"), now=2.0)
    assert faults.active(host) == ["xid 79 gpu0", "nvlink gpu1:link2 flapping", "slurmd down"]
    service = faults.apply(doc, faults.FaultRequest(clear=True, target="service"), now=2.0)
    assert "slurmd_down" not in service and faults.active(service)[-1] == "slow 2s"
    everything = faults.apply(doc, faults.FaultRequest(clear=True), now=2.0)
    assert everything == faults.empty() == faults.cleared(doc, None)
    assert faults.given(faults.FaultRequest(gpu_missing=0), "gpu") and not faults.given(faults.FaultRequest(), "gpu")
    for req, words in ((faults.FaultRequest(target="host", xid=79, gpu=0), "--xid is a gpu fault, not a host one"),
                       (faults.FaultRequest(target="gpu", unreachable=True), "--freeze is a host fault"),
                       (faults.FaultRequest(target="disk"), "not a target"),
                       (faults.FaultRequest(target="service"), "--slurmd-down"),
                       (faults.FaultRequest(target="gpu"), "mctl lab fault gpu lab-r1-tray03 --xid 79 --gpu 0")):
        with pytest.raises(UsageError) as exc:
            faults.validate(req)
        assert words in exc.value.message + (exc.value.hint or ""), req


def test_every_fault_target_has_an_example_and_the_old_flat_form_is_pointed_to_it(capsys, tmp_path):
    for target in ("gpu", "host", "service", "bmc", "nmx", "clear"):
        res = run_cli(capsys, "lab", "fault", target, "--help")
        assert res.code == 0 and f"Example: mctl lab fault {target} " in res.out, target
    for old, now in ((["lab-r1-tray03", "--xid", "79", "--gpu", "0"], "mctl lab fault gpu lab-r1-tray03 --xid 79"),
                     (["lab-r1-tray03", "--freeze"], "mctl lab fault host lab-r1-tray03 --freeze"),
                     (["lab-r1-head", "--slurmctld-down"], "mctl lab fault service lab-r1-head --slurmctld-down"),
                     (["lab-r1-tray03", "--leak", "critical", "--leak-detector", "X"],
                      "mctl lab fault bmc lab-r1-tray03 --leak critical --detector X"),
                     (["lab-r1", "--nmx", "timeout"], "mctl lab fault nmx lab-r1 timeout"),
                     (["lab-r1-tray03", "--clear"], "mctl lab fault clear lab-r1-tray03")):
        res = run_cli(capsys, "lab", "fault", *old, "--dir", str(tmp_path))
        assert res.code == 2 and "is not a fault target" in res.err and now in res.err, (old, res.err)
    assert not any(tmp_path.iterdir())
    wrong = run_cli(capsys, "lab", "fault", "host", "lab-r1-tray03", "--xid", "79", "--dir", str(tmp_path))
    assert wrong.code == 2 and "No such option: --xid" in wrong.err
    none = run_cli(capsys, "lab", "fault", "service", "lab-r1-tray03", "--dir", str(tmp_path))
    assert none.code == 2 and "no lab in" in none.err


def test_lab_inventory_loads_as_an_ordinary_site(tmp_path):
    lay = LabLayout("lab", racks=2, trays=4, net=201)
    (tmp_path / "mctl.yml").write_text(inventory(lay, identity_file=tmp_path / "ssh/id_ed25519",
                                                 known_hosts=tmp_path / "known_hosts"))
    site = load_site(tmp_path)
    assert list(site.racks) == ["lab-r1", "lab-r2"]
    r2 = site.racks["lab-r2"]
    assert [h.name for h in r2.compute] == [f"lab-r2-tray0{i}" for i in range(1, 5)]
    assert [h.address for h in r2.compute] == [f"127.201.2.{i}" for i in range(1, 5)]
    assert r2.head.address == "127.201.2.100" and r2.compute_trays == 4 and r2.switch_trays == 0
    assert r2.nvlink_domain == lay.nvlink_domain("lab-r2")
    assert site.ssh.identity_file == str(tmp_path / "ssh/id_ed25519")
    assert site.scheduler.controller == "lab-r1-head" and site.images_dir == REPO_IMAGES
    one = LabLayout("lab", racks=1, trays=1)
    (tmp_path / "mctl.yml").write_text(inventory(one, identity_file=tmp_path / "k", known_hosts=tmp_path / "kh"))
    assert [h.name for h in load_site(tmp_path).racks["lab-r1"].compute] == ["lab-r1-tray01"]


def test_image_definition_and_cache_key(tmp_path, monkeypatch):
    spec = image.load_spec(REPO_IMAGES / "lab-debian13.yml")
    assert spec.name == "lab-debian13"
    for pkg in ("openssh-server", "python3", "slurmctld", "slurmd", "slurm-client", "munge", "iproute2", "procps"):
        assert pkg in spec.build["packages"]
    monkeypatch.setenv("MCTL_IMAGE_CACHE", str(tmp_path))
    assert spec.cache_dir == tmp_path / f"lab-debian13-{spec.key}"
    # The key follows the build section only: other edits keep the cached image.
    text = (REPO_IMAGES / "lab-debian13.yml").read_text()
    (tmp_path / "same.yml").write_text(text.replace("description: ", "description: edited "))
    (tmp_path / "other.yml").write_text(text.replace("    - less\n", ""))
    assert image.load_spec(tmp_path / "same.yml").key == spec.key
    assert image.load_spec(tmp_path / "other.yml").key != spec.key
    (tmp_path / "bad.yml").write_text(text.replace("    - less\n", "    - 'less; rm -rf /'\n"))
    with pytest.raises(UsageError):
        image.load_spec(tmp_path / "bad.yml")


def test_mirror_comes_from_the_machines_apt_sources(tmp_path, monkeypatch):
    monkeypatch.delenv("MCTL_DEBIAN_MIRROR", raising=False)
    apt = tmp_path / "apt" / "sources.list.d"
    apt.mkdir(parents=True)
    assert image.host_mirror(tmp_path) is None
    (apt / "debian.sources").write_text(
        "Types: deb\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\nComponents: main\n\n"
        "Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm bookworm-updates\nComponents: main\n")
    assert image.host_mirror(tmp_path) == "http://mirror.example/debian"
    monkeypatch.setenv("MCTL_DEBIAN_MIRROR", "http://override.example/debian")
    assert image.host_mirror(tmp_path) == "http://override.example/debian"


def test_missing_prerequisites_are_named(monkeypatch):
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    monkeypatch.setattr("shutil.which", lambda prog: None if prog in ("debootstrap", "unshare") else "/usr/bin/" + prog)
    gaps = prereq.missing(need_build=True)
    assert any(g.startswith("root") for g in gaps)
    assert "'debootstrap' (Debian package debootstrap)" in gaps and "'unshare' (Debian package util-linux)" in gaps
    assert "'debootstrap' (Debian package debootstrap)" not in prereq.missing(need_build=False)
    with pytest.raises(EnvironmentProblem) as exc:
        prereq.require(need_build=True)
    assert exc.value.exit_code == 2 and "missing root" in exc.value.message


def test_cli_without_a_lab(capsys, tmp_path):
    down = run_cli(capsys, "lab", "down", "--dir", str(tmp_path / "none"))
    assert down.code == 0 and "nothing to do" in down.out
    st = run_cli(capsys, "lab", "status", "--dir", str(tmp_path / "none"), "--json")
    assert st.code == 0 and json.loads(st.out)["up"] is False
    fault = run_cli(capsys, "lab", "fault", "gpu", "lab-r1-tray01", "--xid", "79", "--gpu", "0", "--dir", str(tmp_path))
    assert fault.code == 2 and "no lab in" in fault.err and "mctl lab up" in fault.err
    ssh = run_cli(capsys, "lab", "ssh", "lab-r1-tray01", "--dir", str(tmp_path))
    assert ssh.code == 2 and "no lab in" in ssh.err
    too_many = run_cli(capsys, "lab", "up", "--compute-trays", "19", "--dir", str(tmp_path))
    assert too_many.code == 2 and "Traceback" not in too_many.err


def test_cli_up_dry_run_changes_nothing(capsys, tmp_path):
    res = run_cli(capsys, "lab", "up", "--racks", "2", "--compute-trays", "2", "--dir", str(tmp_path / "lab"), "--dry-run",
                  "--json")
    assert res.code == 0
    plan = json.loads(res.out)["plan"]
    assert [h["name"] for h in plan["hosts"]] == ["lab-r1-head", "lab-r1-tray01", "lab-r1-tray02",
                                                  "lab-r2-head", "lab-r2-tray01", "lab-r2-tray02"]
    assert not (tmp_path / "lab").exists()


def test_every_lab_command_has_an_example(capsys):
    for cmd in ("up", "status", "down", "fault", "ssh"):
        res = run_cli(capsys, "lab", cmd, "--help")
        assert res.code == 0 and "Example: mctl lab" in res.out, cmd


def test_contract_paths_are_what_the_emulators_read():
    from mctl.lab import hosts
    from mctl.lab.emulators import nvidia_smi

    assert hosts.GPUS_FILE == nvidia_smi.STATE_PATH and hosts.FAULTS_FILE == nvidia_smi.FAULTS_PATH
    assert Path(hosts.NSINIT).is_file() and Path(hosts.HOSTINIT).is_file()
