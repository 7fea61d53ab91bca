"""`mctl audit`: desired state (inventory, images, partition plan) against actual state, plus health.

Order of work: everything that can refuse for bad input does so before any
host is contacted (image definitions, IMEX settings, the Slurm controller, the
history database); then one concurrent gather (collect.py); then the pure
rules; then the run is recorded in the history. What could not be checked (an
unreachable tray, slurmctld or NMX-M not answering) is a gap: the report says
what was checked anyway and the exit code is 3.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from mctl.audit.model import AuditReport, Entry, Gap, Skip, tag
from mctl.audit.rules import boot, drains, firmware, hostkeys, imex, layers, nmx, slurm, versions
from mctl.errors import MctlError, UsageError
from mctl.model.findings import Finding, Severity
from mctl.images import drift

if TYPE_CHECKING:
    from mctl.audit.collect import Actual
    from mctl.model.image import SoftwareImage
    from mctl.model.site import Host, Rack, Site


@dataclass(frozen=True)
class AuditSettings:
    fail_on: str = "critical"
    drain_age_s: float = drains.DEFAULT_MAX_AGE
    timeout: float | None = None          # per host command; default ssh.command_timeout
    health: bool = True                   # run the health check catalogue too

    def to_dict(self) -> dict[str, Any]:
        return {"fail_on": self.fail_on, "drain_age_s": self.drain_age_s, "timeout": self.timeout,
                "health": self.health}


def select_racks(site: "Site", names: Sequence[str], all_racks: bool) -> list["Rack"]:
    """RACK names, or --all; neither means every rack (what cron wants)."""
    if all_racks and names:
        raise UsageError("give rack names or --all, not both")
    if not names:
        return list(site.racks.values())
    unknown = [n for n in names if n not in site.racks]
    if unknown:
        raise UsageError(f"unknown rack{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}",
                         hint=f"known racks: {', '.join(site.racks) or 'none'}")
    return [site.racks[n] for n in dict.fromkeys(names)]


@dataclass
class Plan:
    """What the audit compares against, resolved (and refused if wrong) before any host is asked."""

    racks: list["Rack"]
    images: dict[str, "SoftwareImage"]            # tray -> its image
    imex_settings: Any | None                     # ImexSettings, None when IMEX is not the site's business
    imex_files: tuple[str, ...]
    controller: "Host | None"
    conf_dir: str
    skipped: list[Skip]
    firmware_trays: list["Host"] = field(default_factory=list)   # trays whose image names firmware
    bmc: Any | None = None                        # mctl.bmc.inventory.Settings; None: no bmc section


def plan_audit(site: "Site", racks: Sequence["Rack"]) -> Plan:
    from mctl.images.catalog import ImageCatalog
    from mctl.model.imex import CONFIG_FILE, ImexSettings

    skipped: list[Skip] = []
    trays = [h for r in racks for h in r.compute]
    images: dict[str, "SoftwareImage"] = {}
    wanted = sorted({h.image for h in trays if h.image})
    if not wanted:
        skipped.append(Skip("versions", "site", "no compute tray names a software image"))
    elif site.images_dir is None or not site.images_dir.is_dir():
        skipped.append(Skip("versions", "site", f"the inventory's images_dir ({site.images_dir}) is not a folder"))
    else:
        catalog = ImageCatalog(site.images_dir)
        loaded = {name: catalog.get(name) for name in wanted}      # a broken image definition is exit 2
        images = {h.name: loaded[h.image] for h in trays if h.image}
        bare = [h.name for h in trays if not h.image]
        if bare:
            from mctl.model.site import fold

            skipped.append(Skip("versions", fold(bare), "no software image in the inventory"))
    scheduler = site.scheduler.type if site.scheduler else None
    imex_settings = None
    files: tuple[str, ...] = ()
    if scheduler == "k8s":
        skipped.append(Skip("imex", "site", "Kubernetes sites run IMEX through the DRA driver's ComputeDomains"))
    elif site.health.imex == "ignore":
        skipped.append(Skip("imex", "site", "health.imex is 'ignore'"))
    else:
        imex_settings = ImexSettings.from_vars((site.vars or {}).get("imex"))
        files = (imex_settings.node_config_file, CONFIG_FILE)
    controller = None
    conf_dir = "/etc/slurm"
    if scheduler == "slurm":
        from mctl.sched.slurm.render import controller_of, settings_of

        controller = controller_of(site)
        conf_dir = settings_of(site).conf_dir
    else:
        why = "the site's scheduler is Kubernetes" if scheduler == "k8s" else "the inventory names no scheduler"
        skipped += [Skip("slurm", "site", why), Skip("drains", "site", why)]
    for r in racks:
        if r.nmx is None:
            skipped.append(Skip("nmx", r.name, "no NMX-Manager endpoint (racks.<rack>.nmx) in the inventory"))
    if any(img.kernel_parameters for img in images.values()):
        files += boot.FILES              # the running kernel's command line, provisioning's reboot flag
    firmware_trays = [h for h in trays if h.name in images and images[h.name].firmware]
    bmc = None
    if firmware_trays and getattr(site, "bmc", None) is None:
        from mctl.model.site import fold

        # as a rack without an NMX-M endpoint: said in the report, not a gap the site cannot close
        skipped.append(Skip("firmware", fold([h.name for h in firmware_trays]),
                            "the images name firmware versions but the inventory has no bmc section"))
        firmware_trays = []
    elif firmware_trays:
        from mctl.bmc.inventory import settings_for

        bmc = settings_for(site)          # a credentials file others can read is exit 2, before any host
    return Plan(list(racks), images, imex_settings, files, controller, conf_dir, skipped, firmware_trays, bmc)


def evaluate(site: "Site", plan: Plan, actual: "Actual", settings: AuditSettings
             ) -> tuple[list[Entry], list[Gap], dict[str, list[str]]]:
    """The rules over what was gathered (pure given its inputs): entries, gaps and coverage."""
    rack_of: dict[str, str] = {}
    for r in site.racks.values():
        rack_of[r.name] = r.name
        for h in r.hosts:
            rack_of[h.name] = r.name
    entries: list[Entry] = []
    gaps: list[Gap] = []
    trays = [h for r in plan.racks for h in r.compute]
    reached = [h for h in trays if actual.trays[h.name].reached]
    for h in trays:
        st = actual.trays[h.name]
        if not st.reached:
            why = ("SSH host key refused (see the ssh.host-key finding)" if st.reach == "host-key-mismatch"
                   else st.error or st.reach)
            gaps.append(Gap("reach", h.name, why, (h.name,)))

    # host keys: every host this audit connected to
    keyed = [(h.name, actual.trays[h.name].reach, actual.trays[h.name].host_key) for h in trays]
    if plan.controller is not None and actual.controller is not None:
        keyed.append((plan.controller.name, actual.controller.reach, actual.controller.host_key))
    for name, reach, problem in keyed:
        entries += tag(hostkeys.FAMILY, hostkeys.check_host(name, reach, problem), rack_of=rack_of)

    # versions
    slurm_site = plan.controller is not None
    for h in reached:
        image = plan.images.get(h.name)
        if image is None:
            continue
        st = actual.trays[h.name]
        driver, cuda, _why = actual.gpu_versions(h.name)
        facts = drift.version_facts(st.os.version_id if st.os else None, st.kernel, driver, cuda,
                                    st.slurmd_version, slurm_expected=slurm_site, packages=st.packages,
                                    package_notes=st.package_notes)
        entries += tag(versions.FAMILY, versions.check_tray(h.name, image, facts), rack_of=rack_of)

    # firmware: each tray's BMC against its image, and every tray of a rack alike
    gaps += _firmware(plan, actual, entries, rack_of)

    # boot configuration: the running kernel's command line against the image's kernel parameters
    for h in reached:
        image = plan.images.get(h.name)
        if image is not None and image.kernel_parameters:
            st = actual.trays[h.name]
            entries += tag(boot.FAMILY, boot.check_tray(h.name, image.kernel_parameters, st.files, st.file_errors),
                           rack_of=rack_of)

    # IMEX files
    if plan.imex_settings is not None:
        from mctl.fabric.imex import domain_of, expected_files
        from mctl.model.imex import CONFIG_FILE

        for rack in plan.racks:
            expected = expected_files(rack, plan.imex_settings)
            for h in rack.compute:
                st = actual.trays[h.name]
                if not st.reached or h.name not in expected:
                    continue
                domain = domain_of(rack, h.name)
                entries += tag(imex.FAMILY, imex.check_tray(
                    h.name, rack.name, domain.name if domain else "default", expected[h.name], st.files,
                    st.file_errors, nodes_path=plan.imex_settings.node_config_file, config_path=CONFIG_FILE),
                    rack_of=rack_of)

    # Kubernetes: the DRA driver's ComputeDomains manage IMEX, so no host nvidia-imex service may run beside them
    if site.scheduler is not None and site.scheduler.type == "k8s":
        for h in reached:
            entries += tag(imex.FAMILY, imex.check_host_service(h.name, actual.trays[h.name].imex_service),
                           rack_of=rack_of)

    # Slurm and drains
    if plan.controller is not None:
        ctl = actual.controller
        if ctl is None or ctl.error is not None:
            why = (ctl.error if ctl is not None else None) or "the controller was not asked"
            gaps += [Gap("slurm", plan.controller.name, why), Gap("drains", plan.controller.name, why)]
        else:
            entries += _slurm_entries(site, plan, ctl, rack_of)
            nodes = {n.name: n for n in ctl.nodes}
            entries += tag(drains.FAMILY, drains.check([h.name for h in trays], nodes, ctl.now_local,
                                                       settings.drain_age_s), rack_of=rack_of)

    # NMX-M
    for rack in plan.racks:
        view = actual.fabric.get(rack.name)
        if view is None:
            continue
        if view.error is not None or view.state is None:
            gaps.append(Gap("nmx", rack.name, view.error or "no answer"))
            continue
        try:
            found = nmx.check_rack(rack, view.state)
        except MctlError as exc:           # e.g. FabricMismatch: NMX-M's view cannot be matched to the trays
            gaps.append(Gap("nmx", rack.name, exc.message))
            continue
        entries += tag(nmx.FAMILY, found, rack_of=rack_of)
        ctl = actual.controller if plan.controller is not None else None
        if ctl is not None and ctl.error is None:
            entries += tag(nmx.FAMILY, nmx.check_fabric_limit(rack, view.state, {n.name: n for n in ctl.nodes}),
                           rack_of=rack_of)
        if site.scheduler is not None and site.scheduler.type == "k8s" and actual.nodes is not None \
                and actual.nodes.items is not None:      # unread Nodes are a gap already (below)
            found_labels = layers.node_labels([h.name for h in rack.compute], actual.nodes.items)
            entries += tag(nmx.FAMILY, nmx.check_fabric_label(rack, view.state, found_labels), rack_of=rack_of)

    # one finding per partition across the layers that follow it
    entries += _layer_entries(site, plan, actual, rack_of)
    if actual.nodes is not None and actual.nodes.items is None:
        # the clique labels of a Kubernetes site could not be read: the audit is incomplete, not clean
        gaps.append(Gap(layers.FAMILY, "site", f"Kubernetes nodes: {actual.nodes.error or 'not read'}"))

    # health
    coverage = coverage_of(entries)
    if settings.health:
        if actual.health is None:
            gaps.append(Gap("health", "site", actual.health_error or "the health sweep did not run"))
        else:
            health = [Entry("health", f, "", rack_of.get(f.host or "")) for f in actual.health.findings]
            entries += health
            # The catalogue looked at every reached tray, the racks (clique against the plan) and the
            # scheduler, even where it said nothing; an unreached tray only got its reachability finding,
            # so its other findings must not read as resolved.
            looked = {h.name for h in reached} | {r.name for r in plan.racks}
            if plan.controller is not None:
                looked.add(plan.controller.name)
            coverage["health"] = sorted(looked)
    return entries, gaps, coverage


def _firmware(plan: Plan, actual: "Actual", entries: list[Entry], rack_of: dict[str, str]) -> list[Gap]:
    """Firmware entries (appended to *entries*) and the gaps: trays whose BMC was not read."""
    if not plan.firmware_trays:
        return []
    if plan.bmc is None:                     # a Plan made by hand: nothing to read the BMCs with
        return [Gap(firmware.FAMILY, "site", "no BMC settings", tuple(h.name for h in plan.firmware_trays))]
    gaps: list[Gap] = []
    read = actual.bmc or {}
    listed: dict[str, dict[str, str | None]] = {}
    for h in plan.firmware_trays:
        tray = read.get(h.name)
        if tray is None or not tray.ok:
            why = (f"BMC {tray.bmc or '(no address)'}: {tray.error}" if tray is not None
                   else actual.bmc_error or "the BMC was not asked")
            gaps.append(Gap(firmware.FAMILY, h.name, why, (h.name,)))
            continue
        listed[h.name] = dict(tray.firmware)
        entries += tag(firmware.FAMILY, firmware.check_tray(h.name, plan.images[h.name], tray.firmware),
                       rack_of=rack_of)
    for rack in plan.racks:
        members = {h.name: listed[h.name] for h in rack.compute if h.name in listed}
        ids = list(dict.fromkeys(fid for h in rack.compute if h.name in members
                                 for _k, fid, _v in plan.images[h.name].firmware_items()))
        if members and ids:
            entries += tag(firmware.FAMILY, firmware.check_rack(rack.name, members, ids), rack_of=rack_of)
    return gaps


def _tray_gpus(actual: "Actual", host: str):
    tray = actual.trays.get(host)
    if tray is not None and tray.gpus is not None:
        return tray.gpus
    facts = actual.health.facts.get(host) if actual.health is not None else None
    return facts.gpus if facts is not None else None


def _layer_entries(site: "Site", plan: Plan, actual: "Actual", rack_of: dict[str, str]) -> list[Entry]:
    """The partition plan against NMX-M, the cliques, the IMEX node lists, Slurm's blocks (layers.py)."""
    from ClusterShell.NodeSet import NodeSet

    from mctl.facts import FactsParseError
    from mctl.facts.imex import parse_nodes_config
    from mctl.fabric.imex import imex_domains
    from mctl.sched.slurm.facts import parse_show_topology

    tray_of = {h.address: h.name for h in site.compute_trays()}
    ctl = actual.controller
    plugin = "block"
    if ctl is not None and ctl.config.get("TopologyPlugin") == "topology/tree":
        plugin = "tree"
    out: list[Entry] = []
    for rack in plan.racks:
        trays = [h.name for h in rack.compute]
        views: list[layers.LayerView] = []
        not_compared: dict[str, str] = {}
        fabric = actual.fabric.get(rack.name)
        if fabric is None:
            not_compared["nmx"] = "no NMX-M endpoint in the inventory"
        elif fabric.state is None:
            views.append(layers.LayerView("nmx", {}, error=fabric.error or "no answer"))
        else:
            views.append(layers.nmx_view(rack, fabric.state))
        labels = {}
        for t in trays:
            st = actual.trays.get(t)
            gpus = _tray_gpus(actual, t) if st is not None and st.reached else None
            labels[t] = gpus.clique_label if gpus is not None else None
        views.append(layers.clique_view(labels))
        if plan.imex_settings is not None:
            path = plan.imex_settings.node_config_file
            lists: dict[str, tuple[str, ...] | None] = {}
            for t in trays:
                st = actual.trays.get(t)
                if st is None or not st.reached or path in st.file_errors or path not in st.files:
                    continue
                text = st.files[path]
                try:
                    lists[t] = None if text is None else parse_nodes_config(text)
                except FactsParseError:
                    lists[t] = ()
            views.append(layers.imex_view(lists, tray_of))
        if plan.controller is not None:
            if ctl is None or ctl.error is not None:
                why = (ctl.error if ctl is not None else None) or "the controller was not asked"
                views += [layers.LayerView("topology.conf", {}, error=why), layers.LayerView("topology", {}, error=why)]
            else:
                conf = None if ctl.topology_conf is None else slurm.found_blocks(
                    parse_show_topology(ctl.topology_conf), plugin)
                live = None if ctl.topology is None else slurm.found_blocks(ctl.topology, plugin)
                views.append(layers.blocks_view("topology.conf", trays, conf and {
                    k: list(NodeSet(v)) for k, v in conf.items()}, ctl.topology_conf_error or "absent"))
                views.append(layers.blocks_view("topology", trays, live and {
                    k: list(NodeSet(v)) for k, v in live.items()}, ctl.topology_error))
        if site.scheduler is not None and site.scheduler.type == "k8s":
            nodes = actual.nodes
            if nodes is None or nodes.items is None:
                views.append(layers.labels_view({}, error=(nodes.error if nodes is not None else None)
                                                or "the Kubernetes nodes were not read"))
            else:
                views.append(layers.labels_view(layers.node_clique_labels(trays, nodes.items)))
        partitions = [(d.name, d.trays) for d in imex_domains(rack)]
        out += tag(layers.FAMILY, layers.check_rack(rack.name, partitions, views, not_compared), rack_of=rack_of)
    return out


