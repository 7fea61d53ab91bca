"""What the watch knows of one tray: this sweep's verdict, and its record between sweeps (pure).

    TrayVerdict    one sweep's result for one tray: reached or not, the worst finding, the findings

    TrayRecord     streaks, the drain mctl owns (reason, Slurm stamp), a pending action, the last note
      .latches     check -> Latch          findings that flap, held by mctl.health.hysteresis
      .leak        LeakEpisode             an open leak episode (mctl.health.leaks)
      .ladder      LadderState             the recovery ladder's progress (mctl.health.ladder)
      .isolation   IsolationState          the watch isolating the tray from its partition (mctl.health.isolate)
      .resumed     LastResume              mctl's last resume of the tray (the `adopt` rule of mctl.health.policy)

Each section is a frozen dataclass with `to_dict`/`from_dict` in the JSON shape state.json has
always had (older files read back the same); `from_dict` raises ValueError naming the field of a
section it cannot read, which the store turns into a damaged-state error. Standard library only:
the node check carries it to the trays (mctl.health.bundle).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any, Mapping

from mctl.model.drain import PendingAction
from mctl.model.findings import Finding, Severity


def _num(data: Mapping[str, Any], key: str, default: float | None = None) -> float | None:
    value = data.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{key} must be a number, not {type(value).__name__}")
    return float(value)


def _int(data: Mapping[str, Any], key: str, default: int = 0) -> int:
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{key} must be an integer, not {type(value).__name__}")
    return value


def _text(data: Mapping[str, Any], key: str) -> str | None:
    value = data.get(key)
    if value is not None and not isinstance(value, str):
        raise ValueError(f"{key} must be text, not {type(value).__name__}")
    return value


def _mapping(data: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(data, Mapping):
        raise ValueError(f"{what} must be an object, not {type(data).__name__}")
    return data


def _finding(data: Any, what: str) -> Finding:
    try:
        return Finding.from_dict(_mapping(data, what))
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{what} cannot be read ({exc})") from None


# ------------------------------------------------------------------ hysteresis

@dataclass(frozen=True)
class Latch:
    """A critical finding held while it flaps: seen critical `seen` sweeps, clear `absent` sweeps in a row
    since, came back `flaps` times."""

    finding: Finding
    seen: int = 1
    absent: int = 0
    flaps: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"finding": self.finding.to_dict(), "seen": self.seen, "absent": self.absent, "flaps": self.flaps}

    @classmethod
    def from_dict(cls, data: Any) -> "Latch":
        d = _mapping(data, "latch")
        return cls(_finding(d.get("finding"), "latch.finding"), _int(d, "seen", 1), _int(d, "absent"),
                   _int(d, "flaps"))


# ------------------------------------------------------------------ leaks

@dataclass(frozen=True)
class PowerOffNote:
    """The leak's power-off as sent (or tried): when, what the BMC answered, the power state then."""

    at: float | None
    result: str | None
    power_state: str | None

    def to_dict(self) -> dict[str, Any]:
        return {"at": self.at, "result": self.result, "power_state": self.power_state}

    @classmethod
    def from_dict(cls, data: Any) -> "PowerOffNote | None":
        if not data:
            return None
        d = _mapping(data, "leak.power_off")
        return cls(_num(d, "at"), _text(d, "result"), _text(d, "power_state"))


