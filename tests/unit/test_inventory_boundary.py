"""Values that look right and are not are refused at the inventory's boundary (issue 27): each with its file,
line, dotted field and a hint, exit 2 from `mctl inventory validate`, nothing written.

The classes, each attacked in several places: explicit YAML tags on any node (scalars, keys, mappings, lists;
core tags too), control and invisible characters (C0 with NUL and DEL, C1 with NEL, U+2028/U+2029, bidi
controls, zero-width characters, a BOM inside a value) written raw or as escapes, in keys and values, at any
depth; addresses outside the IPv4/IPv6 grammar or a field's rules; partitions that overlap, write a tray twice,
name another rack's tray or none; duplicate keys at any depth. What stays accepted is tested too.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from mctl.inventory import validate_inventory
from tests.unit.cli_helpers import run_cli

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = (REPO / "inventories" / "example-gb200" / "mctl.yml").read_text().replace(
    "images_dir: ../../images", f"images_dir: {REPO / 'images'}")


def replace(old: str, new: str):
    def edit(text: str) -> str:
        assert old in text, old
        return text.replace(old, new, 1)
    return edit


def group_vars(body: str):
    """`vars:` lines under rack-a's compute group."""
    return replace("      image: gb200-ubuntu24.04\n", "      image: gb200-ubuntu24.04\n      vars:\n"
                   + "".join(f"        {line}\n" for line in body.splitlines()))


def under_health(body: str):
    return replace("health:\n", "health:\n" + "".join(f"  {line}\n" for line in body.splitlines()))


def appended(body: str):
    return lambda text: text + body


def write(tmp_path: Path, text: str) -> Path:
    folder = tmp_path / "site"
    folder.mkdir(parents=True)
    (folder / "mctl.yml").write_bytes(text.encode("utf-8", "surrogatepass"))
    return folder


def digest(folder: Path) -> dict[str, str]:
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*")) if p.is_file()}


def line_with(text: str, needle: str) -> int:
    for number, line in enumerate(text.split("\n"), start=1):     # as an editor counts: line feeds only
        if needle in line:
            return number
    raise AssertionError(f"{needle!r} is not in the inventory")


