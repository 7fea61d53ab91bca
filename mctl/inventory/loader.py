"""Load and validate a site inventory into the Site model.

Every problem is collected (not just the first) and located by file, line and
field, so an operator fixes a broken inventory in one pass.
"""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from typing import Any

from ClusterShell.NodeSet import NodeSet, NodeSetParseError, RangeSetParseError

from mctl.errors import InventoryError, Problem, UsageError
from mctl.inventory.schema import RackSpec, SiteSpec, TrayGroup
from mctl.inventory.spec import DictOf, ListOf, Opt, Spec, SpecError
from mctl.inventory.yamlsrc import Located, dotted, load_yaml
from mctl.model.site import MODEL_SHAPES, Host, Partition, Rack, Site

INVENTORY_NAMES = ("mctl.yml", "mctl.yaml")
_HOSTNAME = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$")
_RANGE_VALUE = re.compile(r"^\[[0-9,\-]+\]$")


def find_inventory_file(path: str | Path) -> Path:
    """Accept an inventory directory or file, as ansible's -i does."""
    p = Path(path).expanduser()
    if p.is_dir():
        for name in INVENTORY_NAMES:
            if (p / name).is_file():
                return p / name
        found = sorted(p.glob("*.mctl.yml"))
        if len(found) == 1:
            return found[0]
        raise UsageError(f"no mctl inventory in {p}",
                         hint="an inventory directory holds mctl.yml (see inventories/example-gb200)")
    if p.is_file():
        return p
    raise UsageError(f"inventory not found: {p}",
                     hint="pass -i DIR or set MCTL_INVENTORY; 'mctl lab up' writes one for the virtual rack")


def validate_inventory(path: str | Path) -> tuple[Site | None, list[Problem]]:
    file = find_inventory_file(path)
    shown = str(file)
    try:
        text = file.read_text()
    except OSError as exc:
        raise UsageError(f"cannot read {file}: {exc.strerror}") from None
    doc = load_yaml(text, shown)
    if doc.problems and doc.data is None:
        return None, doc.problems
    problems = list(doc.problems)
    if not isinstance(doc.data, dict):
        problems.append(Problem(shown, 1, "", "an inventory is a YAML mapping",
                                "start from inventories/example-gb200/mctl.yml"))
        return None, problems
    try:
        spec = SiteSpec.model_validate(doc.data)
    except SpecError as exc:
        problems.extend(_spec_problems(exc, doc))
        return None, problems
    site, more = _build_site(spec, file, doc)
    problems.extend(more)
    return (site if not problems else None), problems


def load_site(path: str | Path) -> Site:
    site, problems = validate_inventory(path)
    if problems or site is None:
        raise InventoryError(problems, str(path))
    return site


def _spec_problems(exc: SpecError, doc: Located) -> list[Problem]:
    out = []
    for err in exc.errors():
        path = tuple(err["loc"])
        kind = err["type"]
        if kind == "extra_forbidden":
            parent = _schema_fields(path[:-1])
            hint = f"known keys here: {', '.join(parent)}" if parent else "remove it or check its spelling"
            out.append(Problem(doc.file, doc.line_of(path), dotted(path), "unknown key", hint))
        elif kind == "missing":
            out.append(Problem(doc.file, doc.line_of(path), dotted(path), "required key is missing",
                               "see inventories/example-gb200/mctl.yml"))
        else:
            out.append(Problem(doc.file, doc.line_of(path), dotted(path),
                               f"{err['msg']} (got {err.get('input')!r})"))
    return out


def _schema_fields(path: tuple) -> list[str]:
    """Names of the keys allowed at *path*, for 'did you mean' hints."""
    kind: Any = SiteSpec
    for part in path:
        while isinstance(kind, Opt):
            kind = kind.kind
        if isinstance(kind, type) and issubclass(kind, Spec):
            field = kind.model_fields.get(part) if isinstance(part, str) else None
            if field is None:
                return []
            kind = field.kind
        elif isinstance(kind, DictOf):
            kind = kind.value
        elif isinstance(kind, ListOf):
            kind = kind.item
        else:
            return []
    while isinstance(kind, Opt):
        kind = kind.kind
    return sorted(kind.model_fields) if isinstance(kind, type) and issubclass(kind, Spec) else []


