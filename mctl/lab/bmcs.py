"""The lab trays' BMCs: credentials, a lab CA and one sushy-tools Redfish service per tray, compute or
switch (docs/lab.md, "BMCs", "Switch trays"); a switch tray is its BMC alone.

`mctl lab up` calls `prepare` before the inventory is written (it names the credentials file and
the CA) and `start` once the hosts are up. Each tray's BMC listens on its own loopback address
(`LabLayout.bmc_address`, port 443) and runs outside the tray's host, as a real BMC does: powering the
host off leaves the BMC answering. Files, under the lab folder:

    bmc/credentials     root:<random>, mode 0600 (the inventory's bmc.credentials_file)
    bmc/htpasswd        the same user, bcrypt (sushy-tools accepts bcrypt only), mode 0600
    bmc/ca.pem          the lab CA (the inventory's bmc.verify_tls); its key is not kept
    hosts/<tray>/bmc/   cert.pem, key.pem (0600), bmc.json (the emulator's config), bmc.log,
                        power-events.jsonl; a switch tray's also power.json (its power state)
    bmc/ca-trays.pem    the CA `lab up` made; ca-switches.pem the one of switch trays added later
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import secrets
import subprocess
import sys
import time
from pathlib import Path

from mctl.errors import EnvironmentProblem
from mctl.lab.layout import LabHost, LabLayout
from mctl.state.files import atomic_write

PORT = 443
USER = "root"
BCRYPT_ROUNDS = 4       # the lab's BMCs check every request; 12 rounds would cost ~0.2 s per GET
MODULE = "mctl.lab.bmc_emulator"
FIRMWARE_FILE = "firmware.json"     # the tray BMC's firmware versions that differ from the capture
POWER_EVENTS = "power-events.jsonl"  # every power step the BMC took, with its time (the emulator writes it)
TRAYS_CA = "ca-trays.pem"           # the CA `lab up` made (ca.pem is it, plus SWITCHES_CA when added later)
SWITCHES_CA = "ca-switches.pem"
SWITCH_POWER_FILE = "power.json"    # a switch tray's power state, kept by its BMC (no host stands behind it)


def lab_bmc_dir(lab_dir: Path) -> Path:
    return Path(lab_dir) / "bmc"


def tray_bmc_dir(lab_dir: Path, tray: str) -> Path:
    return Path(lab_dir) / "hosts" / tray / "bmc"


def trays(layout: LabLayout) -> list[LabHost]:
    return [h for h in layout.hosts() if h.kind == "tray"]


def require_emulator() -> None:
    """sushy-tools must be importable by the interpreter that starts the BMCs; say how to get it if not."""
    import importlib.util

    if importlib.util.find_spec("sushy_tools") is None or importlib.util.find_spec("bcrypt") is None:
        raise EnvironmentProblem(f"the lab's BMCs need OpenStack's sushy-tools, which {sys.executable} cannot import",
                                 hint="run ./scripts/install (it installs the 'lab' extra), "
                                      "or: .venv/bin/pip install -e '.[lab]'") from None


def inventory_section(lab_dir: Path) -> dict:
    d = lab_bmc_dir(lab_dir)
    return {"credentials_file": str(d / "credentials"), "verify_tls": str(d / "ca.pem"), "scheme": "https",
            "timeout_s": 10.0, "deadline_s": 60.0}


def bmc_units(layout: LabLayout) -> list[dict]:
    """Every BMC of the lab: one per compute tray and one per switch tray, as the emulator's config
    wants them (name, kind, address, index and slot)."""
    out = [{"tray": h.name, "kind": "compute", "address": layout.bmc_address(h), "tray_index": h.tray_index,
            "slot": h.slot} for h in trays(layout)]
    out += [{"tray": sw.name, "kind": "switch", "address": layout.switch_bmc_address(sw), "tray_index": sw.index - 1,
             "slot": sw.index} for sw in layout.switches()]
    return out


def _new_ca(name: str):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
          .not_valid_after(now + datetime.timedelta(days=30))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    return ca, ca_key, ca_name


def prepare(lab_dir: Path, layout: LabLayout, *, power_model: str = "host") -> None:
    """Credentials, the CA and every BMC's (compute and switch trays') certificate and emulator config.
    *power_model* "bmc" (fleet mode): a compute tray's power is its BMC's own state, as a switch tray's."""
    import bcrypt
    from cryptography.hazmat.primitives import serialization

    d = lab_bmc_dir(lab_dir)
    d.mkdir(parents=True, exist_ok=True)
    password = secrets.token_urlsafe(18)
    atomic_write(d / "credentials", f"{USER}:{password}\n", mode=0o600)
    hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=BCRYPT_ROUNDS)).decode()
    atomic_write(d / "htpasswd", f"{USER}:{hashed}\n", mode=0o600)
    ca, ca_key, ca_name = _new_ca(f"mctl lab {layout.name} BMC CA")
    pem = ca.public_bytes(serialization.Encoding.PEM).decode()
    atomic_write(d / "ca.pem", pem)
    atomic_write(d / TRAYS_CA, pem)
    _issue(lab_dir, layout, bmc_units(layout), ca_key, ca_name, power_model=power_model)