# (id, edit, text on the line the problem names, its dotted field, words of its message)
CASES = [
    # explicit tags, core ones included, on every kind of node
    ("tag-str-scalar", replace("site: example-gb200", "site: !!str example-gb200"), "site:", "site", "'!!str'"),
    ("tag-int-scalar", replace("  port: 22", "  port: !!int 22"), "port: !!int", "ssh.port", "'!!int'"),
    ("tag-float", replace("max_drained_share: 0.25", "max_drained_share: !!float 0.25"), "max_drained_share",
     "health.breaker.max_drained_share", "tag"),
    ("tag-bool", group_vars("flag: !!bool true"), "flag:", "racks.rack-a.compute.vars.flag", "'!!bool'"),
    ("tag-null", group_vars("nothing: !!null ''"), "nothing:", "racks.rack-a.compute.vars.nothing", "'!!null'"),
    ("tag-non-specific", replace("cluster_name: gb200", "cluster_name: ! gb200"), "cluster_name",
     "scheduler.cluster_name", "tag '!'"),
    ("tag-local", replace("address: 10.20.0.10", "address: !addr 10.20.0.10"), "!addr", "racks.rack-a.head.address",
     "'!addr'"),
    ("tag-verbatim", replace("site: example-gb200", "site: !<tag:yaml.org,2002:str> example-gb200"), "site:",
     "site", "tag"),
    ("tag-binary", group_vars("blob: !!binary aGVsbG8="), "blob:", "racks.rack-a.compute.vars.blob", "'!!binary'"),
    ("tag-timestamp", group_vars("when: !!timestamp 2024-01-01"), "when:", "racks.rack-a.compute.vars.when", "tag"),
    ("tag-on-key", replace("  port: 22", "  !!str port: 22"), "!!str port", "ssh.port", "on a key"),
    ("tag-local-on-key", group_vars("!k motd: hi"), "!k motd", "racks.rack-a.compute.vars.motd", "on a key"),
    ("tag-on-mapping", replace("ssh:\n", "ssh: !!map\n"), "ssh: !!map", "ssh", "'!!map'"),
    ("tag-on-list", replace("drain_xids: [", "drain_xids: !!seq ["), "drain_xids", "health.drain_xids", "'!!seq'"),
    ("tag-omap", group_vars("pairs: !!omap [{a: 1}]"), "pairs:", "racks.rack-a.compute.vars.pairs", "'!!omap'"),
    ("tag-in-list-item", replace("drain_xids: [46,", "drain_xids: [!!int 46,"), "drain_xids",
     "health.drain_xids[0]", "'!!int'"),
    ("tag-nested-partition", replace("- name: p0", "- name: !!str p0"), "name: !!str p0",
     "racks.rack-a.partitions[0].name", "tag"),
    ("tag-directive-handle", lambda t: "%TAG !e! tag:example.com,2000:\n---\n" + t.replace(
        "cluster_name: gb200", "cluster_name: !e!name gb200"), "cluster_name", "scheduler.cluster_name", "tag"),
    ("merge-key-nested", group_vars("base: &b {x: 1}\nmore:\n  <<: *b"), "<<: *b", "racks.rack-a.compute.vars.more",
     "merge"),
    ("value-key-scalar", replace("site: example-gb200", "site: ="), "site:", "site", "!!value"),
    # escaped control and invisible characters in values, wherever they sit
    ("nul-site", replace("site: example-gb200", 'site: "example\\0gb200"'), "site:", "site", "U+0000"),
    ("nul-free-var", group_vars('motd: "a\\0b"'), "motd", "racks.rack-a.compute.vars.motd", "U+0000"),
    ("bell-free-var", group_vars('motd: "a\\ab"'), "motd", "racks.rack-a.compute.vars.motd", "U+0007"),
    ("escape-nested-var", group_vars('nest: {a: {b: "\\e[31mred"}}'), "nest:", "racks.rack-a.compute.vars.nest.a.b",
     "U+001B"),
    ("cr-free-var", group_vars('motd: "a\\rb"'), "motd", "racks.rack-a.compute.vars.motd", "U+000D"),
    ("vt-list-item", group_vars('list: [a, "b\\vc"]'), "list:", "racks.rack-a.compute.vars.list[1]", "U+000B"),
    ("del-site-var", appended('vars:\n  motd: "a\\x7fb"\n'), "motd", "vars.motd", "U+007F"),
    ("c1-head-var", replace("      address: 10.20.0.10\n", '      address: 10.20.0.10\n      vars: {motd: "\\x9b"}\n'),
     "vars: {motd", "racks.rack-a.head.vars.motd", "U+009B"),
    ("nel-free-var", group_vars('motd: "a\\Nb"'), "motd", "racks.rack-a.compute.vars.motd", "U+0085"),
    ("line-separator-var", group_vars('motd: "a\\Lb"'), "motd", "racks.rack-a.compute.vars.motd", "U+2028"),
    ("paragraph-separator-var", group_vars('motd: "a\\Pb"'), "motd", "racks.rack-a.compute.vars.motd", "U+2029"),
    ("rlo-free-var", group_vars('motd: "safe\\u202eexe.sh"'), "motd", "racks.rack-a.compute.vars.motd", "U+202E"),
    ("lri-free-var", group_vars('motd: "\\u2066x\\u2069"'), "motd", "racks.rack-a.compute.vars.motd", "U+2066"),
    ("lre-site", replace("site: example-gb200", 'site: "\\u202aexample"'), "site:", "site", "U+202A"),
    ("zero-width-nodes", replace("nodes: rack-a-tray[01-18]", 'nodes: "rack-a-tray\\u200b[01-18]"'), "nodes:",
     "racks.rack-a.compute.nodes", "U+200B"),
    ("zero-width-joiner-partition", replace("- name: p0", '- name: "p\\u200d0"'), "name: \"p",
     "racks.rack-a.partitions[0].name", "U+200D"),
    ("word-joiner-controller", replace("controller: rack-a-head", 'controller: "rack-a-\\u2060head"'), "controller",
     "scheduler.controller", "U+2060"),
    ("bom-inside-value", replace("cluster_name: gb200", 'cluster_name: "gb\\ufeff200"'), "cluster_name",
     "scheduler.cluster_name", "U+FEFF"),
    ("noncharacter", group_vars('motd: "\\uffff"'), "motd", "racks.rack-a.compute.vars.motd", "U+FFFF"),
    ("credentials-path", replace("credentials_file: secrets/nmx-rack-a.cred",
                                 'credentials_file: "secrets/\\u202enmx.cred"'), "credentials_file",
     "racks.rack-a.nmx.credentials_file", "U+202E"),
    ("nmx-url", replace("url: https://10.20.0.5", 'url: "https://10.20.0.5/\\x85"'), "url:", "racks.rack-a.nmx.url",
     "U+0085"),
    ("bmc-verify-tls-path", appended('bmc:\n  credentials_file: bmc.cred\n  verify_tls: "/etc/ca\\x00.pem"\n'),
     "verify_tls", "bmc.verify_tls", "U+0000"),
    ("bmc-verify-tls-newline", appended('bmc:\n  credentials_file: bmc.cred\n  verify_tls: "/etc/ca\\n.pem"\n'),
     "verify_tls", "bmc.verify_tls", "control"),
    ("nested-setting", under_health('hysteresis: {checks: ["gpu.xid\\u2028"]}'), "hysteresis",
     "health.hysteresis.checks[0]", "U+2028"),
    ("typed-tab", replace("cluster_name: gb200", 'cluster_name: "gb\\t200"'), "cluster_name", "scheduler.cluster_name",
     "control"),
    # ... and in keys, where not even a tab or a newline is text
    ("nul-key", group_vars('"mo\\0td": 1'), "mo\\0td", "racks.rack-a.compute.vars.'mo\\x00td'", "U+0000"),
    ("tab-key", group_vars('"a\\tb": 1'), "a\\tb", "racks.rack-a.compute.vars.'a\\tb'", "U+0009"),
    ("bidi-rack-key", replace("  rack-b:\n", '  "rack-\\u202eb":\n'), "rack-\\u202eb", "racks.'rack-\\u202eb'",
     "U+202E"),
    ("zero-width-extra-key", replace("  controller: rack-a-head\n",
                                     '  controller: rack-a-head\n  slurm:\n    extra: {"Prolog\\u200b": x}\n'),
     "extra:", "scheduler.slurm.extra.'Prolog\\u200b'", "U+200B"),
    # written raw into the file: located by line feeds, before YAML could count them as line breaks, and by the
    # field whose text holds them (none for a comment)
    ("raw-nul", replace("site: example-gb200", "site: example\x00gb200"), "site:", "site", "U+0000"),
    ("raw-esc", group_vars("motd: \x1b[2J"), "motd:", "racks.rack-a.compute.vars.motd", "U+001B"),
    ("raw-del", replace("cluster_name: gb200", "cluster_name: gb\x7f200"), "cluster_name", "scheduler.cluster_name",
     "U+007F"),
    ("raw-c1", replace("cluster_name: gb200", "cluster_name: gb\x9b200"), "cluster_name", "scheduler.cluster_name",
     "U+009B"),
    ("raw-nel", replace("site: example-gb200", "site: example\x85gb200"), "site:", "site", "U+0085"),
    ("raw-line-separator", replace("site: example-gb200", "site: example\u2028gb200"), "site:", "site", "U+2028"),
    ("raw-paragraph-separator", replace("  port: 22", "  port: 22\u2029"), "port: 22", "ssh.port", "U+2029"),
    ("raw-lone-cr", replace("  port: 22\n", "  port: 22\r  user: x\n"), "port: 22", "", "U+000D"),
    ("raw-bidi-in-comment", replace("# mctl site inventory", "# mctl site \u202einventory"), "mctl site", "",
     "U+202E"),
    ("raw-isolate-in-key", replace("  port: 22", "  po\u2067rt: 22"), "rt: 22", "ssh.'po\\u2067rt'", "U+2067"),
    ("raw-zero-width", replace("nodes: rack-a-tray[01-18]", "nodes: rack-a-\u200btray[01-18]"), "tray[01-18]",
     "racks.rack-a.compute.nodes", "U+200B"),
    ("raw-bom-inside", replace("site: example-gb200", "site: \ufeffexample-gb200"), "site:", "site", "U+FEFF"),
    ("raw-soft-hyphen", replace("name: rack-a-head", "name: rack-a\u00adhead"), "name: rack-a",
     "racks.rack-a.head.name", "U+00AD"),
    ("raw-in-a-quoted-key", group_vars('"mo\x00td": 1'), 'td": 1', "racks.rack-a.compute.vars.'mo\\x00td'", "U+0000"),
    ("raw-in-a-list", replace("drain_xids: [46, 48,", "drain_xids: [46, 4\u200b8,"), "drain_xids",
     "health.drain_xids[1]", "U+200B"),
    # addresses: every field, its own rules
    ("ipv4-short", replace("address: 10.20.0.10", 'address: "127.1"'), "address:", "racks.rack-a.head.address",
     "not an IPv4 address"),
    ("ipv4-leading-zero", replace("address: 10.20.0.10", "address: 0127.0.0.1"), "address:",
     "racks.rack-a.head.address", "leading zeros"),
    ("ipv4-five-parts", replace("address: 10.20.0.10", "address: 1.2.3.4.5"), "address:", "racks.rack-a.head.address",
     "not an IPv4 address"),
    ("ipv4-out-of-range", replace("address: 10.20.0.10", "address: 256.0.0.1"), "address:",
     "racks.rack-a.head.address", "not an IPv4 address"),
    ("ipv4-hex", replace("address: 10.20.0.10", 'address: "0x7f000001"'), "address:", "racks.rack-a.head.address",
     "not an IPv4 address"),
    ("ipv4-hex-dotted", replace("address: 10.20.0.10", "address: 0x7f.0.0.1"), "address:",
     "racks.rack-a.head.address", "not an IPv4 address"),
    ("ipv4-one-number", replace("address: 10.20.0.10", 'address: "2130706433"'), "address:",
     "racks.rack-a.head.address", "not an IPv4 address"),
    ("ipv4-leading-space", replace("address: 10.20.0.10", 'address: " 10.0.0.1"'), "address:",
     "racks.rack-a.head.address", "whitespace"),
    ("ipv4-trailing-dot", replace("address: 10.20.0.10", 'address: "10.20.0.10."'), "address:",
     "racks.rack-a.head.address", "neither an IP address nor a host name"),
    ("ipv6-bracketed", replace("address: 10.20.0.10", 'address: "[fd00::10]"'), "address:",
     "racks.rack-a.head.address", "brackets"),
    ("ipv6-bad", replace("address: 10.20.0.10", 'address: "fd00::10::1"'), "address:", "racks.rack-a.head.address",
     "not an IPv6 address"),
    ("ipv4-unspecified", replace("address: 10.20.0.10", "address: 0.0.0.0"), "address:", "racks.rack-a.head.address",
     "the unspecified address"),
    ("ipv4-broadcast", replace("bmc: 10.20.9.[51-59]", "bmc: 10.20.9.[51-58],255.255.255.255"), "bmc: 10.20.9.[51",
     "racks.rack-a.switches.bmc", "the broadcast address"),
    ("ipv6-multicast", group_vars('ansible_host: "ff02::1"'), "ansible_host", "racks.rack-a.compute.vars.ansible_host",
     "a multicast address"),
    ("ipv6-zone-not-interface", replace("address: 10.20.0.10", 'address: "fe80::1%a;b"'), "address:",
     "racks.rack-a.head.address", "not an interface name"),
    ("addresses-leading-zero", replace("addresses: 10.20.1.[11-28]", "addresses: 10.20.01.[11-28]"), "addresses:",
     "racks.rack-a.compute.addresses", "(and 17 more)"),
    ("addresses-out-of-range", replace("addresses: 10.20.2.[11-19]", "addresses: 10.20.2.[250-258]"),
     "addresses: 10.20.2", "racks.rack-a.switches.addresses", "'10.20.2.256' is not an IPv4 address"),
    ("addresses-space", replace("addresses: 10.20.1.[11-28]", 'addresses: " 10.20.1.[11-28]"'), "addresses:",
     "racks.rack-a.compute.addresses", "whitespace"),
    ("bmc-short", replace("bmc: 10.20.9.[11-28]", 'bmc: "10.[11-28]"'), "bmc:", "racks.rack-a.compute.bmc",
     "not an IPv4 address"),
    ("bmc-zone", replace("bmc: 10.20.9.[11-28]", 'bmc: "fe80::[11-28]%eth0"'), "bmc:", "racks.rack-a.compute.bmc",
     "zone"),
    ("ansible-host-short", group_vars('ansible_host: "10.1"'), "ansible_host", "racks.rack-a.compute.vars.ansible_host",
     "not an IPv4 address"),
    ("nmx-host-short", replace("url: https://10.20.0.5", "url: https://10.5"), "url:", "racks.rack-a.nmx.url",
     "not an IPv4 address"),
    ("nmx-host-leading-zero", replace("url: https://10.20.0.5", "url: https://010.20.0.5:8443"), "url:",
     "racks.rack-a.nmx.url", "leading zeros"),
    ("nmx-host-zone", replace("url: https://10.20.0.5", 'url: "https://[fe80::5%25eth0]"'), "url:",
     "racks.rack-a.nmx.url", "zone"),
    ("nmx-host-underscore", replace("url: https://10.20.0.5", "url: https://nmx_m.example"), "url:",
     "racks.rack-a.nmx.url", "neither an IP address nor a host name"),
    ("nmx-host-unspecified", replace("url: https://10.20.0.5", 'url: "https://[::]:8443"'), "url:",
     "racks.rack-a.nmx.url", "the unspecified address"),
    ("nmx-port-zero", replace("url: https://10.20.0.5", "url: https://10.20.0.5:0"), "url:", "racks.rack-a.nmx.url",
     "not an http(s) URL"),
    ("nmx-empty-userinfo", replace("url: https://10.20.0.5", "url: https://@10.20.0.5"), "url:", "racks.rack-a.nmx.url",
     "credentials"),
    ("nmx-space", replace("url: https://10.20.0.5", 'url: "https://10.20.0.5 "'), "url:", "racks.rack-a.nmx.url",
     "not an http(s) URL"),
    ("nmx-query", replace("url: https://10.20.0.5", 'url: "https://10.20.0.5/?x=1"'), "url:", "racks.rack-a.nmx.url",
     "query or fragment"),
    ("metrics-listen-short", under_health('metrics_listen: "127.1"'), "metrics_listen", "health.metrics_listen",
     "not an IPv4 address"),
    ("metrics-listen-name", under_health("metrics_listen: localhost"), "metrics_listen", "health.metrics_listen",
     "not an IP address"),
    ("metrics-listen-brackets", under_health('metrics_listen: "[::1]"'), "metrics_listen", "health.metrics_listen",
     "brackets"),
    ("metrics-listen-zone", under_health('metrics_listen: "fe80::1%eth0"'), "metrics_listen", "health.metrics_listen",
     "zone"),
    ("bmc-events-http-off-loopback", under_health("bmc_events: {listen: 0.0.0.0}"), "bmc_events",
     "health.bmc_events.listen", "not a loopback address and no tls_cert"),
    ("bmc-events-listen-name", under_health("bmc_events: {listen: head01}"), "bmc_events", "health.bmc_events.listen",
     "not an IP address"),
    ("bmc-events-url", under_health('bmc_events: {listen: 127.0.0.1, url: "ftp://x"}'), "bmc_events",
     "health.bmc_events.url", "not an http(s) URL"),
    ("helm-repo-host", replace("  controller: rack-a-head\n",
                               "  controller: rack-a-head\n  k8s: {helm_repo: 'https://256.1.1.1/charts'}\n"),
     "helm_repo", "scheduler.k8s.helm_repo", "not an IPv4 address"),
    # node sets and partitions
    ("partition-tray-twice", replace("trays: rack-a-tray[01-09]", "trays: rack-a-tray[01-09],rack-a-tray02"),
     "trays: rack-a-tray[01-09],", "racks.rack-a.partitions[0].trays", "rack-a-tray02 is written twice"),
    ("partition-tray-twice-in-brackets", replace("trays: rack-a-tray[01-09]", "trays: rack-a-tray[01-09,05]"),
     "trays: rack-a-tray[01-09,05]", "racks.rack-a.partitions[0].trays", "rack-a-tray05 is written twice"),
    ("partition-tray-twice-spelled-apart", replace("trays: rack-a-tray[01-09]",
                                                   "trays: rack-a-tray[01-02],rack-a-tray02,rack-a-tray[03-09]"),
     "trays: rack-a-tray[01-02],", "racks.rack-a.partitions[0].trays", "written twice"),
    ("partitions-overlap", replace("trays: rack-a-tray[10-18]", "trays: rack-a-tray[09-18]"), "rack-a-tray[09-18]",
     "racks.rack-a.partitions[1].trays", "partitions overlap"),
    ("partition-other-rack", replace("trays: rack-a-tray[10-18]", "trays: rack-a-tray[10-17],rack-b-tray18"),
     "rack-b-tray18", "racks.rack-a.partitions[1].trays", "belongs to rack rack-b"),
    ("partition-switch-tray", replace("trays: rack-a-tray[10-18]", "trays: rack-a-tray[10-17],rack-a-nvsw01"),
     "rack-a-nvsw01", "racks.rack-a.partitions[1].trays", "unknown tray rack-a-nvsw01"),
    ("partition-empty", replace("trays: rack-a-tray[01-09]", 'trays: ""'), 'trays: ""',
     "racks.rack-a.partitions[0].trays", "holds no tray"),
    ("partition-empty-by-difference", replace("trays: rack-a-tray[01-09]", "trays: rack-a-tray01!rack-a-tray01"),
     "trays: rack-a-tray01!", "racks.rack-a.partitions[0].trays", "holds no tray"),
    ("partition-node-group", replace("trays: rack-a-tray[01-09]", 'trays: "@gpu"'), "@gpu",
     "racks.rack-a.partitions[0].trays", "node group"),
    ("nodes-tray-twice", replace("nodes: rack-b-tray[01-18]", "nodes: rack-b-tray[01-17],rack-b-tray[17-18]"),
     "nodes: rack-b-tray[01-17]", "racks.rack-b.compute.nodes", "rack-b-tray17 is written twice"),
    ("nodes-space", replace("nodes: rack-a-nvsw[01-09]", 'nodes: "rack-a-nvsw[01-04], rack-a-nvsw[05-09]"'),
     "nodes: \"rack-a-nvsw", "racks.rack-a.switches.nodes", "whitespace"),
    ("addresses-twice", replace("addresses: 10.20.4.[11-19]", "addresses: 10.20.4.[11-18],10.20.4.18"),
     "addresses: 10.20.4", "racks.rack-b.switches.addresses", "10.20.4.18 is written twice"),
    # duplicate keys at any depth
    ("duplicate-key-top", appended("site: again\n"), "site: again", "site", "duplicate key"),
    ("duplicate-key-rack", replace("    model: nvl72\n    nmx:\n      url: https://10.20.0.6",
                                   "    model: nvl72\n    model: nvl72\n    nmx:\n      url: https://10.20.0.6"),
     "model: nvl72#3", "racks.rack-b.model", "duplicate key"),
    ("duplicate-key-deep-var", group_vars("nest: {a: {b: 1, b: 2}}"), "nest:", "racks.rack-a.compute.vars.nest.a.b",
     "duplicate key"),
    ("duplicate-key-in-list-item", replace("- name: p1\n", "- name: p1\n        name: p2\n"), "name: p2",
     "racks.rack-a.partitions[1].name", "duplicate key"),
]