def _expand(value: str, doc: Located, path: tuple, problems: list[Problem], what: str) -> list[str] | None:
    try:
        # NodeSet folds and sorts; expansion order is the natural order of the set.
        return list(NodeSet(value))
    except (NodeSetParseError, RangeSetParseError) as exc:
        problems.append(Problem(doc.file, doc.line_of(path), dotted(path), f"bad node-set syntax in {what} {value!r}: {exc}",
                                "use ClusterShell syntax, e.g. rack-a-tray[01-18] or 10.0.1.[11-28]"))
        return None


def _check_address(addr: str, doc: Located, path: tuple, problems: list[Problem]) -> None:
    try:
        ipaddress.ip_address(addr)
        return
    except ValueError:
        pass
    if not _HOSTNAME.match(addr):
        problems.append(Problem(doc.file, doc.line_of(path), dotted(path), f"{addr!r} is neither an IP address nor a host name"))


def _group_hosts(group: TrayGroup, role: str, rack: str, doc: Located, path: tuple,
                 problems: list[Problem]) -> list[Host]:
    names = _expand(group.nodes, doc, path + ("nodes",), problems, "nodes")
    addrs = _expand(group.addresses, doc, path + ("addresses",), problems, "addresses")
    bmcs = _expand(group.bmc, doc, path + ("bmc",), problems, "bmc") if group.bmc else None
    if names is None or addrs is None:
        return []
    if len(addrs) != len(names):
        problems.append(Problem(doc.file, doc.line_of(path + ("addresses",)), dotted(path + ("addresses",)),
                                f"{len(addrs)} addresses for {len(names)} nodes", "give one address per node, in node order"))
        return []
    if bmcs is not None and len(bmcs) != len(names):
        problems.append(Problem(doc.file, doc.line_of(path + ("bmc",)), dotted(path + ("bmc",)),
                                f"{len(bmcs)} BMC addresses for {len(names)} nodes"))
        bmcs = None
    per_host_vars: list[dict[str, Any]] = [dict() for _ in names]
    for key, value in group.vars.items():
        if isinstance(value, str) and _RANGE_VALUE.match(value):
            values = _expand("x" + value, doc, path + ("vars", key), problems, f"vars.{key}")
            if values is None:
                continue
            if len(values) != len(names):
                problems.append(Problem(doc.file, doc.line_of(path + ("vars", key)), dotted(path + ("vars", key)),
                                        f"{len(values)} values for {len(names)} nodes"))
                continue
            for i, v in enumerate(values):
                per_host_vars[i][key] = int(v[1:]) if v[1:].isdigit() else v[1:]
        else:
            for hv in per_host_vars:
                hv[key] = value
    hosts = []
    for i, (name, addr) in enumerate(zip(names, addrs)):
        _check_address(addr, doc, path + ("addresses",), problems)
        hosts.append(Host(name=name, address=addr, role=role, rack=rack,  # type: ignore[arg-type]
                          bmc=bmcs[i] if bmcs else None, image=group.image, vars=per_host_vars[i]))
    return hosts