@dataclass(frozen=True)
class LeakEpisode:
    """An open leak: since when, how often it came back, the finding held, and its one power-off."""

    since: float
    finding: Finding
    last_critical: float | None = None
    clear: int = 0                      # BMC readings in a row without Critical
    flaps: int = 0                      # times it came back after a clear reading
    sent: bool = False                  # the power-off was sent (never twice an episode)
    power_off: PowerOffNote | None = None
    blocked: str | None = None          # why it is not powered off (said once per change)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"since": self.since, "last_critical": self.last_critical, "clear": self.clear,
                               "flaps": self.flaps, "finding": self.finding.to_dict(), "sent": self.sent,
                               "power_off": self.power_off.to_dict() if self.power_off else None}
        if self.blocked is not None:
            out["blocked"] = self.blocked
        return out

    @classmethod
    def from_dict(cls, data: Any) -> "LeakEpisode":
        d = _mapping(data, "leak")
        sent = d.get("sent", False)
        if not isinstance(sent, bool):
            raise ValueError(f"sent must be true or false, not {type(sent).__name__}")
        since = _num(d, "since")
        if since is None:
            raise ValueError("since is missing")
        return cls(since, _finding(d.get("finding"), "leak.finding"), _num(d, "last_critical"), _int(d, "clear"),
                   _int(d, "flaps"), sent, PowerOffNote.from_dict(d.get("power_off")), _text(d, "blocked"))


# ------------------------------------------------------------------ the recovery ladder

LADDER_PHASES = ("gpu-reset", "reboot", "power-cycle", "verify", "burn-in", "passed", "repair")


@dataclass(frozen=True)
class LadderState:
    """One tray's recovery (mctl.health.ladder), as persisted in its record."""

    phase: str | None = None              # None: no recovery runs; else one of LADDER_PHASES
    since: float | None = None            # when the phase began
    deadline: float | None = None         # when the phase has failed
    boot: str | None = None               # the tray's boot id when the rung was sent (None: unknown)
    last_boot: str | None = None          # the boot id the last reached sweep read
    started: float | None = None          # when this recovery began (its drain)
    rung: str | None = None               # the rung last sent in this recovery
    tried: tuple[str, ...] = ()           # rungs sent in this recovery, in order
    sent: bool | None = None              # the rung's send: True done, False failed, None not known (a killed run)
    bad: int = 0                          # critical sweeps since the phase began
    times: dict[str, float] = field(default_factory=dict)   # phase -> seconds it took, this recovery
    failures: tuple[float, ...] = ()      # when recoveries failed, within the failure window
    repair_at: float | None = None
    repair_why: str | None = None
    note: str | None = None               # the last waiting message (logged once per change)
    retry_at: float | None = None         # after a failed recovery: the next one starts no earlier

    @property
    def active(self) -> bool:
        return self.phase is not None

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["tried"] = list(self.tried)
        out["failures"] = list(self.failures)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> "LadderState":
        if not data:
            return cls()
        if not isinstance(data, Mapping):
            raise ValueError(f"ladder must be an object, not {type(data).__name__}")
        known = set(cls.__dataclass_fields__)
        kw = {k: v for k, v in data.items() if k in known}
        if kw.get("phase") not in (None, *LADDER_PHASES):
            raise ValueError(f"ladder.phase {kw.get('phase')!r} is none of {', '.join(LADDER_PHASES)}")
        kw["tried"] = tuple(str(r) for r in kw.get("tried") or ())
        kw["failures"] = tuple(float(t) for t in kw.get("failures") or ())
        kw["times"] = {str(k): float(v) for k, v in (kw.get("times") or {}).items()}
        return cls(**kw)


# ------------------------------------------------------------------ isolation

@dataclass(frozen=True)
class IsolationState:
    """The watch isolating the tray from its NVLink partition: sending, done, failed or waiting."""

    state: str | None = None
    at: float | None = None               # when the isolation was decided
    why: str | None = None
    to: str | None = None                 # quarantine | default
    note: str | None = None               # the last waiting message (logged once per change)
    done_at: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_dict(cls, data: Any) -> "IsolationState":
        d = _mapping(data, "isolation")
        return cls(_text(d, "state"), _num(d, "at"), _text(d, "why"), _text(d, "to"), _text(d, "note"),
                   _num(d, "done_at"))


# ------------------------------------------------------------------ the last resume