def _expected_line(text: str, needle: str) -> int:
    needle, _, nth = needle.partition("#")
    lines = [i for i, line in enumerate(text.split("\n"), start=1) if needle in line]
    assert lines, f"{needle!r} is not in the inventory"
    return lines[int(nth or 1) - 1]


@pytest.mark.parametrize("case_id,edit,needle,field,words", CASES, ids=[c[0] for c in CASES])
def test_hostile_inventory_is_refused_at_its_line(tmp_path, case_id, edit, needle, field, words):
    text = edit(EXAMPLE)
    site, problems = validate_inventory(write(tmp_path, text))
    assert site is None
    line = _expected_line(text, needle)
    found = [p for p in problems if p.line == line and p.field == field and words in p.message]
    assert found, f"no problem at line {line}, field {field!r}, saying {words!r}: {[p.render() for p in problems]}"
    assert found[0].file.endswith("mctl.yml") and found[0].hint


def test_a_refusal_is_exit_2_and_writes_nothing(tmp_path, capsys):
    text = group_vars('motd: "a\\u202eb"')(replace("  port: 22", "  port: !!int 22")(EXAMPLE))
    folder = write(tmp_path, text)
    before = digest(tmp_path)
    res = run_cli(capsys, "-i", str(folder), "inventory", "validate")
    assert res.code == 2 and "Traceback" not in res.out + res.err
    assert f"mctl.yml:{line_with(text, 'port: !!int')}: ssh.port: YAML tag '!!int'" in res.out
    assert f"mctl.yml:{line_with(text, 'motd:')}: racks.rack-a.compute.vars.motd:" in res.out
    assert res.out.count("hint:") >= 2
    state = tmp_path / "state"
    res = run_cli(capsys, "-i", str(folder), "--state-dir", str(state), "partition", "create", "rack-b", "p9",
                  "--trays", "rack-b-tray18", "--no-apply")
    assert res.code == 2 and "YAML tag '!!int'" in res.err and "(and 1 more)" in res.err
    assert digest(tmp_path) == before


