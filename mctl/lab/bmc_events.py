"""The lab BMC's Redfish EventService: subscriptions kept by the BMC, and an Event POSTed when a leak fault is set.

sushy-tools serves no EventService; this adds the part of DMTF's contract mctl uses (mctl/bmc/eventservice.py),
shaped as a GB200 BMC (OpenBMC's bmcweb) answers it:

- `GET /redfish/v1/EventService` (EventService v1_10_0: ServiceEnabled, DeliveryRetryAttempts 3,
  DeliveryRetryIntervalSeconds, EventFormatTypes, the Subscriptions link); `--no-events` (`mctl lab fault
  bmc TRAY --no-events`) makes it ServiceEnabled false, refuses new subscriptions (HTTP 503 is what bmcweb
  answers a POST then; here 400 with a Base message) and sends nothing.
- `POST /redfish/v1/EventService/Subscriptions` with an EventDestination (`Destination` an http(s) URI,
  `Protocol` "Redfish", optional `Context`): 201, `Location` of the new member, at most MAX_SUBSCRIPTIONS
  (bmcweb's limit is 20); `GET` and `DELETE` of a member; the collection lists them. Subscriptions are
  the BMC process's memory: lost when it restarts, as a real BMC can lose them at a reboot.
- When a tray's leak fault changes (the faults file, looked at every POLL_S), every subscription of its
  BMC gets one Event (Event v1_7_0: `Context` of the subscription, `Events` with one record: EventType
  Alert, MessageId `...LeakDetected` (Warning/Critical) or `...LeakDetectorOK` (cleared), Severity,
  Message, `OriginOfCondition` the detector), POSTed with a 2 s timeout, retried DeliveryRetryAttempts
  times DeliveryRetryIntervalSeconds apart, as the BMC's delivery queue does. An http destination is
  sent in the clear (lab loopback only); an https one is verified against the lab CA.
"""

from __future__ import annotations

import json
import logging
import ssl
import threading
import time
import urllib.parse
import urllib.request
from typing import Any, Callable

ROOT = "/redfish/v1"
SERVICE = f"{ROOT}/EventService"
SUBSCRIPTIONS = f"{SERVICE}/Subscriptions"
MAX_SUBSCRIPTIONS = 20
POLL_S = 0.2
RETRY_ATTEMPTS = 3
RETRY_INTERVAL_S = 1
MESSAGE_PREFIX = "ResourceEvent.1.3"
LOG = logging.getLogger("mctl-lab-bmc")


class Subscriptions:
    """One BMC's subscriptions (id -> EventDestination document), made, listed and deleted over Redfish."""

    def __init__(self):
        self._lock = threading.Lock()
        self._subs: dict[str, dict[str, Any]] = {}
        self._next = 1
        self.last_leak: tuple | None = None          # the leak fault last told (None: not looked at yet)
        self.sent = 0                                 # events delivered (tests)

    def create(self, body: Any) -> tuple[int, dict[str, Any], str | None]:
        """(status, document, Location) for a POST of *body*."""
        if not isinstance(body, dict):
            return 400, _error("Base.1.15.MalformedJSON", "The request body is not a JSON object."), None
        dest = body.get("Destination")
        parts = urllib.parse.urlsplit(dest) if isinstance(dest, str) else None
        if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
            return 400, _error("Base.1.15.PropertyValueFormatError", "Destination is not an http(s) URI."), None
        if body.get("Protocol", "Redfish") != "Redfish":
            return 400, _error("Base.1.15.PropertyValueNotInList", "Protocol must be Redfish."), None
        context = body.get("Context", "")
        if not isinstance(context, str) or len(context) > 256:
            return 400, _error("Base.1.15.PropertyValueFormatError", "Context is not a string of 256 or fewer."), None
        with self._lock:
            if len(self._subs) >= MAX_SUBSCRIPTIONS:
                return 400, _error("Base.1.15.CreateLimitReachedForResource", "Too many subscriptions."), None
            ident = str(self._next)
            self._next += 1
            path = f"{SUBSCRIPTIONS}/{ident}"
            doc = {"@odata.id": path, "@odata.type": "#EventDestination.v1_14_0.EventDestination", "Id": ident,
                   "Name": "Event Destination", "Destination": dest, "Protocol": "Redfish", "Context": context,
                   "EventFormatType": "Event", "SubscriptionType": "RedfishEvent", "DeliveryRetryPolicy":
                   "TerminateAfterRetries"}
            self._subs[ident] = doc
        return 201, doc, path

    def get(self, ident: str) -> dict[str, Any] | None:
        with self._lock:
            doc = self._subs.get(ident)
            return dict(doc) if doc else None

    def delete(self, ident: str) -> bool:
        with self._lock:
            return self._subs.pop(ident, None) is not None

    def collection(self) -> dict[str, Any]:
        with self._lock:
            members = [{"@odata.id": d["@odata.id"]} for d in self._subs.values()]
        return {"@odata.id": SUBSCRIPTIONS, "@odata.type": "#EventDestinationCollection.EventDestinationCollection",
                "Name": "Event Subscriptions Collection", "Members": members, "Members@odata.count": len(members)}

    def destinations(self) -> list[dict[str, Any]]:
        with self._lock:
            return [dict(d) for d in self._subs.values()]