def _slurm_entries(site: "Site", plan: Plan, ctl, rack_of: dict[str, str]) -> list[Entry]:
    from mctl.sched.slurm.render import choose_plugin, settings_of
    from mctl.sched.slurm.topology import block_sizes, blocks_for
    from mctl.facts.slurm_version import parse_version

    controller = plan.controller.name
    settings = settings_of(site)
    trays = [(h.name, h.address) for r in plan.racks for h in r.compute]
    site_trays = [h.name for h in site.compute_trays()]
    out = tag(slurm.FAMILY, slurm.check_nodes(trays, site_trays, ctl.nodes, controller=controller), rack_of=rack_of)
    out += tag(slurm.FAMILY, slurm.check_partition(settings.partition_name, [t for t, _ in trays], ctl.partitions,
                                                   host=controller), rack_of=rack_of)
    version = None
    if "SLURM_VERSION" in ctl.config:
        try:
            version = parse_version("slurm " + ctl.config["SLURM_VERSION"])
        except ValueError:
            version = None
    running = ctl.config.get("TopologyPlugin")
    try:
        plugin = choose_plugin(version, settings)[0] if version is not None else \
            (running.removeprefix("topology/") if running in ("topology/block", "topology/tree") else "block")
    except UsageError as exc:
        out += tag(slurm.FAMILY, [Finding(Severity.CRITICAL, controller, slurm.TOPOLOGY, exc.message, exc.hint,
                                          {"subject": "TopologyPlugin"})], rack_of=rack_of)
        return out
    blocks = blocks_for(site)
    audited = {r.name for r in plan.racks}
    expected = [b for b in blocks if b.rack in audited]
    sizes = block_sizes(blocks) if plugin == "block" and (version is None or version.block_sizes) else []
    rack_trays = {r.name: [h.name for h in r.compute] for r in plan.racks}
    site_wide = audited == set(site.racks)
    out += tag(slurm.FAMILY, slurm.check_topology_live(expected, plugin, ctl.topology, running, rack_trays,
                                                       site_wide=site_wide, controller=controller,
                                                       error=ctl.topology_error), rack_of=rack_of)
    path = settings.conf_dir.rstrip("/") + "/topology.conf"
    out += tag(slurm.FAMILY, slurm.check_topology_conf(expected, plugin, sizes, ctl.topology_conf, rack_trays,
                                                       path=path, site_wide=site_wide, controller=controller,
                                                       error=ctl.topology_conf_error), rack_of=rack_of)
    return out


