"""Redfish EventService: a subscription made on a BMC, and the events it pushes read safely (DSP0266 "Eventing").

The contract, as DMTF's schemas define it and the real GB200 service root shows it (its root links
`/redfish/v1/EventService`; tests/fixtures/real/redfish/nvidia_gb200):

- `GET /redfish/v1/EventService` (EventService v1.x): `ServiceEnabled` (false or absent with a
  `Status.State` other than Enabled: not offered) and the `Subscriptions` collection link.
- `POST <Subscriptions>` with an EventDestination: `Destination` (the receiver's URI), `Protocol`
  "Redfish", `Context` (a client string the BMC sends back in every event of this subscription).
  The BMC answers 201 with `Location`, the new EventDestination; `DELETE` of it ends the subscription.
  A subscription may not outlive a BMC reboot or a factory reset: mctl checks it is still there.
- The BMC then POSTs an Event (Event v1.x) to the Destination: `Context`, and `Events`, a list of
  EventRecords, each with `MessageId` (e.g. a leak: `...LeakDetected...`), `EventType` (deprecated
  since Redfish 1.6, still sent: "Alert"), `Severity`/`MessageSeverity`, `Message`, and
  `OriginOfCondition` (`{"@odata.id": "/redfish/v1/Chassis/Chassis_0/ThermalSubsystem/LeakDetection/..."}`).

Nothing here trusts an event: `parse_event` reads a body of at most MAX_BODY bytes, a JSON object
whose Context is a string and whose Events are at most MAX_EVENTS records with bounded strings and
origins that are paths on a BMC (mctl.bmc.client.check_path); anything else is refused with the
reason. Who sent it is decided by the receiver from the Context token alone (mctl.health.bmc_events):
an event is only ever a reason to read that BMC now, never a reading.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from mctl.bmc.client import BMCError, check_path, link

EVENT_SERVICE = "/redfish/v1/EventService"
MAX_BODY = 64 * 1024            # bytes of one event POST
MAX_EVENTS = 64                 # records in one event POST
MAX_TEXT = 1024                 # characters of one string field
LEAK_WORDS = ("leak",)          # a record about a leak: its MessageId or its origin says so (case folded)


@dataclass(frozen=True)
class Subscription:
    path: str                   # the EventDestination mctl made (its Location)
    context: str                # the token every event of it carries


def subscriptions_link(service: Any) -> str | None:
    """The Subscriptions collection of an EventService document, or None when the BMC does not offer events."""
    if not isinstance(service, dict):
        return None
    if service.get("ServiceEnabled") is False:
        return None
    status = service.get("Status")
    if isinstance(status, dict) and status.get("State") not in (None, "Enabled"):
        return None
    try:
        return link(service.get("Subscriptions"), "EventService Subscriptions")
    except BMCError:
        return None


def subscribe(client, destination: str, context: str) -> Subscription | None:
    """Subscribe *destination* on the BMC of *client* (one POST, never re-sent). None: the BMC offers no
    EventService (404, disabled, no Subscriptions link); BMCError when it offers one and refused."""
    try:
        service = client.get(EVENT_SERVICE)
    except BMCError as exc:
        if exc.status in (404, 405, 501):
            return None
        raise
    collection = subscriptions_link(service)
    if collection is None:
        return None
    path = client.create(collection, {"Destination": destination, "Protocol": "Redfish", "Context": context})
    return Subscription(path, context)


def still_there(client, sub: Subscription) -> bool:
    """The subscription is still on the BMC (False: 404, it was lost: a BMC reboot); BMCError otherwise."""
    try:
        doc = client.get(sub.path)
    except BMCError as exc:
        if exc.status == 404:
            return False
        raise
    return doc.get("Context") in (None, sub.context)


@dataclass(frozen=True)
class EventRecord:
    message_id: str
    event_type: str | None
    severity: str | None
    origin: str | None
    message: str

    @property
    def leak(self) -> bool:
        text = f"{self.message_id} {self.origin or ''}".lower()
        return any(w in text for w in LEAK_WORDS)


def _text(value: Any, what: str, *, required: bool = False) -> str | None:
    if value is None and not required:
        return None
    if not isinstance(value, str):
        raise ValueError(f"{what} is not a string")
    if len(value) > MAX_TEXT:
        raise ValueError(f"{what} is longer than {MAX_TEXT} characters")
    return value


def parse_event(body: bytes) -> tuple[str, tuple[EventRecord, ...]]:
    """(Context, records) of one event POST; ValueError with the reason for anything else."""
    if len(body) > MAX_BODY:
        raise ValueError(f"the body is larger than {MAX_BODY} bytes")
    try:
        doc = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise ValueError("the body is not JSON") from None
    if not isinstance(doc, dict):
        raise ValueError("the body is not a JSON object")
    context = _text(doc.get("Context"), "Context", required=True)
    events = doc.get("Events")
    if not isinstance(events, list) or not events:
        raise ValueError("no Events list")
    if len(events) > MAX_EVENTS:
        raise ValueError(f"more than {MAX_EVENTS} events in one POST")
    out = []
    for i, e in enumerate(events):
        if not isinstance(e, dict):
            raise ValueError(f"event {i} is not an object")
        origin = e.get("OriginOfCondition")
        path = None
        if origin is not None:
            try:
                path = link(origin, f"event {i} OriginOfCondition")
            except BMCError as exc:
                raise ValueError(exc.message) from None
        out.append(EventRecord(
            message_id=_text(e.get("MessageId"), f"event {i} MessageId", required=True) or "",
            event_type=_text(e.get("EventType"), f"event {i} EventType"),
            severity=_text(e.get("MessageSeverity", e.get("Severity")), f"event {i} Severity"),
            origin=path, message=_text(e.get("Message"), f"event {i} Message") or ""))
    return str(context), tuple(out)


__all__ = ["EVENT_SERVICE", "Subscription", "EventRecord", "subscribe", "still_there", "parse_event",
           "subscriptions_link", "check_path"]