def _issue(lab_dir: Path, layout: LabLayout, units: list[dict], ca_key, ca_name, *, power_model: str = "host") -> None:
    """A certificate and the emulator's config for each BMC of *units*."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    d = lab_bmc_dir(lab_dir)
    for u in units:
        name, address = u["tray"], u["address"]
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (x509.CertificateBuilder()
                .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{name}-bmc")]))
                .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=30))
                .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(address)),
                                                            x509.DNSName(f"{name}-bmc")]), critical=False)
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .sign(ca_key, hashes.SHA256()))
        td = tray_bmc_dir(lab_dir, name)
        td.mkdir(parents=True, exist_ok=True)
        atomic_write(td / "cert.pem", cert.public_bytes(serialization.Encoding.PEM).decode())
        atomic_write(td / "key.pem", key.private_bytes(serialization.Encoding.PEM,
                                                       serialization.PrivateFormat.PKCS8,
                                                       serialization.NoEncryption()).decode(), mode=0o600)
        atomic_write(td / "bmc.json", json.dumps({
            "lab": layout.name, "lab_dir": str(lab_dir), "tray": name, "kind": u["kind"],
            "tray_index": u["tray_index"], "slot": u["slot"], "address": address, "port": PORT,
            "cert": str(td / "cert.pem"), "key": str(td / "key.pem"), "auth_file": str(d / "htpasswd"),
            "firmware_file": str(td / FIRMWARE_FILE), "power_model": power_model}, indent=2) + "\n")


def prepare_switches(lab_dir: Path, layout: LabLayout) -> None:
    """Certificates and configs for the switch trays of *layout*, added to a lab that is up (its CA's
    key is not kept: the switch trays get a CA of their own, and ca.pem lists both)."""
    from cryptography.hazmat.primitives import serialization

    d = lab_bmc_dir(lab_dir)
    units = [u for u in bmc_units(layout) if u["kind"] == "switch"]
    trays_ca = (d / TRAYS_CA).read_text()
    if not units:
        (d / SWITCHES_CA).unlink(missing_ok=True)
        atomic_write(d / "ca.pem", trays_ca)
        return
    ca, ca_key, ca_name = _new_ca(f"mctl lab {layout.name} switch tray BMC CA")
    pem = ca.public_bytes(serialization.Encoding.PEM).decode()
    atomic_write(d / SWITCHES_CA, pem)
    atomic_write(d / "ca.pem", trays_ca + pem)
    _issue(lab_dir, layout, units, ca_key, ca_name)


def set_firmware(lab_dir: Path, tray: str, firmware_id: str, version: str | None) -> dict[str, str]:
    """Make the tray's BMC report *version* for FirmwareInventory item *firmware_id* (None: as captured),
    as after a firmware update; returns the tray's overrides now. The emulator reads the file on each
    request, so the next GET answers the new version."""
    import re

    td = tray_bmc_dir(lab_dir, tray)
    if not (td / "bmc.json").is_file():
        raise EnvironmentProblem(f"{tray} has no BMC in the lab at {lab_dir}")
    if not re.match(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$", firmware_id):
        raise ValueError(f"{firmware_id!r} is not a FirmwareInventory id")
    path = td / FIRMWARE_FILE
    try:
        current = json.loads(path.read_text())
    except (OSError, ValueError):
        current = {}
    if version is None:
        current.pop(firmware_id, None)
    else:
        current[firmware_id] = version
    atomic_write(path, json.dumps(current, indent=2, sort_keys=True) + "\n")
    return current


def reset_firmware(lab_dir: Path, tray: str) -> None:
    """Every firmware item of the tray's BMC as captured again."""
    (tray_bmc_dir(lab_dir, tray) / FIRMWARE_FILE).unlink(missing_ok=True)