def coverage_of(entries: Sequence[Entry]) -> dict[str, list[str]]:
    """Family -> every host or rack it evaluated (an OK entry counts: it was looked at)."""
    out: dict[str, set[str]] = {}
    for e in entries:
        out.setdefault(e.family, set()).add(e.host or "")
    return {fam: sorted(hosts) for fam, hosts in out.items()}


def run_audit(site: "Site", racks: Sequence["Rack"], *, state_dir: Path, settings: AuditSettings,
              record: bool = True) -> AuditReport:
    """One audit: refuse bad input, gather, evaluate, record. Never writes outside <state>/audit."""
    from mctl.audit import collect
    from mctl.audit.history import History

    plan = plan_audit(site, racks)
    history = History.open(Path(state_dir)) if record else None    # an unwritable state dir fails here
    started = time.time()
    try:
        packages = list(dict.fromkeys(p for img in plan.images.values() for p in drift.package_names(img)))
        actual = collect.gather(site, plan.racks, state_dir=Path(state_dir), files=plan.imex_files,
                                packages=packages,
                                controller=plan.controller, conf_dir=plan.conf_dir, timeout=settings.timeout,
                                health=settings.health,
                                bmc=(plan.firmware_trays, plan.bmc) if plan.bmc is not None else None,
                                k8s=site.scheduler is not None and site.scheduler.type == "k8s")
        entries, gaps, coverage = evaluate(site, plan, actual, settings)
        report = AuditReport(site.name, [r.name for r in plan.racks], started, time.time() - started, entries,
                             coverage, gaps, plan.skipped, settings.fail_on, settings.to_dict())
        if history is not None:
            report.history = history.record(report)
    finally:
        if history is not None:
            history.close()
    return report
