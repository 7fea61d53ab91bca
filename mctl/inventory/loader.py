"""Load and validate a site inventory into the Site model.

Every problem is collected (not just the first) and located by file, line and
field, so an operator fixes a broken inventory in one pass.
"""

from __future__ import annotations

import ipaddress
import re
import urllib.parse
from pathlib import Path
from typing import Any

from ClusterShell.NodeSet import NodeSet, NodeSetParseError, RangeSetParseError

from mctl.errors import InventoryError, Problem, UsageError
from mctl.inventory.addresses import ADDRESS_HINT, IP_HINT, address_problem, url_host_problem
from mctl.inventory.convert import (bmc_settings, health_settings, nmx_settings, safety_settings,
                                    scheduler_settings, ssh_settings)
from mctl.inventory.schema import NAME_PATTERN, RackSpec, SiteSpec, TrayGroup
from mctl.inventory.spec import DictOf, ListOf, Opt, Spec, SpecError
from mctl.inventory.yamlsrc import Located, dotted, read_yaml
from mctl.model.names import (CLUSTER_GRAMMAR, HOST_GRAMMAR, PARTITION_GRAMMAR, is_cluster_name, is_host_name,
                              is_partition_name, nodeset_size, nodeset_too_big, path_problem, shown)
from mctl.model.settings import MIN_TTL_S, HealthSettings, parse_duration
from mctl.model.site import MODEL_SHAPES, Host, Partition, Rack, Site

INVENTORY_NAMES = ("mctl.yml", "mctl.yaml")
_RANGE_VALUE = re.compile(r"^\[[0-9,\-]+\]\Z")
_WHITESPACE = re.compile(r"\s")
_SET_OPERATOR = re.compile(r"[!&^]")
_RANGES = re.compile(r"\[([^\]]*,[^\]]*)\]")          # a bracket of several ranges
_VAR_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
_USER = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,31}\Z")
_SLURM_WORD = re.compile(r"^[^\s#\"'\\]+\Z")
_K8S_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\Z")
_VERSION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.+_-]{0,63}\Z")
_URL = re.compile(r"^(https?|oci)://[^\s\"'`$\\]+\Z")
_SLURM_KEY = re.compile(r"^[A-Za-z][A-Za-z0-9]*\Z")

# Variables that would let an inventory change how Ansible connects or which host keys it trusts,
# behind mctl's back: mctl sets the SSH options itself (strict host keys against the site's
# known_hosts only), and mctl's own SSH never reads these, so the two would disagree.
REFUSED_VARS = {
    "ansible_ssh_common_args": "mctl sets the SSH options (strict host-key checking against ssh.known_hosts)",
    "ansible_ssh_extra_args": "mctl sets the SSH options (strict host-key checking against ssh.known_hosts)",
    "ansible_ssh_args": "mctl sets the SSH options (strict host-key checking against ssh.known_hosts)",
    "ansible_sftp_extra_args": "mctl sets the SSH options",
    "ansible_scp_extra_args": "mctl sets the SSH options",
    "ansible_ssh_executable": "Ansible must run the same ssh as mctl expects",
    "ansible_host_key_checking": "host keys are always checked, against ssh.known_hosts (see 'mctl ssh trust')",
    "ansible_ssh_host_key_checking": "host keys are always checked, against ssh.known_hosts (see 'mctl ssh trust')",
    "ansible_paramiko_host_key_checking": "host keys are always checked, against ssh.known_hosts",
    "ansible_paramiko_host_key_auto_add": "host keys are recorded on purpose with 'mctl ssh trust'",
    "ansible_host_key_auto_add": "host keys are recorded on purpose with 'mctl ssh trust'",
    "ansible_connection": "mctl reaches every host over SSH; a local or other connection would run elsewhere",
    "ansible_ssh_host": "use ansible_host, which mctl's own SSH reads too",
    "ansible_ssh_port": "use ansible_port, which mctl's own SSH reads too",
    "ansible_ssh_user": "use ansible_user, which mctl's own SSH reads too",
    "ansible_ssh_private_key_file": "set ssh.identity_file, which mctl and Ansible both use",
    "ansible_private_key_file": "set ssh.identity_file, which mctl and Ansible both use",
}
_REFUSED_VAR = re.compile(r"^ansible_.*(_args|host_key.*)$")