def service_doc(enabled: bool) -> dict[str, Any]:
    return {"@odata.id": SERVICE, "@odata.type": "#EventService.v1_10_0.EventService", "Id": "EventService",
            "Name": "Event Service", "ServiceEnabled": enabled,
            "Status": {"State": "Enabled" if enabled else "Disabled", "Health": "OK"},
            "DeliveryRetryAttempts": RETRY_ATTEMPTS, "DeliveryRetryIntervalSeconds": RETRY_INTERVAL_S,
            "EventFormatTypes": ["Event"], "RegistryPrefixes": ["Base", "ResourceEvent"],
            "Subscriptions": {"@odata.id": SUBSCRIPTIONS}}


def _error(message_id: str, message: str) -> dict[str, Any]:
    return {"error": {"code": message_id, "message": message,
                      "@Message.ExtendedInfo": [{"MessageId": message_id, "Message": message}]}}


def leak_event(context: str, leak: str | None, detector_path: str, number: int) -> dict[str, Any]:
    """The Event a subscription is sent when the tray's leak state became *leak* (None: cleared)."""
    word = leak.capitalize() if leak else "OK"
    record = {"EventType": "Alert", "EventId": str(number),
              "EventTimestamp": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()),
              "MessageId": f"{MESSAGE_PREFIX}.{'LeakDetected' if leak else 'LeakDetectorOK'}",
              "MessageSeverity": word, "Severity": word, "MessageArgs": [detector_path.rsplit("/", 1)[-1], word],
              "Message": f"The leak detector {detector_path.rsplit('/', 1)[-1]} reads {word}.",
              "OriginOfCondition": {"@odata.id": detector_path}}
    return {"@odata.type": "#Event.v1_7_0.Event", "Id": str(number), "Name": "Event Log", "Context": context,
            "Events": [record]}


def post(dest: str, body: dict[str, Any], ca_file: str | None) -> int:
    data = json.dumps(body).encode()
    req = urllib.request.Request(dest, data=data, method="POST", headers={"Content-Type": "application/json"})
    ctx = None
    if dest.startswith("https:"):
        ctx = ssl.create_default_context(cafile=ca_file) if ca_file else ssl.create_default_context()
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=ctx))
    with opener.open(req, timeout=2.0) as resp:
        return resp.status


def deliver(subs: Subscriptions, body_for: Callable[[str], dict[str, Any]], ca_file: str | None,
            sleep: Callable[[float], None] = time.sleep) -> None:
    """Send one event to every subscription, each retried as DeliveryRetryAttempts says (a thread each)."""
    def one(dest: str, body: dict[str, Any]) -> None:
        for attempt in range(RETRY_ATTEMPTS + 1):
            try:
                status = post(dest, body, ca_file)
                if 200 <= status < 300:
                    subs.sent += 1
                    return
            except Exception as exc:  # noqa: BLE001 - a destination that does not take it: retried, then dropped
                LOG.info("event to %s failed (attempt %d): %s", dest, attempt + 1, exc)
            sleep(RETRY_INTERVAL_S)

    for d in subs.destinations():
        threading.Thread(target=one, args=(d["Destination"], body_for(d.get("Context", ""))), daemon=True,
                         name="bmc-event").start()


def watch_leaks(units: dict[str, Any], detector_path: Callable[[Any, str | None], str],
                ca_file: str | None) -> threading.Thread:
    """A thread that looks at every BMC's faults every POLL_S and sends its subscribers an Event when its leak
    fault changes (set, changed level or detector, cleared)."""
    count = [0]

    def loop() -> None:
        while True:
            for u in units.values():
                faults = u.fault.get()
                leak = faults.get("leak") if not faults.get("no_events") else None
                now = (leak, faults.get("detector")) if leak else None
                subs = u.events
                if subs.last_leak is None:
                    subs.last_leak = ("start", now)
                    continue
                if subs.last_leak[1] == now:
                    continue
                before = subs.last_leak[1]
                subs.last_leak = ("seen", now)
                if faults.get("no_events"):
                    continue
                count[0] += 1
                number = count[0]
                path = detector_path(u, (now or before or (None, None))[1])
                deliver(subs, lambda ctx, leak=leak, path=path, n=number: leak_event(ctx, leak, path, n), ca_file)
            time.sleep(POLL_S)

    t = threading.Thread(target=loop, name="bmc-event-watch", daemon=True)
    t.start()
    return t