@dataclass(frozen=True)
class LastResume:
    """The drain mctl lifted last: its reason and full text, Slurm's stamp on it (who@time), when."""

    reason: str | None
    full: str | None = None
    stamp: str | None = None
    at: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"reason": self.reason, "full": self.full, "stamp": self.stamp, "at": self.at}

    @classmethod
    def from_dict(cls, data: Any) -> "LastResume":
        d = _mapping(data, "resumed")
        return cls(_text(d, "reason"), _text(d, "full"), _text(d, "stamp"), _num(d, "at"))


# ------------------------------------------------------------------ the verdict and the record

@dataclass(frozen=True)
class TrayVerdict:
    """One sweep's result for one tray."""

    host: str
    rack: str | None
    reach: str                             # ok, unreachable, timeout, host-key-mismatch
    worst: Severity
    findings: tuple[Finding, ...] = ()

    @property
    def reached(self) -> bool:
        return self.reach == "ok"

    @property
    def status(self) -> str:
        return self.worst.value if self.reached else "unreachable"



@dataclass(frozen=True)
class TrayRecord:
    host: str
    rack: str | None = None
    status: str = "unknown"
    misses: int = 0
    bad_streak: int = 0
    healthy_streak: int = 0
    drained: bool = False                  # mctl owns a drain on this tray
    reason: str | None = None              # the exact reason mctl set
    full_reason: str | None = None
    drained_at: float | None = None
    pending: PendingAction | None = None   # a drain or resume waiting for the scheduler to answer
    note: str | None = None                # the last skip/queue message (logged once per change)
    xid_ack: float | None = None           # XIDs before this time were dealt with (a resume by hand)
    latches: dict[str, Latch] | None = None
    leak: LeakEpisode | None = None
    ladder: LadderState | None = None
    isolation: IsolationState | None = None
    drain_stamp: str | None = None         # the scheduler's stamp on mctl's drain, as last seen (Slurm: who@time)
    resumed: LastResume | None = None

    def released(self, **changes: Any) -> "TrayRecord":
        """The record once mctl no longer owns a drain on the tray (resumed, lifted or taken over, failed)."""
        return replace(self, drained=False, reason=None, full_reason=None, drained_at=None, drain_stamp=None,
                       **changes)

    def resumed_by_mctl(self, at: float | None, **changes: Any) -> "TrayRecord":
        """The record once mctl's own resume took effect: released, remembering which drain it lifted."""
        last = LastResume(self.reason, self.full_reason, self.drain_stamp, at) if self.reason else None
        return self.released(resumed=last, **changes)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            if name == "latches":
                value = {k: v.to_dict() for k, v in value.items()} if value else None
            elif name in ("pending", "leak", "ladder", "isolation", "resumed"):
                value = value.to_dict() if value is not None else None
            out[name] = value
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "TrayRecord":
        """From state.json; ValueError names a section that cannot be read (a damaged file)."""
        known = set(cls.__dataclass_fields__)
        fields = {k: v for k, v in data.items() if k in known}
        if isinstance(fields.get("pending"), Mapping):
            fields["pending"] = PendingAction.from_dict(fields["pending"])
        sections = (("leak", LeakEpisode.from_dict), ("ladder", LadderState.from_dict),
                    ("isolation", IsolationState.from_dict), ("resumed", LastResume.from_dict))
        for name, read in sections:
            value = fields.get(name)
            if not value:
                fields[name] = None
                continue
            try:
                fields[name] = read(value)
            except ValueError as exc:
                raise ValueError(f"{name}: {exc}") from None
        latches = fields.get("latches")
        if latches:
            try:
                fields["latches"] = {str(k): Latch.from_dict(v) for k, v in _mapping(latches, "latches").items()}
            except ValueError as exc:
                raise ValueError(f"latches: {exc}") from None
        else:
            fields["latches"] = None
        return cls(**fields)


# ------------------------------------------------------------------ a rack's leaks (the rack-wide response)