# Path fields: (path in the document, must be absolute). Absolute paths are paths on the hosts.
_HOST_PATHS = ("conf_dir", "node_check_program", "state_save_location", "slurmd_spool_dir", "log_dir")
_SLURM_WORDS = ("cgroup_plugin", "proctrack_type", "task_plugin", "jobacct_gather_type", "communication_parameters",
                "health_check_node_state")


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
    where = str(file)
    doc = read_yaml(file, what="inventory")
    if doc.problems and doc.data is None:
        return None, doc.problems
    problems = list(doc.problems)
    if not isinstance(doc.data, dict):
        problems.append(Problem(where, 1, "", "an inventory is a YAML mapping",
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
    """The schema's errors, located; a field the document already has a problem for (a tag, a character,
    a duplicate key) is not reported twice."""
    out = []
    reported = {p.field for p in doc.problems}
    for err in exc.errors():
        path = tuple(err["loc"])
        kind = err["type"]
        if dotted(path) in reported:
            continue
        if kind == "extra_forbidden":
            parent = _schema_fields(path[:-1])
            hint = f"known keys here: {', '.join(parent)}" if parent else "remove it or check its spelling"
            hint = _RENAMED.get(path, hint)
            out.append(Problem(doc.file, doc.line_of(path), dotted(path), "unknown key", hint))
        elif kind == "missing":
            out.append(Problem(doc.file, doc.line_of(path), dotted(path), "required key is missing",
                               "see inventories/example-gb200/mctl.yml"))
        else:
            out.append(Problem(doc.file, doc.line_of(path), dotted(path),
                               f"{err['msg']} (got {err.get('input')!r})", err.get("hint")))
    return out


# Keys that were renamed: the unknown key's hint says what to write now.
_RENAMED = {("health", "bmc_power_interval"): "renamed: the BMC health (power) cadence is health.bmc_interval, the "
                                              "leak detectors' is health.leak_interval (docs/health.md)"}


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


def _expand(value: str, doc: Located, path: tuple, problems: list[Problem], what: str,
            names: bool = False, once: bool = True) -> list[str] | None:
    """The node set *value* expanded, or None with a problem; *names*: every member must be a host name;
    *once*: no member may be written twice (ClusterShell would fold `tray[01-02],tray02` silently)."""
    big = nodeset_too_big(value)
    if big:
        problems.append(Problem(doc.file, doc.line_of(path), dotted(path), big,
                                "an inventory node set lists one rack's trays, e.g. rack-a-tray[01-18]"))
        return None
    why = None
    if _WHITESPACE.search(value):
        why = "may not hold whitespace"
    elif "@" in value:
        why = ("may not name a node group (@group): the inventory lists its hosts itself, not this machine's "
               "ClusterShell groups")
    if why:
        problems.append(Problem(doc.file, doc.line_of(path), dotted(path), f"the node set {shown(value)} {why}",
                                "use ClusterShell syntax, e.g. rack-a-tray[01-18] or 10.0.1.[11-28]"))
        return None
    try:
        # NodeSet folds and sorts; expansion order is the natural order of the set.
        out = list(NodeSet(value))
    except (NodeSetParseError, RangeSetParseError) as exc:
        problems.append(Problem(doc.file, doc.line_of(path), dotted(path), f"bad node-set syntax in {what} {value!r}: {exc}",
                                "use ClusterShell syntax, e.g. rack-a-tray[01-18] or 10.0.1.[11-28]"))
        return None
    if names:
        bad = [n for n in out if not is_host_name(n)]
        if bad:
            problems.append(Problem(doc.file, doc.line_of(path), dotted(path),
                                    f"{shown(bad[0])} is not a valid host name"
                                    + (f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""),
                                    f"a host name is {HOST_GRAMMAR}"))
            return None
    twice = _written_twice(value, len(out)) if once else []
    if twice:
        problems.append(Problem(doc.file, doc.line_of(path), dotted(path),
                                f"{twice[0]} is written twice in {what} {shown(value)}"
                                + (f" (and {len(twice) - 1} more)" if len(twice) > 1 else ""),
                                "name each one once"))
        return None
    return out


def _written_twice(expr: str, members: int) -> list[str]:
    """Names the expression writes more than once: its terms (`a[1-2],a2`) and each bracket's ranges
    (`a[1-2,2]`) expanded apart and counted. Set operators (`!`, `&`, `^`) mean to overlap: not counted."""
    if members >= nodeset_size(expr) or _SET_OPERATOR.search(expr):
        return []
    counts: dict[str, int] = {}
    for piece in _pieces(expr):
        try:
            for name in NodeSet(piece):
                counts[name] = counts.get(name, 0) + 1
        except (NodeSetParseError, RangeSetParseError):
            return []
    return [name for name, n in counts.items() if n > 1]


def _pieces(expr: str) -> list[str]:
    """*expr* as the parts it is written in: top-level terms, a bracket's comma-separated ranges one by one."""
    terms, depth, start = [], 0, 0
    for i, ch in enumerate(expr):
        depth += ch == "["
        depth -= ch == "]"
        if ch == "," and depth == 0:
            terms.append(expr[start:i])
            start = i + 1
    terms.append(expr[start:])
    out = []
    for term in terms:
        ranges = _RANGES.search(term)
        if ranges is None:
            out.append(term)
            continue
        for one in ranges.group(1).split(","):
            out.extend(_pieces(f"{term[:ranges.start()]}[{one}]{term[ranges.end():]}"))
    return out


def _check_name(name: Any, ok: bool, grammar: str, what: str, doc: Located, path: tuple,
                problems: list[Problem]) -> bool:
    if not ok:
        problems.append(Problem(doc.file, doc.line_of(path), dotted(path), f"{shown(name)} is not a valid {what}",
                                f"a {what} is {grammar}"))
    return ok


def _check_path(value: Any, doc: Located, path: tuple, problems: list[Problem], *, absolute: bool = False,
                parent_ok: bool = True) -> None:
    if value is None:
        return
    why = path_problem(value, absolute=absolute, parent_ok=parent_ok)
    if why:
        problems.append(Problem(doc.file, doc.line_of(path), dotted(path), f"{shown(value)}: {why}"))


def _check_vars(values: dict[str, Any], doc: Located, path: tuple, problems: list[Problem]) -> None:
    """Refuse the Ansible variables that would loosen SSH, and check those mctl reads itself."""
    for key, value in values.items():
        vpath = path + (key,)
        if not isinstance(key, str) or not _VAR_NAME.match(key):
            problems.append(Problem(doc.file, doc.line_of(vpath), dotted(vpath), f"{shown(key)} is not a variable name",
                                    "letters, digits and '_', not starting with a digit"))
            continue
        if refused_var(key):
            problems.append(Problem(doc.file, doc.line_of(vpath), dotted(vpath),
                                    f"{key} is not allowed in an mctl inventory",
                                    REFUSED_VARS.get(key, "mctl sets the SSH and host-key options itself")))
            continue
        ranged = isinstance(value, str) and _RANGE_VALUE.match(value)
        if not ranged:                  # a per-tray range is checked per tray, once expanded
            _check_read_var(key, value, doc, vpath, problems)


def _check_read_var(key: str, value: Any, doc: Located, vpath: tuple, problems: list[Problem]) -> bool:
    """The Ansible variables mctl's own SSH reads (transport.targets.SSHTarget.for_host)."""
    before = len(problems)
    if key == "ansible_port" and not _is_port(value):
        problems.append(Problem(doc.file, doc.line_of(vpath), dotted(vpath),
                                f"ansible_port must be a TCP port 1-65535 (got {shown(value)})"))
    elif key == "ansible_user" and not (isinstance(value, str) and _USER.match(value)):
        problems.append(Problem(doc.file, doc.line_of(vpath), dotted(vpath),
                                f"{shown(value)} is not a valid user name for ansible_user",
                                "letters, digits, '_', '.' and '-', not starting with a digit or '-'"))
    elif key == "ansible_host":
        if not isinstance(value, str):
            problems.append(Problem(doc.file, doc.line_of(vpath), dotted(vpath),
                                    f"ansible_host must be an address or host name (got {shown(value)})"))
        else:
            _check_address(value, doc, vpath, problems)
    return len(problems) == before


def refused_var(key: str) -> bool:
    """An Ansible variable that would change how Ansible connects or which host keys it trusts."""
    return key in REFUSED_VARS or _REFUSED_VAR.match(key) is not None


def _is_port(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 5:
        value = int(value)
    return isinstance(value, int) and 1 <= value <= 65535


def _check_address(addr: str, doc: Located, path: tuple, problems: list[Problem], *, zone: bool = True) -> bool:
    """An SSH address (a head's, a tray's, ansible_host) may carry an IPv6 zone; a BMC's goes into a URL."""
    return _check_addresses([addr], doc, path, problems, zone=zone)


def _check_addresses(addrs: list[str], doc: Located, path: tuple, problems: list[Problem], *,
                     zone: bool = True) -> bool:
    """One problem for the field, naming the first bad address of its node set."""
    bad = [why for why in (address_problem(a, zone=zone) for a in addrs) if why]
    if bad:
        problems.append(Problem(doc.file, doc.line_of(path), dotted(path),
                                bad[0] + (f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""), ADDRESS_HINT))
    return not bad


def _address_key(addr: str) -> str:
    """One spelling per address, so `fd00::0:11` and `FD00::11`, `Head.example` and `head.example` are one
    (an IPv4 address that passed the grammar has one spelling already)."""
    if ":" in addr:
        try:
            return str(ipaddress.IPv6Address(addr))
        except ValueError:
            pass
    return addr.lower()


def _group_hosts(group: TrayGroup, role: str, rack: str, doc: Located, path: tuple,
                 problems: list[Problem]) -> list[Host]:
    names = _expand(group.nodes, doc, path + ("nodes",), problems, "nodes", names=True)
    addrs = _expand(group.addresses, doc, path + ("addresses",), problems, "addresses")
    bmcs = _expand(group.bmc, doc, path + ("bmc",), problems, "bmc") if group.bmc else None
    _check_vars(group.vars, doc, path + ("vars",), problems)
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
            values = _expand("x" + value, doc, path + ("vars", key), problems, f"vars.{key}", once=False)
            if values is None:
                continue
            if len(values) != len(names):
                problems.append(Problem(doc.file, doc.line_of(path + ("vars", key)), dotted(path + ("vars", key)),
                                        f"{len(values)} values for {len(names)} nodes"))
                continue
            for i, v in enumerate(values):
                per_host_vars[i][key] = int(v[1:]) if v[1:].isdigit() else v[1:]
            for hv in per_host_vars:
                if not _check_read_var(key, hv[key], doc, path + ("vars", key), problems):
                    break
        else:
            for hv in per_host_vars:
                hv[key] = value
    _check_addresses(addrs, doc, path + ("addresses",), problems)
    if bmcs:
        _check_addresses(bmcs, doc, path + ("bmc",), problems, zone=False)
    hosts = []
    for i, (name, addr) in enumerate(zip(names, addrs)):
        hosts.append(Host(name=name, address=addr, role=role, rack=rack,  # type: ignore[arg-type]
                          bmc=bmcs[i] if bmcs else None, image=group.image, vars=per_host_vars[i]))
    return hosts


def _build_site(spec: SiteSpec, file: Path, doc: Located) -> tuple[Site | None, list[Problem]]:
    problems: list[Problem] = []
    racks: dict[str, Rack] = {}
    images_dir = (file.parent / spec.images_dir).resolve() if spec.images_dir else None
    seen_names: dict[str, str] = {}
    folded_names: dict[str, str] = {}       # lower case -> the name as first written
    seen_addrs: dict[str, str] = {}         # _address_key -> the host (or "bmc <address>") that has it

    _check_site(spec, doc, problems)
    for rack_name, rs in spec.racks.items():
        rpath = ("racks", rack_name)
        if not _check_name(rack_name, is_host_name(rack_name), HOST_GRAMMAR, "rack name", doc, rpath, problems):
            continue
        compute = _group_hosts(rs.compute, "compute", rack_name, doc, rpath + ("compute",), problems)
        switches = _group_hosts(rs.switches, "switch", rack_name, doc, rpath + ("switches",), problems) if rs.switches else []
        head = None
        if rs.head:
            _check_name(rs.head.name, is_host_name(rs.head.name), HOST_GRAMMAR, "host name", doc,
                        rpath + ("head", "name"), problems)
            _check_address(rs.head.address, doc, rpath + ("head", "address"), problems)
            _check_vars(rs.head.vars, doc, rpath + ("head", "vars"), problems)
            head = Host(rs.head.name, rs.head.address, "head", rack_name, vars=dict(rs.head.vars))
        if rs.nmx:
            _check_path(rs.nmx.credentials_file, doc, rpath + ("nmx", "credentials_file"), problems)

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
            elif host.name.lower() in folded_names:
                problems.append(Problem(doc.file, doc.line_of(hpath + ("nodes",)), dotted(hpath),
                                        f"host name {host.name} is {folded_names[host.name.lower()]} in other letters",
                                        "host names are case-insensitive (DNS, ssh's known_hosts): name each host once"))
            seen_names.setdefault(host.name, dotted(hpath))
            folded_names.setdefault(host.name.lower(), host.name)
            address = _address_key(host.address)
            if address in seen_addrs:
                problems.append(Problem(doc.file, doc.line_of(hpath + ("addresses",)), dotted(hpath),
                                        f"duplicate address {host.address} ({host.name}; also used by {seen_addrs[address]})"))
            seen_addrs.setdefault(address, host.name)
            if host.bmc:
                bmc = _address_key(host.bmc)
                if bmc in seen_addrs:
                    problems.append(Problem(doc.file, doc.line_of(hpath + ("bmc",)), dotted(hpath + ("bmc",)),
                                            f"duplicate address {host.bmc} (BMC of {host.name}; also used by {seen_addrs[bmc]})"))
                seen_addrs.setdefault(bmc, "bmc " + host.bmc)

        for group, gpath in ((rs.compute, rpath + ("compute",)), (rs.switches, rpath + ("switches",))):
            if group is None or group.image is None:
                continue
            if not is_partition_name(group.image):
                _check_name(group.image, False, PARTITION_GRAMMAR, "image name", doc, gpath + ("image",), problems)
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
                                nmx=nmx_settings(rs.nmx), head=head, compute=tuple(compute), switches=tuple(switches),
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

    site = Site(name=spec.site, file=file.resolve(), ssh=ssh_settings(spec.ssh), racks=racks,
                scheduler=scheduler_settings(spec.scheduler), health=_health(spec, doc, problems),
                images_dir=images_dir, vars=dict(spec.vars), bmc=bmc_settings(spec.bmc),
                safety=safety_settings(spec.safety))
    _ladder_problems(spec, doc, problems)
    _bmc_cadence_problems(spec, doc, problems)
    _isolate_problems(spec, doc, problems)
    _event_problems(spec, doc, problems)
    _shard_problems(spec, doc, problems)
    _failover_problems(spec, doc, problems)
    _budget_problems(site, doc, problems)
    _leak_problems(site, doc, problems)
    if spec.bmc is not None:
        _check_path(spec.bmc.credentials_file, doc, ("bmc", "credentials_file"), problems)
        if spec.bmc.scheme == "http" and any(not _loopback(h.bmc) for h in site.hosts() if h.bmc):
            problems.append(Problem(doc.file, doc.line_of(("bmc", "scheme")), "bmc.scheme",
                                    "bmc.scheme http on routed BMC addresses: the BMC credentials would cross "
                                    "the network in clear", "use https (the default)"))
        if isinstance(spec.bmc.verify_tls, str) and (spec.bmc.verify_tls.strip().lower() in _BOOL_WORDS
                                                     or not spec.bmc.verify_tls.strip()):
            problems.append(Problem(doc.file, doc.line_of(("bmc", "verify_tls")), "bmc.verify_tls",
                                    f"verify_tls is the string {spec.bmc.verify_tls!r}, not a boolean or a CA "
                                    "bundle path", "write verify_tls: false (without quotes), or the CA path"))
    return site, problems


def _health(spec: SiteSpec, doc: Located, problems: list[Problem]) -> HealthSettings:
    """The health settings; a value only the conversion can judge is a problem at its line (the site is refused)."""
    try:
        return health_settings(spec.health)
    except UsageError as exc:
        path = ("health", "nvlink5_no_drain")
        problems.append(Problem(doc.file, doc.line_of(path), dotted(path),
                                exc.message.removeprefix("inventory health.nvlink5_no_drain: "), exc.hint))
        return HealthSettings()


def _bmc_cadence_problems(spec: SiteSpec, doc: Located, problems: list[Problem]) -> None:
    """The BMC health read rides on a leak read (mctl.health.oob): a `bmc_interval` below an explicit
    `leak_interval` could not be kept, so it is refused rather than silently read less often."""
    h = spec.health
    if h.bmc_interval is not None and h.leak_interval is not None and h.bmc_interval < h.leak_interval:
        path = ("health", "bmc_interval")
        problems.append(Problem(doc.file, doc.line_of(path), dotted(path),
                                f"bmc_interval {h.bmc_interval:g}s is shorter than leak_interval {h.leak_interval:g}s: "
                                "the BMC health is read with a leak read, never more often",
                                "make bmc_interval at least leak_interval (the leaks are the faster cadence)"))


def _shard_problems(spec: SiteSpec, doc: Located, problems: list[Problem]) -> None:
    """`health.shards`: each shard a name and racks of the inventory, no rack in two shards (two watches would
    both act on it). A rack in no shard is watched by none of the shard watches: allowed (a rack under
    bring-up), and said by `mctl health watch --shard` when it starts."""
    owner: dict[str, str] = {}
    for name, racks in spec.health.shards.items():
        path = ("health", "shards", name)
        if not re.match(NAME_PATTERN, name):
            problems.append(Problem(doc.file, doc.line_of(path), dotted(path), f"shard name {name!r} is not a name",
                                    "letters, digits, '.', '_' and '-', starting with a letter or digit"))
        if not racks:
            problems.append(Problem(doc.file, doc.line_of(path), dotted(path), f"shard {name} has no racks",
                                    "list the racks its watch owns, or remove the shard"))
        for rack in racks:
            if rack not in spec.racks:
                problems.append(Problem(doc.file, doc.line_of(path), dotted(path), f"unknown rack {rack!r} in shard "
                                        f"{name}", f"racks of this inventory: {', '.join(sorted(spec.racks))}"))
            elif rack in owner and owner[rack] != name:
                problems.append(Problem(doc.file, doc.line_of(path), dotted(path), f"rack {rack} is in shards "
                                        f"{owner[rack]} and {name}", "each rack in one shard: one watch acts on it"))
            owner.setdefault(rack, name)


def _failover_problems(spec: SiteSpec, doc: Located, problems: list[Problem]) -> None:
    """`health.failover`: etcd client URLs, and a TTL etcd grants (docs/health.md "Failover")."""
    f = spec.health.failover
    for i, url in enumerate(f.etcd):
        if not url.startswith(("http://", "https://")) or len(url.split("//", 1)[1].strip("/")) == 0:
            path = ("health", "failover", "etcd")
            problems.append(Problem(doc.file, doc.line_of(path), dotted(path), f"etcd endpoint {url!r} is not a URL",
                                    "give etcd's client URLs, e.g. http://10.0.0.1:2379"))
    if f.ttl is not None and parse_duration(f.ttl) < MIN_TTL_S:
        path = ("health", "failover", "ttl")
        problems.append(Problem(doc.file, doc.line_of(path), dotted(path), f"ttl {f.ttl} is shorter than "
                                f"{MIN_TTL_S}s", f"etcd grants leases of {MIN_TTL_S}s or more; the standby takes "
                                "over about one TTL after the leader stops"))


def _ladder_problems(spec: SiteSpec, doc: Located, problems: list[Problem]) -> None:
    """A rung turned on that cannot work is refused here, not found out when a tray fails (docs/health.md)."""
    ladder = spec.health.ladder
    path = ("health", "ladder")
    if ladder.power_cycle and spec.bmc is None:
        problems.append(Problem(doc.file, doc.line_of(path + ("power_cycle",)), dotted(path + ("power_cycle",)),
                                "the power-cycle rung needs the BMCs, but the inventory has no bmc: section",
                                "add bmc: {credentials_file: ...} (docs/bmc.md) or turn power_cycle off"))
    if (ladder.gpu_reset or ladder.reboot or ladder.power_cycle) and \
            (spec.scheduler is None or spec.scheduler.type != "slurm"):
        problems.append(Problem(doc.file, doc.line_of(path), dotted(path),
                                "the recovery ladder acts only on trays it drained in Slurm (it reads the node's "
                                "jobs from slurmctld)", "use scheduler: {type: slurm}, or turn the rungs off"))


# Which keys each event sink type reads (docs/events.md); every type takes these too.
_SINK_KEYS = {"file": ("path",), "syslog": ("address", "facility"),
              "webhook": ("url", "timeout", "retries", "backoff", "headers_file"), "exec": ("command", "timeout")}
_SINK_COMMON = ("type", "name", "kinds", "actions", "queue", "dead_letter")
_SINK_NEEDS = {"file": "path", "syslog": "address", "webhook": "url", "exec": "command"}
_SINK_HINT = "docs/events.md lists each sink type's keys"


def _event_problems(spec: SiteSpec, doc: Located, problems: list[Problem]) -> None:
    """`health.events`: each sink's keys belong to its type, its target is well formed (a URL only http(s),
    no credentials in it; a syslog address unix:PATH or udp:HOST:PORT), an exec sink runs for `repair` only."""
    raw = ((doc.data or {}).get("health") or {}).get("events") if isinstance(doc.data, dict) else None
    raw = raw if isinstance(raw, list) else []
    names: set[str] = set()

    def bad(path: tuple, why: str, hint: str = _SINK_HINT) -> None:
        problems.append(Problem(doc.file, doc.line_of(path), dotted(path), why, hint))

    for i, sink in enumerate(spec.health.events):
        path = ("health", "events", i)
        written = set(raw[i]) if i < len(raw) and isinstance(raw[i], dict) else set()
        for key in sorted(written - set(_SINK_COMMON) - set(_SINK_KEYS[sink.type])):
            bad(path + (key,), f"a {sink.type} sink has no {key!r}",
                f"a {sink.type} sink takes {', '.join(_SINK_KEYS[sink.type] + _SINK_COMMON[1:])}")
        need = _SINK_NEEDS[sink.type]
        if getattr(sink, need) in (None, [], ""):
            bad(path + (need,), f"a {sink.type} sink needs {need}")
            continue
        label = sink.name or f"{sink.type}[{i}]"
        if label in names:
            bad(path + ("name",), f"two event sinks are called {label!r}", "give each sink its own name")
        names.add(label)
        for key in ("path", "dead_letter", "headers_file"):
            _check_path(getattr(sink, key), doc, path + (key,), problems)
        if sink.type == "webhook":
            why = _webhook_url_problem(sink.url)
            if why:
                bad(path + ("url",), why, "e.g. https://hooks.example.com/mctl; a secret goes in headers_file")
        elif sink.type == "syslog":
            why = _syslog_address_problem(sink.address)
            if why:
                bad(path + ("address",), why, "unix:/dev/log, udp:127.0.0.1:514 or udp:[::1]:514")
        elif sink.type == "exec":
            if list(sink.actions) != ["repair"] or list(sink.kinds) not in ([], ["action"]):
                bad(path + ("actions",), "an exec sink runs only as the repair hook: it takes actions: [repair]",
                    "write actions: [repair]; send other events to a file, syslog or webhook sink")
            if not sink.command or not str(sink.command[0]).strip():
                bad(path + ("command",), "the command is empty", "an argument list, e.g. [/usr/local/bin/ticket, "
                    "'{tray}']")


def _webhook_url_problem(url: str) -> str | None:
    if _WHITESPACE.search(url) or any(ord(c) < 32 or ord(c) == 127 for c in url):
        return f"{url!r} holds whitespace or control characters"
    parts = urllib.parse.urlsplit(url)
    try:
        bad_port = parts.port == 0
    except ValueError:
        bad_port = True
    if parts.scheme not in ("http", "https") or not parts.hostname or bad_port:
        return f"{url!r} is not an http:// or https:// URL"
    if host := url_host_problem(parts.netloc):
        return f"the webhook URL's host: {host}"
    if parts.username or parts.password or "@" in parts.netloc:
        return "the webhook URL must not carry credentials (they would be logged with it)"
    if parts.fragment:
        return f"{url!r} has a fragment, which is never sent"
    return None


def _syslog_address_problem(address: str) -> str | None:
    if address.startswith("unix:"):
        target = address[len("unix:"):]
        if not target.startswith("/") or any(ord(c) < 32 for c in target):
            return f"{address!r}: a unix socket is an absolute path, e.g. unix:/dev/log"
        return None
    if address.startswith("udp:"):
        host, sep, port = address[len("udp:"):].rpartition(":")
        if not sep or not port.isdigit() or not 1 <= int(port) <= 65535:
            return f"{address!r}: udp:HOST:PORT with a port 1-65535"
        inner = host[1:-1] if host.startswith("[") and host.endswith("]") else host
        why = address_problem(inner, names=True, host=True) if inner else "no host"
        return f"{address!r}: {why}" if why else None
    return f"{address!r} is neither unix:PATH nor udp:HOST:PORT"


def _isolate_problems(spec: SiteSpec, doc: Located, problems: list[Problem]) -> None:
    """Isolation turned on moves trays between NMX-M partitions: every rack needs its NMX-M endpoint."""
    if not spec.health.isolate.enabled:
        return
    path = ("health", "isolate", "enabled")
    bare = sorted(name for name, rack in spec.racks.items() if rack.nmx is None)
    if bare:
        problems.append(Problem(doc.file, doc.line_of(path), dotted(path),
                                f"isolating failed trays needs NMX-M, and rack{'s' if len(bare) > 1 else ''} "
                                f"{', '.join(bare)} {'have' if len(bare) > 1 else 'has'} no nmx: endpoint",
                                "add racks.<rack>.nmx: {url: ..., credentials_file: ...} (docs/partitions.md), "
                                "or turn health.isolate.enabled off"))


def _budget_problems(site: Site, doc: Located, problems: list[Problem]) -> None:
    """A budget that lets mctl take a whole rack (or the whole site) out of service on its own decision is
    refused unless the inventory acknowledges it (docs/health.md "The safety budget")."""
    path = ("safety", "budget")
    for key, why in site.safety.budget.whole({name: len(rack.compute) for name, rack in site.racks.items()}):
        problems.append(Problem(doc.file, doc.line_of(path + (key,)), dotted(path + (key,)), why,
                                "set safety.budget.allow_whole_rack: true to allow it, or lower the share below 1"))


def _leak_problems(site: Site, doc: Located, problems: list[Problem]) -> None:
    """Every tray `health.leak.exclude` names is a compute or switch tray of the inventory, named once."""
    path = ("health", "leak", "exclude")
    trays = {h.name for h in site.hosts() if h.role in ("compute", "switch")}
    seen: set[str] = set()
    for i, name in enumerate(site.health.leak_exclude):
        where = path + (i,)
        if name in seen:
            why = f"tray {name} is listed twice"
        elif name in trays:
            why = None
        elif site.host(name) is not None:
            why = f"{name} is a head node, not a tray: only compute and switch trays are powered off for a leak"
        else:
            why = f"unknown tray {shown(name)}"
        seen.add(name)
        if why:
            problems.append(Problem(doc.file, doc.line_of(where), dotted(where), why,
                                    "list compute or switch trays of this inventory by name, each once"))


_BOOL_WORDS = ("true", "false", "yes", "no", "on", "off", "y", "n", "t", "f", "0", "1")


def _loopback(addr: str | None) -> bool:
    try:
        return bool(addr) and (addr.lower() == "localhost" or ipaddress.ip_address(addr).is_loopback)
    except ValueError:
        return False


def _nmx_problems(nmx, doc: Located, path: tuple, problems: list[Problem]) -> None:
    """The rack's NMX-M endpoint: an http(s) URL whose credentials stay with it, a typed verify_tls."""
    # Kept here, not imported from mctl.fabric.nmx: the loader is on every command's start-up path.
    bool_words = ("true", "false", "yes", "no", "on", "off", "y", "n", "t", "f", "0", "1")

    def is_loopback(host: str) -> bool:
        try:
            return host.lower() == "localhost" or ipaddress.ip_address(host.strip("[]")).is_loopback
        except ValueError:
            return False

    parts = urllib.parse.urlsplit(nmx.url)
    try:
        bad_port = parts.port == 0
    except ValueError:
        bad_port = True
    if parts.scheme not in ("http", "https") or not parts.hostname or bad_port or _WHITESPACE.search(nmx.url):
        problems.append(Problem(doc.file, doc.line_of(path + ("url",)), dotted(path + ("url",)),
                                f"{nmx.url!r} is not an http(s) URL", "e.g. https://10.20.0.5"))
    elif host := url_host_problem(parts.netloc):
        problems.append(Problem(doc.file, doc.line_of(path + ("url",)), dotted(path + ("url",)),
                                f"the NMX-M URL's host: {host}", "e.g. https://10.20.0.5 or https://[fd00::5]"))
    elif parts.query or parts.fragment or nmx.url.rstrip("/").endswith(("?", "#")):
        problems.append(Problem(doc.file, doc.line_of(path + ("url",)), dotted(path + ("url",)),
                                f"{nmx.url!r} has a query or fragment, which mctl would drop",
                                "give the NMX-M base URL: scheme, host, port and an optional path"))
    elif parts.username or parts.password or "@" in parts.netloc:
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
        if nodeset_too_big(other.compute.nodes):
            continue                        # reported for that rack
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
        _check_name(ps.name, is_partition_name(ps.name), PARTITION_GRAMMAR, "partition name", doc, path + ("name",),
                    problems)
        trays = _expand(ps.trays, doc, path + ("trays",), problems, "trays", names=True)
        if trays is None:
            continue
        if not trays:
            problems.append(Problem(doc.file, doc.line_of(path + ("trays",)), dotted(path + ("trays",)),
                                    f"partition {ps.name!r} holds no tray ({shown(ps.trays)})",
                                    f"name its trays, e.g. {rs.compute.nodes}, or remove the partition"))
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


def _check_site(spec: SiteSpec, doc: Located, problems: list[Problem]) -> None:
    """Site-wide names, paths and values that leave mctl (slurm.conf, shell commands, Ansible)."""
    _check_name(spec.site, is_cluster_name(spec.site), CLUSTER_GRAMMAR, "site name", doc, ("site",), problems)
    _check_path(spec.images_dir, doc, ("images_dir",), problems)
    if not _USER.match(spec.ssh.user):
        problems.append(Problem(doc.file, doc.line_of(("ssh", "user")), "ssh.user",
                                f"{shown(spec.ssh.user)} is not a valid user name",
                                "letters, digits, '_', '.' and '-', not starting with a digit or '-'"))
    _check_path(spec.ssh.identity_file, doc, ("ssh", "identity_file"), problems)
    _check_path(spec.ssh.known_hosts, doc, ("ssh", "known_hosts"), problems)
    _check_vars(spec.vars, doc, ("vars",), problems)
    for i, disk in enumerate(spec.health.disk_paths):
        _check_path(disk, doc, ("health", "disk_paths", i), problems, absolute=True)
    _check_path(spec.health.metrics_textfile, doc, ("health", "metrics_textfile"), problems)
    listen = address_problem(spec.health.metrics_listen, names=False, host=False)
    if listen:
        path = ("health", "metrics_listen")
        problems.append(Problem(doc.file, doc.line_of(path), dotted(path), listen,
                                f"/metrics binds {IP_HINT}: 127.0.0.1 keeps it local, 0.0.0.0 or :: opens it"))
    _bmc_events_problems(spec.health.bmc_events, doc, problems)
    sched = spec.scheduler
    if sched is None:
        return
    _check_name(sched.cluster_name, is_cluster_name(sched.cluster_name), CLUSTER_GRAMMAR, "cluster name", doc,
                ("scheduler", "cluster_name"), problems)
    if sched.controller is not None:
        _check_name(sched.controller, is_host_name(sched.controller), HOST_GRAMMAR, "host name", doc,
                    ("scheduler", "controller"), problems)
    slurm = sched.slurm
    spath = ("scheduler", "slurm")
    _check_name(slurm.partition_name, is_partition_name(slurm.partition_name), PARTITION_GRAMMAR, "partition name",
                doc, spath + ("partition_name",), problems)
    for key in _HOST_PATHS:
        _check_path(getattr(slurm, key), doc, spath + (key,), problems, absolute=True, parent_ok=False)
    for key in _SLURM_WORDS:
        value = getattr(slurm, key)
        if value is not None and not _SLURM_WORD.match(value):
            problems.append(Problem(doc.file, doc.line_of(spath + (key,)), dotted(spath + (key,)),
                                    f"{shown(value)}: a slurm.conf value may not hold whitespace, quotes, '\\' or '#'"))
    for key, value in slurm.extra.items():
        epath = spath + ("extra", key)
        if not _SLURM_KEY.match(key):
            problems.append(Problem(doc.file, doc.line_of(epath), dotted(epath), f"{shown(key)} is not a slurm.conf key",
                                    "a slurm.conf key is letters and digits, e.g. SlurmctldParameters"))
        elif not _SLURM_WORD.match(value):
            problems.append(Problem(doc.file, doc.line_of(epath), dotted(epath),
                                    f"{shown(value)}: a slurm.conf value may not hold whitespace, quotes, '\\' or '#'"))
    k8s = sched.k8s
    kpath = ("scheduler", "k8s")
    _check_path(k8s.kubeconfig, doc, kpath + ("kubeconfig",), problems)
    for key in ("namespace", "dra_namespace", "workload_namespace"):
        value = getattr(k8s, key)
        if not _K8S_NAME.match(value):
            problems.append(Problem(doc.file, doc.line_of(kpath + (key,)), dotted(kpath + (key,)),
                                    f"{shown(value)} is not a Kubernetes namespace name",
                                    "lower-case letters, digits and '-', 1-63 characters (RFC 1123 label)"))
    for key in ("gpu_operator_version", "dra_driver_version"):
        value = getattr(k8s, key)
        if value is not None and not _VERSION.match(value):
            problems.append(Problem(doc.file, doc.line_of(kpath + (key,)), dotted(kpath + (key,)),
                                    f"{shown(value)} is not a chart version", "e.g. v25.3.0"))
    if k8s.helm_repo is not None and not _URL.match(k8s.helm_repo):
        problems.append(Problem(doc.file, doc.line_of(kpath + ("helm_repo",)), dotted(kpath + ("helm_repo",)),
                                f"{shown(k8s.helm_repo)} is not an http(s) URL without quotes, '$', '`' or spaces"))
    elif k8s.helm_repo is not None and (host := url_host_problem(urllib.parse.urlsplit(k8s.helm_repo).netloc)):
        problems.append(Problem(doc.file, doc.line_of(kpath + ("helm_repo",)), dotted(kpath + ("helm_repo",)),
                                f"the Helm repository URL's host: {host}", ADDRESS_HINT))


def _bmc_events_problems(ev, doc, problems: list) -> None:
    """`health.bmc_events`: an IP to bind; http only on loopback (the events carry a token: not in the clear on a
    network); a certificate goes with its key; the URL the BMCs are given is http(s) (docs/health.md "Leak events")."""
    import ipaddress
    import urllib.parse

    base = ("health", "bmc_events")
    if ev.listen is None:
        return
    listen = address_problem(ev.listen, names=False, host=False)
    if listen:
        problems.append(Problem(doc.file, doc.line_of(base + ("listen",)), dotted(base + ("listen",)), listen,
                                f"the receiver binds {IP_HINT}"))
        return
    if (ev.tls_cert is None) != (ev.tls_key is None):
        path = base + ("tls_cert" if ev.tls_cert is None else "tls_key",)
        problems.append(Problem(doc.file, doc.line_of(path), dotted(path), "tls_cert and tls_key go together",
                                "give both (PEM files), or neither on a loopback address"))
    for key in ("tls_cert", "tls_key"):
        _check_path(getattr(ev, key), doc, base + (key,), problems)
    if ev.tls_cert is None and not ipaddress.ip_address(ev.listen).is_loopback:
        problems.append(Problem(doc.file, doc.line_of(base + ("listen",)), dotted(base + ("listen",)),
                                f"{ev.listen} is not a loopback address and no tls_cert is given",
                                "events are received over https off loopback: give tls_cert and tls_key"))
    if ev.url is not None:
        parts = urllib.parse.urlsplit(ev.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            problems.append(Problem(doc.file, doc.line_of(base + ("url",)), dotted(base + ("url",)),
                                    f"{ev.url!r} is not an http(s) URL", "e.g. https://head01.example:8443/"))