def test_every_problem_of_one_file_is_reported_in_one_pass(tmp_path):
    text = EXAMPLE.replace("  port: 22", "  port: !!int 22").replace("cluster_name: gb200", 'cluster_name: "gb\\0"')
    text = text.replace("connect_timeout: 10", "connect_timeout: 0")
    _, problems = validate_inventory(write(tmp_path / "a", text))
    assert [p.field for p in problems] == ["ssh.port", "scheduler.cluster_name", "ssh.connect_timeout"]
    # the character once, though the schema refuses the value too
    text = EXAMPLE.replace("address: 10.20.0.10", 'address: "127.1"').replace("trays: rack-a-tray[01-09]", 'trays: ""')
    text = text.replace("nodes: rack-b-tray[01-18]", "nodes: rack-b-tray[01-18],rack-b-tray01")
    _, problems = validate_inventory(write(tmp_path / "b", text))
    assert {"racks.rack-a.head.address", "racks.rack-a.partitions[0].trays", "racks.rack-b.compute.nodes"} <= \
        {p.field for p in problems}


def test_raw_characters_name_their_column_and_line_numbers_stay_an_editors(tmp_path):
    text = EXAMPLE.replace("site: example-gb200", "site: example\u2028gb200").replace("  port: 22", "  port: 2\x002")
    _, problems = validate_inventory(write(tmp_path, text))
    assert [(p.line, p.message.split(":")[0]) for p in problems] == [
        (line_with(text, "site: example"), "U+2028 (LINE SEPARATOR) at column 14"),
        (line_with(text, "port: 2"), "U+0000 (NUL) at column 10")]


