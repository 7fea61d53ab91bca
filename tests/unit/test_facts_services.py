"""IMEX/slurmd service state and IMEX config checksums from the probe's output."""

import hashlib
import subprocess

import pytest

from mctl.facts import FactsParseError
from mctl.facts.services import IMEX_UNIT, SLURMD_UNIT, parse_imex_config_sums, parse_service_probe

# `systemctl show -p Id,LoadState,ActiveState,SubState,UnitFileState,MainPID nvidia-imex.service slurmd.service`
# as systemd prints it (properties in systemd's own order, a blank line between units).
SYSTEMD = """source=systemd
MainPID=2711
Id=nvidia-imex.service
LoadState=loaded
ActiveState=active
SubState=running
UnitFileState=enabled

MainPID=0
Id=slurmd.service
LoadState=not-found
ActiveState=inactive
SubState=dead
UnitFileState=
"""

# What the probe printed on a lab tray (no systemd PID 1): see tests/fixtures/probe/.
PROCESS_TABLE = """source=process-table
unit=nvidia-imex.service file=/etc/systemd/system/nvidia-imex.service enabled=yes
unit=slurmd.service file=/usr/lib/systemd/system/slurmd.service enabled=yes
/proc/412/comm:nvidia-imex
"""


def test_systemd_blocks():
    states = parse_service_probe(SYSTEMD)
    imex, slurmd = states[IMEX_UNIT], states[SLURMD_UNIT]
    assert imex.installed and imex.running and imex.enabled == "enabled" and imex.pids == (2711,)
    assert not slurmd.installed and slurmd.short == "not installed" and slurmd.enabled is None


def test_process_table_evidence():
    states = parse_service_probe(PROCESS_TABLE)
    assert states[IMEX_UNIT].running and states[IMEX_UNIT].pids == (412,)
    assert states[IMEX_UNIT].source == "process-table"
    assert states[SLURMD_UNIT].installed and not states[SLURMD_UNIT].running
    assert states[SLURMD_UNIT].enabled == "enabled" and states[SLURMD_UNIT].short == "inactive"


def test_absent_units_without_systemd():
    states = parse_service_probe("source=process-table\nunit=nvidia-imex.service file= enabled=no\n")
    assert not states[IMEX_UNIT].installed and states[IMEX_UNIT].enabled is None


@pytest.mark.parametrize("text", ["", "hello\n", "source=systemd\nnot a property\n",
                                  "source=process-table\nsomething odd\n", "source=systemd\nLoadState=loaded\n"])
def test_garbled_probe_is_a_parse_error(text):
    with pytest.raises(FactsParseError):
        parse_service_probe(text)


def test_imex_sums_from_real_sha256sum(tmp_path, processes):
    (tmp_path / "config.cfg").write_text("SERVER_PORT=50000\n")
    (tmp_path / "nodes_config.cfg").write_text("10.0.0.1\n10.0.0.2\n")
    out = subprocess.run(["sha256sum", str(tmp_path / "config.cfg"), str(tmp_path / "nodes_config.cfg")],
                         capture_output=True, text=True, check=True).stdout
    cfg = parse_imex_config_sums(out)
    assert cfg.present and len(cfg.files) == 2
    assert cfg.files[str(tmp_path / "config.cfg")] == hashlib.sha256(b"SERVER_PORT=50000\n").hexdigest()
    # order of the lines does not change the folded checksum; content does
    flipped = parse_imex_config_sums("\n".join(reversed(out.splitlines())))
    assert flipped.checksum == cfg.checksum
    (tmp_path / "nodes_config.cfg").write_text("10.0.0.1\n")
    out2 = subprocess.run(["sha256sum", str(tmp_path / "config.cfg"), str(tmp_path / "nodes_config.cfg")],
                          capture_output=True, text=True, check=True).stdout
    assert parse_imex_config_sums(out2).checksum != cfg.checksum


def test_imex_absent_and_garbled():
    assert parse_imex_config_sums("absent\n").present is False
    assert parse_imex_config_sums("absent\n").checksum is None
    assert parse_imex_config_sums("").files == {}
    with pytest.raises(FactsParseError):
        parse_imex_config_sums("not a checksum line\n")
