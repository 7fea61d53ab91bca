"""`mctl image diff`: each tray's image, component by component, against what the tray runs.

The versions are read with the audit's own tray probe (mctl/audit/collect.py:
OS release, kernel, slurmd -V, nvidia-smi, and one dpkg-query for every package the images
name, for the components no tool reports) over one SSH connection per tray,
each under the transport's connect and command deadlines, and compared by
`mctl.images.drift.compare`, the function the audit's `versions` rules use.
Nothing is written anywhere.

`build_report` is pure (tested on captured probe results); `diff` does the SSH.

It lives beside the audit because it is the audit's drift, shown per component: it
composes the trays (SSH) and their BMCs (mctl.bmc, for firmware) with the image catalogue,
as a service of layer 3 does, and leaves mctl.images the catalogue (the definitions in
images_dir) and the pure comparison, which provisioning, health and the audit use alike
(docs/decisions.md D59).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Sequence

from mctl.errors import UsageError
from mctl.images.drift import DRIFT, MATCH, NOT_CHECKED, UNREPORTED, Comparison, compare, not_compared
from mctl.model.tray import smi_timeout_for

if TYPE_CHECKING:
    from mctl.model.tray import TrayFacts
    from mctl.model.image import SoftwareImage
    from mctl.model.site import Host, Site

# why a component of an image has no version read from the tray: it names no Debian package (its version
# is read from dpkg's database, one dpkg-query per tray), or the tray gave no dpkg-query answer
NO_PACKAGE = "the image names no package for it, and no tool on the tray reports its version"


def not_read(image: "SoftwareImage", name: str, packages_error: str | None) -> str:
    if not image.components[name].packages:
        return NO_PACKAGE
    return packages_error or "its packages were not read"


@dataclass
class TrayDiff:
    host: str
    image: str | None
    rows: list[Comparison] = field(default_factory=list)
    unchecked: dict[str, tuple[str, str]] = field(default_factory=dict)   # component -> (wanted, why not compared)
    notes: dict[str, str] = field(default_factory=dict)          # component -> why its version is unknown
    error: str | None = None                                     # the tray could not be read

    @property
    def status(self) -> str:
        if self.error is not None:
            return "unreadable"
        if self.image is None:
            return "no-image"
        return "drift" if any(r.status in (DRIFT, UNREPORTED) for r in self.rows) else "match"

    def to_dict(self) -> dict[str, Any]:
        comps = []
        for r in self.rows:
            d = r.to_dict()
            if r.component in self.notes:
                d["note"] = self.notes[r.component]
            comps.append(d)
        comps += [{"component": name, "wanted": version, "found": None, "status": NOT_CHECKED, "note": why}
                  for name, (version, why) in self.unchecked.items()]
        return {"host": self.host, "image": self.image, "status": self.status, "error": self.error,
                "components": comps}


@dataclass
class DiffReport:
    trays: list[TrayDiff]
    timeout: float

    @property
    def drifted(self) -> list[str]:
        return [t.host for t in self.trays if t.status == "drift"]

    @property
    def unreadable(self) -> list[str]:
        return [t.host for t in self.trays if t.status == "unreadable"]

    def to_dict(self) -> dict[str, Any]:
        from mctl.model.site import fold

        return {"timeout_s": self.timeout, "trays": [t.to_dict() for t in self.trays],
                "summary": {"total": len(self.trays), "drift": fold(self.drifted) or None,
                            "unreadable": fold(self.unreadable) or None,
                            "match": sum(1 for t in self.trays if t.status == "match"),
                            "no_image": fold([t.host for t in self.trays if t.status == "no-image"]) or None}}


def tray_facts(state: "TrayFacts", *, slurm_expected: bool) -> tuple[dict[str, Any], dict[str, str]]:
    """The facts `compare` reads, from the audit probe of one tray; and why a version is unknown."""
    from mctl.images.drift import version_facts

    driver = cuda = None
    notes: dict[str, str] = {}
    if state.gpus is not None:
        driver, cuda = state.gpus.driver_version, state.gpus.cuda_version
    else:
        why = state.gpu_error or "nvidia-smi gave no answer"
        notes["nvidia_driver"] = notes["cuda"] = why
    if state.slurmd_error:
        notes["slurm"] = state.slurmd_error
    facts = version_facts(state.os.version_id if state.os else None, state.kernel, driver, cuda,
                          state.slurmd_version, slurm_expected=slurm_expected, packages=state.packages,
                          package_notes=state.package_notes)
    return facts, notes


def diff_tray(host: str, image: "SoftwareImage", state: "TrayFacts", *, slurm_expected: bool,
              bmc: Any | None = None, bmc_missing: str | None = None) -> TrayDiff:
    """*bmc*: the tray's mctl.bmc.inventory.TrayBMC (firmware read), or None with *bmc_missing* saying why."""
    if not state.reached:
        return TrayDiff(host, image.name, error=state.error or state.reach)
    if state.problems:
        return TrayDiff(host, image.name, error="probe output unreadable: " + "; ".join(state.problems))
    facts, notes = tray_facts(state, slurm_expected=slurm_expected)
    rows = compare(image, facts)
    unchecked = {name: (image.components[name].version, not_read(image, name, state.packages_error))
                 for name in not_compared(image, rows)}
    if image.firmware:
        from mctl.images import firmware

        if bmc is None and bmc_missing:             # the site cannot read BMCs: said, not compared
            unchecked.update({f"firmware:{fid}": (version, bmc_missing) for _k, fid, version in image.firmware_items()})
        else:
            listed = bmc.firmware if bmc is not None and bmc.ok else {}
            fw_rows = firmware.compare(image, listed)
            rows += fw_rows
            if bmc is None or not bmc.ok:
                why = f"BMC not read: {bmc.error}" if bmc is not None else "BMC not read"
                notes.update({r.component: why for r in fw_rows})
    return TrayDiff(host, image.name, rows, unchecked, notes)