def start(lab_dir: Path, layout: LabLayout, marker_env: str, *, timeout: float = 60.0,
          kinds: tuple[str, ...] = ("compute", "switch")) -> None:
    """One emulator per BMC (of the trays of *kinds*), detached; returns once every one listens (or raises,
    naming the first)."""
    wanted: dict[tuple[str, int], str] = {}
    for u in bmc_units(layout):
        if u["kind"] not in kinds:
            continue
        name = u["tray"]
        td = tray_bmc_dir(lab_dir, name)
        with open(td / "bmc.log", "ab") as log:
            # `unshare` with no namespace: the launcher `mctl lab down` finds by the lab's marker. The BMC
            # needs the machine's PID namespace: the hosts it boots must outlive it.
            proc = subprocess.Popen(
                ["setsid", "-f", "unshare", "--fork", "--", "env", f"{marker_env}={lab_dir}",
                 f"MCTL_LAB_SERVICE={name}/bmc", sys.executable, "-m", MODULE, str(td / "bmc.json")],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, close_fds=True)
        proc.wait()
        wanted[(u["address"], PORT)] = name
    _wait_listening(lab_dir, wanted, timeout)


def start_fleet(lab_dir: Path, layout: LabLayout, marker_env: str, *, timeout: float = 60.0) -> None:
    """Fleet mode: one emulator process per rack answering as every BMC of it (compute and switch trays),
    each on its own address with its own certificate; returns once every address listens."""
    wanted: dict[tuple[str, int], str] = {}
    for rack in layout.rack_names():
        units = [u for u in bmc_units(layout) if u["tray"].startswith(rack + "-")]
        if not units:
            continue
        log_dir = Path(lab_dir) / "racks" / rack
        log_dir.mkdir(parents=True, exist_ok=True)
        with open(log_dir / "bmc.log", "ab") as log:
            proc = subprocess.Popen(
                ["setsid", "-f", "unshare", "--fork", "--", "env", f"{marker_env}={lab_dir}",
                 f"MCTL_LAB_SERVICE={rack}/bmc", sys.executable, "-m", MODULE,
                 *[str(tray_bmc_dir(lab_dir, u["tray"]) / "bmc.json") for u in units]],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, close_fds=True)
        proc.wait()
        wanted.update({(u["address"], PORT): u["tray"] for u in units})
    _wait_listening(lab_dir, wanted, timeout, log_of=lambda name: Path(lab_dir) / "racks" / name.rsplit("-", 1)[0] / "bmc.log")


def _wait_listening(lab_dir: Path, wanted: dict[tuple[str, int], str], timeout: float, log_of=None) -> None:
    from mctl.lab import procs

    deadline = time.monotonic() + timeout
    while wanted and time.monotonic() < deadline:
        listening = procs.listening_tcp()
        wanted = {w: n for w, n in wanted.items() if w not in listening}
        time.sleep(0.1)
    if wanted:
        (addr, port), name = next(iter(wanted.items()))
        log = log_of(name) if log_of else tray_bmc_dir(lab_dir, name) / "bmc.log"
        try:
            tail = " | ".join(log.read_text(errors="replace").strip().splitlines()[-3:])
        except OSError:
            tail = ""
        raise EnvironmentProblem(f"the BMC of {name} did not start on {addr}:{port}"
                                 + (f" (and {len(wanted) - 1} more)" if len(wanted) > 1 else ""),
                                 hint=f"its log {log} ends: {tail}" if tail else f"see {log}")
