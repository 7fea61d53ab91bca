"""The probe scripts built from mctl.facts.shell: their sections in order, and sh's syntax check.

The parsers (split_sections and each probe's parse_*) and the node check bundle read sections by
name, so the names and their order are pinned here for all three probes.
"""

from __future__ import annotations

import re
import shlex
import subprocess

import pytest

from mctl.audit.collect import controller_command
from mctl.facts import shell
from mctl.facts.probe import AUDIT, INVENTORY, NODE_CHECK, probe_command, probe_script, split_sections
from mctl.facts.probe import HEALTH as HEALTH_PROBE

NONCE = "0123456789abcdef"
FACTS = ["hostname", "os-release", "kernel", "nvidia-smi", "services", "imex-config", "xid"]
HEALTH = ["clock", "boot-id", "hostname", "nvidia-smi", "nvlink", "nvlink-errors", "services", "imex-domain", "imex-query", "xid", "disk",
          "memory"]
AUDIT_TRAY = ["os-release", "kernel", "slurmd", "services", "file0", "file1"]
AUDIT_CONTROLLER = ["clock", "nodes", "topology", "config", "partitions", "topology-conf"]


def body_of(command: str) -> str:
    words = shlex.split(command)
    assert words[:3] == ["exec", "/bin/sh", "-c"] and len(words) == 4
    return words[3]


def section_names(body: str) -> list[str]:
    return re.findall(r"^sec (\S+)", body, re.MULTILINE)


def sh_syntax(text: str) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", "-n"], input=text, capture_output=True, text=True, timeout=30)


SCRIPTS = {
    "facts": (lambda: probe_command(INVENTORY, NONCE, smi_timeout=27), FACTS),
    "health": (lambda: probe_command(HEALTH_PROBE, NONCE, smi_timeout=20, disk_paths=("/", "/my disk")), HEALTH),
    "health-nvml": (lambda: probe_command(NODE_CHECK, NONCE, smi_timeout=20),
                    [s for s in HEALTH if s not in ("nvidia-smi", "nvlink", "nvlink-errors")]),
    "health-dcgm": (lambda: probe_command(HEALTH_PROBE, NONCE, smi_timeout=12, dcgm_timeout=4), HEALTH + ["dcgm"]),
    "health-nvml-dcgm": (lambda: probe_command(NODE_CHECK, NONCE, smi_timeout=20, dcgm_timeout=5),
                         [s for s in HEALTH if s not in ("nvidia-smi", "nvlink", "nvlink-errors")] + ["dcgm"]),
    "audit-tray": (lambda: probe_command(AUDIT, NONCE, files=["/etc/nvidia-imex/nodes_config.cfg", "/etc/a b@RC_ABSENT@"]),
                   AUDIT_TRAY),
    "audit-tray-smi": (lambda: probe_command(AUDIT, NONCE, files=["/x", "/y"], smi_timeout=10), AUDIT_TRAY + ["nvidia-smi"]),
    "audit-controller": (lambda: controller_command(NONCE, "/etc/slurm/"), AUDIT_CONTROLLER),
}


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_script_sections_in_order_and_sh_parses_it(name, processes):
    build, expected = SCRIPTS[name]
    command = build()
    body = body_of(command)
    assert section_names(body) == expected
    assert f"M='::mctl-{NONCE}::'" in body and not re.search(r"@[A-Z_]+@", body.replace("b@RC_ABSENT@", ""))
    for text in (body, command):
        proc = sh_syntax(text)
        assert proc.returncode == 0, proc.stderr
    # each shell function is defined once, and everything a section calls is defined
    defined = re.findall(r"^(\w+)\(\) \{", body, re.MULTILINE)
    assert sorted(defined) == sorted(set(defined))
    for line in body.splitlines():
        if line.startswith("sec "):
            called = line.split()[2]
            assert called in defined or called in ("cat", "date", "df"), line


def test_timeouts_are_the_callers():
    assert "to 27 nvidia-smi" in probe_command(INVENTORY, NONCE, smi_timeout=27)
    assert "to 1 nvidia-smi" in probe_command(INVENTORY, NONCE, smi_timeout=0.2)          # one second at the least
    assert "to 12.5 nvidia-smi" in probe_script(HEALTH_PROBE, NONCE, smi_timeout=12.5)
    assert "to 5 nvidia-imex-ctl -c /etc/nvidia-imex/config.cfg" in probe_script(HEALTH_PROBE, NONCE, smi_timeout=5)
    assert "to 20 scontrol" in body_of(controller_command(NONCE, "/etc/slurm"))
    assert "tail -n 200" in body_of(probe_command(INVENTORY, NONCE, smi_timeout=5))
    assert "nvidia-smi" not in body_of(probe_command(AUDIT, NONCE))                  # a health sweep runs it instead
    assert "to 4 /bin/sh -c \"$DS\"" in probe_script(HEALTH_PROBE, NONCE, smi_timeout=12, dcgm_timeout=4)
    assert "dcgmi" not in probe_script(HEALTH_PROBE, NONCE, smi_timeout=12)          # health.dcgm off: not asked


def test_builder_fills_only_its_own_placeholders():
    steps = [shell.sec("kernel"), shell.sec("f", "file " + shlex.quote("/etc/my @NONCE@"), needs=("file",))]
    body = shell.script(NONCE, steps)
    assert "file '/etc/my @NONCE@'" in body and "return 200" in body          # a path is never a placeholder
    assert body.count("line() {") == 1 and "smi()" not in body and "to()" not in body
    with pytest.raises(ValueError, match="@SMI_TIMEOUT@"):
        shell.script(NONCE, [shell.sec("nvidia-smi")])                      # smi without a timeout
    with pytest.raises(ValueError, match="@X@"):
        shell.script(NONCE, [], local="f() { echo @X@; }")
    with pytest.raises(ValueError):
        shell.sec("two words", "true")
    with pytest.raises(ValueError):
        shell.script(NONCE, [shell.sec("a", "nope", needs=("nope",))])


def test_framing_reads_back_through_split_sections(processes):
    steps = [shell.sec("hostname"), shell.sec("fail", "false"), shell.sec("err", "oops")]
    body = shell.script(NONCE, steps, local="oops() { echo oops >&2; }")
    proc = subprocess.run(["/bin/sh", "-c", body], capture_output=True, text=True, timeout=30)
    out, err = split_sections(proc.stdout, NONCE), split_sections(proc.stderr, NONCE)
    assert list(out) == ["hostname", "fail", "err"] and out["hostname"].text.strip()
    assert (out["fail"].rc, out["err"].rc, err["err"].text) == (1, 0, "oops\n")
