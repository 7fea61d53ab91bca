"""Evidence before repair: one bundle per tray in the state directory, with an index.

    collect(site, hosts, state_dir, reason=..., deadline_s=..., max_bytes=..., facts=..., findings=...) -> [Bundle]
    plan(hosts, state_dir, ...) -> [dict]             what --dry-run says (nothing is read or written)
    command(nonce, deadline_s, caps) / parse(stdout, nonce, caps)                  pure

A bundle is what NVIDIA support and a repair technician ask for, taken while the tray still shows
the fault (before a GPU reset, reboot or power cycle wipes it), and on demand (`mctl health evidence`):

    <state>/evidence/<tray>/<UTC time>-<reason>/
        nvidia-bug-report.log.gz   nvidia-bug-report.sh, the driver's own collector, under timeout(1)
        kernel.log                 the kernel log's tail (kern.log, else the journal's kernel messages)
        nvidia-imex.log            the IMEX daemon's log, its tail
        tray.txt                   uname, os-release, boot id, uptime, `nvidia-smi -q`
        facts.json                 the tray's facts as the sweep read them (when the caller has them)
        findings.json              the sweep's findings for the tray, its health record, its recent actions
        bundle.json                what each file is: bytes, sha256, whether it was capped or failed, why
    <state>/evidence/index.jsonl   one line per bundle (appended, fsynced)

Everything on the tray is one SSH command with one deadline (the bug report gets all of it but
RESERVE_S); each file has its share of the size cap (the tail is kept where a log is longer), and a
file over its share says so. A tray that does not answer still gets a bundle: its facts and findings
from the caller, and why nothing came from the tray. Nothing here ever fails the caller: evidence is
taken for a repair, not in its way.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

if TYPE_CHECKING:
    from mctl.model.site import Host, Site

EVIDENCE_DIR = "evidence"
INDEX = "index.jsonl"
BUG_REPORT = "nvidia-bug-report.sh"
DEFAULT_DEADLINE_S = 120.0           # NVIDIA: the report "will typically run quickly, but in rare cases may run slowly"
LADDER_DEADLINE_S = 60.0             # before a rung: the tray is already out of service, the rung waits for this
DEFAULT_MAX_BYTES = 32 << 20         # one bundle
MIN_MAX_BYTES = 64 << 10
RESERVE_S = 15.0                     # of the deadline, left for the logs and the transfer after the bug report
KERN_LOG = "/var/log/kern.log"
IMEX_LOG = "/var/log/nvidia-imex.log"
RECENT_ACTIONS = 50
# each file's share of the bundle's size cap
SHARES = {"nvidia-bug-report.log.gz": 0.55, "kernel.log": 0.2, "nvidia-imex.log": 0.1, "tray.txt": 0.1,
          "json": 0.05}
SECTIONS = ("bug-rc", "bug-size", "nvidia-bug-report.log.gz", "bug-output", "kernel.log", "nvidia-imex.log", "tray.txt")
_SLUG = re.compile(r"[^A-Za-z0-9_]+")


@dataclass
class Item:
    name: str
    status: str                       # ok | capped | failed | missing
    bytes: int = 0
    sha256: str | None = None
    note: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "status": self.status, "bytes": self.bytes, "sha256": self.sha256,
                "note": self.note}


@dataclass
class Bundle:
    tray: str
    path: Path
    reason: str
    started: float
    seconds: float = 0.0
    reached: bool = True
    items: list[Item] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def bytes(self) -> int:
        return sum(i.bytes for i in self.items)

    def to_dict(self, state_dir: Path | None = None) -> dict[str, Any]:
        path = self.path
        if state_dir is not None:
            try:
                path = self.path.relative_to(state_dir)
            except ValueError:
                pass
        return {"tray": self.tray, "path": str(path), "reason": self.reason,
                "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.started)),
                "seconds": round(self.seconds, 2), "reached": self.reached, "bytes": self.bytes,
                "files": [i.to_dict() for i in self.items], "problems": list(self.problems)}


def caps(max_bytes: int) -> dict[str, int]:
    return {name: max(4096, int(max_bytes * share)) for name, share in SHARES.items()}


def command(nonce: str, deadline_s: float, cap: Mapping[str, int]) -> str:
    """One shell command: the bug report in a private temporary folder (removed after), then the logs,
    each section marked `==NONCE name==` and base64-encoded (the report is gzip, the logs may hold any byte)."""
    bug_s = max(5.0, deadline_s - RESERVE_S)
    return "\n".join([
        f"n={nonce}",
        'sec() { printf "\\n==%s %s==\\n" "$n" "$1"; }',
        'd=$(mktemp -d /tmp/mctl-evidence.XXXXXX) || exit 97',
        f'if command -v {BUG_REPORT} >/dev/null 2>&1; then',
        f'  (cd "$d" && exec timeout -k 5 {bug_s:g} {BUG_REPORT} >"$d/out.txt" 2>&1); rc=$?',
        'else rc=127; echo "nvidia-bug-report.sh: command not found" >"$d/out.txt"; fi',
        'sec bug-rc; echo "$rc"',
        'f="$d/nvidia-bug-report.log.gz"',
        'sec bug-size; [ -f "$f" ] && stat -c %s "$f"',
        f'sec nvidia-bug-report.log.gz; [ -f "$f" ] && head -c {cap["nvidia-bug-report.log.gz"]} "$f" | base64 -w0',
        'sec bug-output; tail -c 2000 "$d/out.txt" 2>/dev/null | base64 -w0',
        f'sec kernel.log; {{ if [ -r {KERN_LOG} ]; then tail -c {cap["kernel.log"]} {KERN_LOG}; '
        f'else journalctl -k --no-pager -n 20000 2>/dev/null | tail -c {cap["kernel.log"]}; fi; }} | base64 -w0',
        f'sec nvidia-imex.log; [ -r {IMEX_LOG} ] && tail -c {cap["nvidia-imex.log"]} {IMEX_LOG} | base64 -w0',
        'sec tray.txt; { uname -a; cat /etc/os-release; echo "boot_id $(cat /proc/sys/kernel/random/boot_id)"; '
        f'uptime; timeout 20 nvidia-smi -q; }} 2>&1 | head -c {cap["tray.txt"]} | base64 -w0',
        'rm -rf "$d"',
        'echo',
    ])


def parse(stdout: str, nonce: str) -> dict[str, bytes | None]:
    """Section name -> its bytes (None: the section is missing, e.g. the command was cut by its deadline)."""
    out: dict[str, bytes | None] = {name: None for name in SECTIONS}
    marker = re.compile(r"^==" + re.escape(nonce) + r" ([a-z0-9.-]+)==$", re.M)
    marks = list(marker.finditer(stdout or ""))
    for i, m in enumerate(marks):
        name = m.group(1)
        if name not in out:
            continue
        body = stdout[m.end(): marks[i + 1].start() if i + 1 < len(marks) else len(stdout)].strip()
        if name in ("bug-rc", "bug-size"):
            out[name] = body.encode()
            continue
        try:
            out[name] = base64.b64decode(body, validate=True) if body else b""
        except (binascii.Error, ValueError):
            out[name] = None
    return out


def _slug(reason: str) -> str:
    return (_SLUG.sub("-", reason).strip("-") or "on-demand")[:48]


def bundle_dir(state_dir: Path, tray: str, reason: str, now: float) -> Path:
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
    base = Path(state_dir) / EVIDENCE_DIR / tray / f"{stamp}-{_slug(reason)}"
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return path


def _write(bundle: Bundle, name: str, data: bytes, cap: int, note: str | None = None,
           capped: bool | None = None) -> None:
    from mctl.state.files import atomic_write

    data = data[:cap] if len(data) > cap else data
    atomic_write(bundle.path / name, data, mode=0o600)
    over = capped if capped is not None else len(data) >= cap
    bundle.items.append(Item(name, "capped" if over else "ok", len(data), hashlib.sha256(data).hexdigest(),
                             note or (f"capped at {cap} bytes (the tail kept)" if over else None)))


def _tray_files(bundle: Bundle, result, nonce: str, cap: Mapping[str, int]) -> None:
    if not result.status.reached and not result.stdout:
        bundle.reached = False
        bundle.problems.append(f"nothing from the tray: {result.summary()}")
        return
    if not result.status.reached:
        bundle.problems.append(f"the tray's command was cut: {result.summary()} (what it printed is kept)")
    sections = parse(result.stdout, nonce)
    rc_text = (sections["bug-rc"] or b"").decode(errors="replace").strip()
    said = (sections["bug-output"] or b"").decode(errors="replace").strip().splitlines()
    last = said[-1][:200] if said else ""
    report = sections["nvidia-bug-report.log.gz"]
    size = (sections["bug-size"] or b"").decode(errors="replace").strip()
    name = "nvidia-bug-report.log.gz"
    if rc_text == "0" and report is not None and report.startswith(b"\x1f\x8b"):
        full = int(size) if size.isdigit() else len(report)
        _write(bundle, name, report, cap[name], capped=full > len(report),
               note=f"capped at {len(report)} of {full} bytes" if full > len(report) else None)
    else:
        why = ("nvidia-bug-report.sh is not installed" if rc_text == "127" else
               "nvidia-bug-report.sh did not finish within its deadline (killed)" if rc_text == "124" else
               f"nvidia-bug-report.sh exited {rc_text}" if rc_text and rc_text != "0" else
               "nvidia-bug-report.sh wrote no gzip file" if rc_text == "0" else
               "nvidia-bug-report.sh gave no answer")
        if report:                                        # keep what it wrote: it may still help
            _write(bundle, name + ".partial", report, cap[name], note=why)
        bundle.items.append(Item(name, "failed" if rc_text != "127" else "missing",
                                 note=why + (f": {last}" if last else "")))
        bundle.problems.append(why + (f": {last}" if last else ""))
    for fname in ("kernel.log", "nvidia-imex.log", "tray.txt"):
        data = sections[fname]
        if data is None:
            bundle.items.append(Item(fname, "failed", note="not in the tray's answer"))
            bundle.problems.append(f"{fname}: not in the tray's answer")
        elif not data:
            bundle.items.append(Item(fname, "missing", note="empty or not on the tray"))
        else:
            _write(bundle, fname, data, cap[fname])


def _json_files(bundle: Bundle, state_dir: Path, facts: Any, findings: Sequence[Any] | None, cap: int) -> None:
    from mctl.health import store

    if facts is not None:
        _write(bundle, "facts.json", (json.dumps(_plain(facts), indent=1, sort_keys=True) + "\n").encode(), cap // 2)
    record = None
    try:
        state = store.load_state(state_dir)
        rec = state.records.get(bundle.tray)
        record = rec.to_dict() if rec is not None else None
    except Exception as exc:  # noqa: BLE001 - a damaged state file: the bundle says so and goes on
        bundle.problems.append(f"health state not readable: {exc}")
    try:
        recent = [e.to_dict() for e in store.read_actions(state_dir) if e.tray == bundle.tray][-RECENT_ACTIONS:]
    except Exception as exc:  # noqa: BLE001
        recent = []
        bundle.problems.append(f"action log not readable: {exc}")
    doc = {"findings": [_plain(f) for f in findings or []], "record": record, "recent_actions": recent}
    _write(bundle, "findings.json", (json.dumps(doc, indent=1, sort_keys=True, default=str) + "\n").encode(), cap // 2)


def _plain(value: Any) -> Any:
    to_dict = getattr(value, "to_dict", None)
    return to_dict() if callable(to_dict) else value


def _index(state_dir: Path, bundles: Sequence[Bundle]) -> Path:
    import os

    from mctl.state.files import ensure_dir

    folder = ensure_dir(Path(state_dir) / EVIDENCE_DIR)
    path = folder / INDEX
    lines = "".join(json.dumps(b.to_dict(state_dir), sort_keys=True) + "\n" for b in bundles)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.write(fd, lines.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    return path


def index_path(state_dir: Path) -> Path:
    return Path(state_dir) / EVIDENCE_DIR / INDEX


def plan(hosts: Sequence["Host"], state_dir: Path, *, reason: str, deadline_s: float, max_bytes: int) -> list[dict]:
    now = time.time()
    return [{"tray": h.name, "path": str(bundle_dir(state_dir, h.name, reason, now)), "reason": reason,
             "deadline_s": deadline_s, "max_bytes": max_bytes,
             "files": [*SECTIONS[2:3], *SECTIONS[4:], "facts.json", "findings.json", "bundle.json"]} for h in hosts]


def parse_size(text: str) -> int:
    """`32M`, `512K`, `1G`, `65536` -> bytes (binary units); UsageError with a hint otherwise."""
    from mctl.errors import UsageError

    m = re.fullmatch(r"\s*([0-9]+)\s*([KMG]?)(i?B)?\s*", str(text), re.I)
    if not m:
        raise UsageError(f"--max-size {text!r}: not a size", hint="e.g. --max-size 32M (K, M, G: binary units)")
    return int(m.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30}[m.group(2).upper()]


def check_reason(reason: str) -> None:
    from mctl.errors import UsageError

    if not reason.strip() or len(reason) > 200 or not reason.isprintable():
        raise UsageError(f"--reason {reason[:60]!r}: not a short line of text",
                         hint="printable text, at most 200 characters, e.g. --reason \"xid 79 on gpu0\"")


def check_limits(deadline_s: float, max_bytes: int) -> None:
    from mctl.errors import UsageError

    if not (deadline_s == deadline_s and 10.0 <= deadline_s <= 3600.0):
        raise UsageError(f"deadline {deadline_s:g}s: out of range", hint="give 10 to 3600 seconds, e.g. --timeout 120")
    if not MIN_MAX_BYTES <= max_bytes <= (4 << 30):
        raise UsageError(f"size cap {max_bytes} bytes: out of range", hint="give 64K to 4G, e.g. --max-size 32M")


def collect(site: "Site", hosts: Sequence["Host"], state_dir: Path, *, reason: str,
            deadline_s: float = DEFAULT_DEADLINE_S, max_bytes: int = DEFAULT_MAX_BYTES,
            facts: Mapping[str, Any] | None = None, findings: Mapping[str, Sequence[Any]] | None = None) -> list[Bundle]:
    """A bundle for each of *hosts*, within *deadline_s* (one SSH command per tray, all at once) and
    *max_bytes* each; appended to the index. Never raises for what a tray does or does not answer."""
    from mctl.state.files import ensure_dir, write_json
    from mctl.transport import SSHConfig, run_sync, targets_for

    check_limits(deadline_s, max_bytes)
    state_dir = Path(state_dir)
    cap = caps(max_bytes)
    nonce = secrets.token_hex(8)
    started = time.time()
    t0 = time.monotonic()
    config = SSHConfig.from_site(site)
    results = {r.host: r for r in run_sync(config, targets_for(site, list(hosts)), command(nonce, deadline_s, cap),
                                           timeout=deadline_s)}
    bundles = []
    for h in hosts:
        bundle = Bundle(h.name, bundle_dir(state_dir, h.name, reason, started), reason, started)
        ensure_dir(bundle.path)
        r = results.get(h.name)
        if r is None:
            bundle.reached = False
            bundle.problems.append("the tray was not asked")
        else:
            _tray_files(bundle, r, nonce, cap)
        _json_files(bundle, state_dir, (facts or {}).get(h.name), (findings or {}).get(h.name), cap["json"])
        bundle.seconds = time.monotonic() - t0
        write_json(bundle.path / "bundle.json", bundle.to_dict(state_dir), mode=0o600)
        bundles.append(bundle)
    _index(state_dir, bundles)
    return bundles


def log_entries(bundles: Sequence[Bundle], state_dir: Path, *, who: str, why: str | None = None) -> list:
    """Action-log lines naming each bundle (the on-demand command's; a rung's line carries its own)."""
    from mctl.health import store

    out = []
    for b in bundles:
        d = b.to_dict(state_dir)
        out.append(store.action_entry("evidence", b.tray, None, who=who, why=why or b.reason,
                                      result="ok" if not b.problems else f"noted: {'; '.join(b.problems)[:300]}",
                                      evidence=d["path"], bytes=d["bytes"]))
    return out


def read_index(state_dir: Path, tray: str | None = None) -> list[dict]:
    path = index_path(state_dir)
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and (tray is None or entry.get("tray") == tray):
            out.append(entry)
    return out