@dataclass(frozen=True)
class RackLeak:
    """A rack whose leaks passed the rack-wide threshold (health.leak.rack_share) or whose switch tray
    leaks (health.leak.switch_tray: rack): since when, and its one power-off of the whole rack."""

    since: float
    why: str
    sent: bool = False
    result: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"since": self.since, "why": self.why, "sent": self.sent, "result": self.result}

    @classmethod
    def from_dict(cls, data: Any) -> "RackLeak":
        d = _mapping(data, "rack leak")
        since = _num(d, "since")
        if since is None:
            raise ValueError("since is missing")
        sent = d.get("sent", False)
        if not isinstance(sent, bool):
            raise ValueError(f"sent must be true or false, not {type(sent).__name__}")
        return cls(since, _text(d, "why") or "", sent, _text(d, "result"))


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


@dataclass(frozen=True)
class RackWatch:
    """What the watch remembers of one rack between sweeps."""

    failing: dict[str, float] = field(default_factory=dict)     # compute tray -> when its failure began
    switch: dict[str, tuple[float, int]] = field(default_factory=dict)   # switch tray -> (since, critical sweeps)
    lifted_at: float | None = None                               # the last lift of its hold

    def to_dict(self) -> dict[str, Any]:
        return {"failing": dict(sorted(self.failing.items())),
                "switch": {k: [a, n] for k, (a, n) in sorted(self.switch.items())}, "lifted_at": self.lifted_at}

    @classmethod
    def from_dict(cls, data: Any) -> "RackWatch":
        if not isinstance(data, Mapping):
            raise ValueError("rack watch must be an object")
        failing = data.get("failing") or {}
        switch = data.get("switch") or {}
        lifted = data.get("lifted_at")
        if not isinstance(failing, Mapping) or not all(_number(v) for v in failing.values()):
            raise ValueError("failing must map trays to times")
        if not isinstance(switch, Mapping) or not all(
                isinstance(v, list) and len(v) == 2 and _number(v[0]) and isinstance(v[1], int)
                for v in switch.values()):
            raise ValueError("switch must map switch trays to [since, sweeps]")
        if lifted is not None and not _number(lifted):
            raise ValueError("lifted_at must be a time")
        return cls({str(k): float(v) for k, v in failing.items()},
                   {str(k): (float(v[0]), int(v[1])) for k, v in switch.items()}, lifted)


@dataclass(frozen=True)
class RackHold:
    """A rack held by escalation: why, since when, and what the hold did to each tray."""

    rack: str
    kind: str
    cause: str
    reason: str
    failed: tuple[str, ...]
    since: float
    result: str = "pending"           # pending | ok | partial: ... | failed: ...
    held: tuple[str, ...] = ()        # the trays the hold's reason is on
    left: dict[str, str] = field(default_factory=dict)    # trays it did not hold -> why (someone else's, down)

    def to_dict(self) -> dict[str, Any]:
        return {"rack": self.rack, "kind": self.kind, "cause": self.cause, "reason": self.reason,
                "failed": list(self.failed), "since": self.since, "result": self.result, "held": list(self.held),
                "left": dict(self.left)}

    @classmethod
    def from_dict(cls, data: Any) -> "RackHold":
        if not isinstance(data, Mapping):
            raise ValueError("rack hold must be an object")
        for key in ("rack", "kind", "cause", "reason", "result"):
            if not isinstance(data.get(key), str):
                raise ValueError(f"{key} must be text")
        if not _number(data.get("since")):
            raise ValueError("since must be a time")
        for key in ("failed", "held"):
            if not isinstance(data.get(key, []), list):
                raise ValueError(f"{key} must be a list")
        left = data.get("left") or {}
        if not isinstance(left, Mapping):
            raise ValueError("left must be an object")
        return cls(data["rack"], data["kind"], data["cause"], data["reason"], tuple(data.get("failed") or ()),
                   float(data["since"]), data["result"], tuple(data.get("held") or ()),
                   {str(k): str(v) for k, v in left.items()})