def test_an_alias_repeats_its_value_but_not_its_problem(tmp_path):
    text = group_vars('a: &x "bad\\0"\nb: *x\nc: *x')(EXAMPLE)
    _, problems = validate_inventory(write(tmp_path, text))
    assert [p.field for p in problems] == ["racks.rack-a.compute.vars.a"]


def test_the_ordinary_stays_accepted(tmp_path):
    """Anchors and aliases, multi-line free text, CR LF line ends, a leading BOM, IPv6 with a zone on an SSH
    address, host names, non-ASCII text: none of these is hostile."""
    text = group_vars('shared: &shared {a: 1}\nagain: *shared\nmotd: "two\\nlines\\twith a tab"\n'
                      'banner: |\n  first line\n  second line\ngreeting: "grüße, 你好, 👋"')(EXAMPLE)
    text = text.replace("address: 10.20.0.10", 'address: "fe80::10%eth0"')
    text = text.replace("addresses: 10.20.4.[11-19]", 'addresses: "fd00::4:[11-19]"')
    text = text.replace("url: https://10.20.0.6", "url: https://[fd00::6]:8443/nmx")
    text = text.replace("nodes: rack-a-tray[01-18]", "nodes: rack-a-tray[01-09],rack-a-tray[10-18]")
    text = under_health("metrics_listen: '::'")(text)                   # a listening address binds every interface
    text = "\ufeff" + text.replace("\n", "\r\n")
    site, problems = validate_inventory(write(tmp_path, text))
    assert problems == [], [p.render() for p in problems]
    tray = site.host("rack-a-tray01")
    assert tray.vars["again"] == {"a": 1} and tray.vars["motd"] == "two\nlines\twith a tab"
    assert tray.vars["banner"] == "first line\nsecond line\n"
    assert site.host("rack-a-head").address == "fe80::10%eth0"
    assert site.host("rack-b-nvsw01").address == "fd00::4:11"