def _build_site(spec: SiteSpec, file: Path, doc: Located) -> tuple[Site | None, list[Problem]]:
    problems: list[Problem] = []
    racks: dict[str, Rack] = {}
    images_dir = (file.parent / spec.images_dir).resolve() if spec.images_dir else None
    seen_names: dict[str, str] = {}
    seen_addrs: dict[str, str] = {}

    for rack_name, rs in spec.racks.items():
        rpath = ("racks", rack_name)
        compute = _group_hosts(rs.compute, "compute", rack_name, doc, rpath + ("compute",), problems)
        switches = _group_hosts(rs.switches, "switch", rack_name, doc, rpath + ("switches",), problems) if rs.switches else []
        head = None
        if rs.head:
            _check_address(rs.head.address, doc, rpath + ("head", "address"), problems)
            head = Host(rs.head.name, rs.head.address, "head", rack_name, vars=dict(rs.head.vars))

        full_compute, full_switch = MODEL_SHAPES[rs.model]
        want_c, want_s = (rs.shape.compute_trays, rs.shape.switch_trays) if rs.shape else (full_compute, full_switch)
        if rs.shape and (want_c > full_compute or want_s > full_switch):
            problems.append(Problem(doc.file, doc.line_of(rpath + ("shape",)), dotted(rpath + ("shape",)),
                                    f"an {rs.model} rack holds at most {full_compute} compute and {full_switch} switch trays"))
        if compute and len(compute) != want_c:
            problems.append(Problem(doc.file, doc.line_of(rpath + ("compute", "nodes")), dotted(rpath + ("compute", "nodes")),
                                    f"{len(compute)} compute trays, but an {rs.model} rack has {want_c}",
                                    "list every tray, or declare a partly populated rack with 'shape:'"))
        if len(switches) != want_s and not (rs.switches is not None and not switches and problems):
            problems.append(Problem(doc.file, doc.line_of(rpath + (("switches", "nodes") if rs.switches else ())),
                                    dotted(rpath + ("switches",)),
                                    f"{len(switches)} switch trays, but an {rs.model} rack has {want_s}",
                                    "list every NVLink switch tray, or declare a partly populated rack with 'shape:'"))

        for host, hpath in [(h, rpath + ("compute",)) for h in compute] + [(h, rpath + ("switches",)) for h in switches] \
                + ([(head, rpath + ("head",))] if head else []):
            if host.name in seen_names:
                problems.append(Problem(doc.file, doc.line_of(hpath + ("nodes",)), dotted(hpath),
                                        f"duplicate host name {host.name} (also in {seen_names[host.name]})"))
            seen_names.setdefault(host.name, dotted(hpath))
            if host.address in seen_addrs:
                problems.append(Problem(doc.file, doc.line_of(hpath + ("addresses",)), dotted(hpath),
                                        f"duplicate address {host.address} ({host.name}; also used by {seen_addrs[host.address]})"))
            seen_addrs.setdefault(host.address, host.name)
            if host.bmc:
                key = "bmc " + host.bmc
                if host.bmc in seen_addrs:
                    problems.append(Problem(doc.file, doc.line_of(hpath + ("bmc",)), dotted(hpath + ("bmc",)),
                                            f"duplicate address {host.bmc} (BMC of {host.name}; also used by {seen_addrs[host.bmc]})"))
                seen_addrs.setdefault(host.bmc, key)

        for group, gpath in ((rs.compute, rpath + ("compute",)), (rs.switches, rpath + ("switches",))):
            if group is None or group.image is None:
                continue
            if images_dir is None or not (images_dir / f"{group.image}.yml").is_file():
                known = sorted(p.stem for p in images_dir.glob("*.yml")) if images_dir and images_dir.is_dir() else []
                problems.append(Problem(doc.file, doc.line_of(gpath + ("image",)), dotted(gpath + ("image",)),
                                        f"unknown image {group.image!r}",
                                        f"known images: {', '.join(known)}" if known else "set images_dir to the folder of image definitions"))

        if rs.nmx is not None:
            _nmx_problems(rs.nmx, doc, rpath + ("nmx",), problems)
        partitions = _partitions(rs, rack_name, compute, spec, doc, problems)
        racks[rack_name] = Rack(name=rack_name, model=rs.model, compute_trays=want_c, switch_trays=want_s,
                                nvlink_domain=rs.nvlink_domain.lower() if rs.nvlink_domain else None,
                                nmx=rs.nmx, head=head, compute=tuple(compute), switches=tuple(switches),
                                partitions=tuple(partitions))

    domains: dict[str, str] = {}
    for rack in racks.values():
        if rack.nvlink_domain:
            if rack.nvlink_domain in domains:
                path = ("racks", rack.name, "nvlink_domain")
                problems.append(Problem(doc.file, doc.line_of(path), dotted(path),
                                        f"NVLink domain {rack.nvlink_domain} is also rack {domains[rack.nvlink_domain]}'s",
                                        "each NVL72 rack is its own NVLink domain"))
            domains.setdefault(rack.nvlink_domain, rack.name)

    if spec.scheduler and spec.scheduler.controller and spec.scheduler.controller not in seen_names:
        path = ("scheduler", "controller")
        problems.append(Problem(doc.file, doc.line_of(path), dotted(path),
                                f"unknown host {spec.scheduler.controller!r}", "name a head node of one of the racks"))

    site = Site(name=spec.site, file=file.resolve(), ssh=spec.ssh, racks=racks, scheduler=spec.scheduler,
                health=spec.health, images_dir=images_dir, vars=dict(spec.vars))
    return site, problems