def build_report(hosts: Sequence["Host"], images: dict[str, "SoftwareImage"], states: dict[str, "TrayFacts"],
                 *, slurm_expected: bool, timeout: float, bmcs: dict[str, Any] | None = None,
                 bmc_missing: str | None = None) -> DiffReport:
    out = []
    for h in hosts:
        image = images.get(h.name)
        if image is None:
            out.append(TrayDiff(h.name, None))
            continue
        out.append(diff_tray(h.name, image, states[h.name], slurm_expected=slurm_expected,
                             bmc=(bmcs or {}).get(h.name), bmc_missing=bmc_missing))
    return DiffReport(out, timeout)


def plan(site: "Site", hosts: Sequence["Host"]) -> dict[str, "SoftwareImage"]:
    """Each tray's image, loaded before any tray is asked (a broken definition is exit 2)."""
    from mctl.images.catalog import ImageCatalog

    wanted = sorted({h.image for h in hosts if h.image})
    if not wanted:
        raise UsageError("none of these trays names a software image in the inventory",
                         hint="set 'image:' on the trays (see inventories/example-gb200/mctl.yml)")
    catalog = ImageCatalog(site.images_dir)
    loaded = {name: catalog.get(name) for name in wanted}
    return {h.name: loaded[h.image] for h in hosts if h.image}


def diff(site: "Site", hosts: Sequence["Host"], *, timeout: float | None = None,
         images: dict[str, "SoftwareImage"] | None = None) -> DiffReport:
    """Probe every tray of *hosts* at once (each under its own deadline) and compare, with each tray's image
    from the inventory, or from *images* (a provisioning with another image verifies against that one)."""
    from mctl.facts.probe import AUDIT, from_result, probe_command
    from mctl.images.drift import package_names
    from mctl.transport import SSHConfig, run_sync, targets_for

    images = plan(site, hosts) if images is None else images
    config = SSHConfig.from_site(site)
    command_timeout = float(timeout if timeout is not None else config.command_timeout)
    asked = [h for h in hosts if h.name in images]
    nonce = secrets.token_hex(8)
    # nvidia-smi under its own deadline, inside the command's, so a hung driver is named as such
    smi_timeout = smi_timeout_for(command_timeout)
    # one dpkg-query per tray for every package the trays' images name
    packages = list(dict.fromkeys(p for h in asked for p in package_names(images[h.name])))
    probe = probe_command(AUDIT, nonce, smi_timeout=smi_timeout, packages=packages)
    # the BMCs' FirmwareInventory, read beside the SSH probe, for the trays whose image names firmware
    bmc_hosts = [h for h in asked if images[h.name].firmware]
    bmc_missing = None
    reading = None
    if bmc_hosts and getattr(site, "bmc", None) is None:
        bmc_missing = "the inventory has no bmc section (mctl reads firmware from the BMC)"
    elif bmc_hosts:
        import concurrent.futures

        from mctl.bmc.inventory import collect, read_firmware, settings_for

        settings = settings_for(site)             # a bad credentials file is exit 2 before any tray is asked
        pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="bmc")
        reading = pool.submit(collect, bmc_hosts, settings, reader=read_firmware)
        pool.shutdown(wait=False)
    results = run_sync(config, targets_for(site, asked), probe, timeout=command_timeout) if asked else []
    states = {r.host: from_result(AUDIT, r, nonce, smi_timeout=smi_timeout, packages=packages) for r in results}
    bmcs = {t.host: t for t in reading.result()} if reading is not None else None
    slurm_expected = bool(site.scheduler and site.scheduler.type == "slurm")
    return build_report(hosts, images, states, slurm_expected=slurm_expected, timeout=command_timeout,
                        bmcs=bmcs, bmc_missing=bmc_missing)