def test_group_vars_beside_the_inventory_follow_the_same_rules(tmp_path, capsys):
    from mctl.errors import UsageError
    from mctl.inventory.ansible import ansible_view

    folder = write(tmp_path, EXAMPLE)
    (folder / "group_vars").mkdir()
    target = folder / "group_vars" / "all.yml"
    for body, words in (("ntp: !!str pool\n", "2: ntp: YAML tag '!!str'"),
                        ("ntp: a\nntp: b\n", "3: ntp: duplicate key"),
                        ('ntp: "a\\u202eb"\n', "2: ntp: the value"),
                        ("ntp: a\x85\n", "2: ntp: U+0085")):
        target.write_text("# site variables\n" + body)
        with pytest.raises(UsageError) as info:
            ansible_view(folder)
        assert f"{target}:{words}" in info.value.message and info.value.hint
    target.write_text("motd: |\n  two\n  lines\n")
    ansible_view(folder)


def test_one_host_or_address_in_two_spellings_is_a_duplicate(tmp_path):
    text = EXAMPLE.replace("name: rack-a-head", "name: RACK-A-TRAY01").replace("controller: rack-a-head",
                                                                              "controller: RACK-A-TRAY01")
    _, problems = validate_inventory(write(tmp_path / "a", text))
    assert [(p.field, p.message) for p in problems if "in other letters" in p.message] == [
        ("racks.rack-a.head", "host name RACK-A-TRAY01 is rack-a-tray01 in other letters")]
    text = EXAMPLE.replace("address: 10.20.0.10", 'address: "fd00::0:11"').replace(
        "addresses: 10.20.2.[11-19]", 'addresses: "FD00::[11-19]"')
    _, problems = validate_inventory(write(tmp_path / "b", text))
    assert [p.message for p in problems] == ["duplicate address fd00::0:11 (rack-a-head; also used by rack-a-nvsw01)"]