def _nmx_problems(nmx, doc: Located, path: tuple, problems: list[Problem]) -> None:
    """The rack's NMX-M endpoint: an http(s) URL whose credentials stay with it, a typed verify_tls."""
    import urllib.parse

    # Kept here, not imported from mctl.fabric.nmx: the loader is on every command's start-up path.
    bool_words = ("true", "false", "yes", "no", "on", "off", "y", "n", "t", "f", "0", "1")

    def is_loopback(host: str) -> bool:
        try:
            return host.lower() == "localhost" or ipaddress.ip_address(host.strip("[]")).is_loopback
        except ValueError:
            return False

    parts = urllib.parse.urlsplit(nmx.url)
    try:
        parts.port
        bad_port = False
    except ValueError:
        bad_port = True
    if parts.scheme not in ("http", "https") or not parts.hostname or bad_port:
        problems.append(Problem(doc.file, doc.line_of(path + ("url",)), dotted(path + ("url",)),
                                f"{nmx.url!r} is not an http(s) URL", "e.g. https://10.20.0.5"))
    elif parts.username or parts.password:
        problems.append(Problem(doc.file, doc.line_of(path + ("url",)), dotted(path + ("url",)),
                                "the NMX-M URL must not carry credentials",
                                "put 'username:password' in the file named by nmx.credentials_file"))
    elif parts.scheme == "http" and not nmx.allow_http and not is_loopback(parts.hostname):
        problems.append(Problem(doc.file, doc.line_of(path + ("url",)), dotted(path + ("url",)),
                                f"{nmx.url!r} is plain http:// on a routed address: the NMX-M credentials would "
                                "cross the network in clear",
                                "use https://, or set nmx.allow_http: true for this rack"))
    if isinstance(nmx.verify_tls, str):
        word = nmx.verify_tls.strip()
        if word.lower() in bool_words or not word:
            problems.append(Problem(doc.file, doc.line_of(path + ("verify_tls",)), dotted(path + ("verify_tls",)),
                                    f"verify_tls is the string {nmx.verify_tls!r}, not a boolean or a CA bundle path",
                                    "write verify_tls: false (without quotes) to turn verification off, or give "
                                    "the CA bundle's path"))
        elif any(ord(c) < 32 for c in word):
            problems.append(Problem(doc.file, doc.line_of(path + ("verify_tls",)), dotted(path + ("verify_tls",)),
                                    "verify_tls holds control characters", "give the CA bundle's path"))


def _partitions(rs: RackSpec, rack_name: str, compute: list[Host], spec: SiteSpec, doc: Located,
                problems: list[Problem]) -> list[Partition]:
    own = {h.name for h in compute}
    elsewhere: dict[str, str] = {}
    for other_name, other in spec.racks.items():
        if other_name == rack_name:
            continue
        try:
            for n in NodeSet(other.compute.nodes):
                elsewhere[n] = other_name
        except (NodeSetParseError, RangeSetParseError):
            pass
    owner: dict[str, str] = {}
    names: set[str] = set()
    out = []
    for i, ps in enumerate(rs.partitions):
        path = ("racks", rack_name, "partitions", i)
        if ps.name in names:
            problems.append(Problem(doc.file, doc.line_of(path + ("name",)), dotted(path + ("name",)),
                                    f"duplicate partition name {ps.name!r} in rack {rack_name}"))
        names.add(ps.name)
        trays = _expand(ps.trays, doc, path + ("trays",), problems, "trays")
        if trays is None:
            continue
        ok = True
        for t in trays:
            if t in elsewhere:
                problems.append(Problem(doc.file, doc.line_of(path + ("trays",)), dotted(path + ("trays",)),
                                        f"tray {t} belongs to rack {elsewhere[t]}: a partition cannot span racks",
                                        "an NVLink partition lives inside one NVLink domain (one rack)"))
                ok = False
            elif t not in own:
                problems.append(Problem(doc.file, doc.line_of(path + ("trays",)), dotted(path + ("trays",)),
                                        f"unknown tray {t}", f"trays of {rack_name}: {rs.compute.nodes}"))
                ok = False
            elif t in owner:
                problems.append(Problem(doc.file, doc.line_of(path + ("trays",)), dotted(path + ("trays",)),
                                        f"tray {t} is in partitions {owner[t]!r} and {ps.name!r}: partitions overlap",
                                        "a GPU belongs to exactly one partition"))
                ok = False
            else:
                owner[t] = ps.name
        if ok:
            out.append(Partition(ps.name, rack_name, tuple(trays)))
    return out
