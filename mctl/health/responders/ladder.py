"""The ladder responder: the recovery ladder's rungs, repair marks and burn-ins, through the actuator.

One sweep of the watch, under the state lock, after the drains, resumes and power-offs:

1. observe every tray (its verdict, facts, the scheduler's node) and let `ladder.decide` (pure) step
   each one's recovery through the circuit breaker; the records say which rung is being sent;
2. hand the actuator one act per rung (and per repair hook to run): the intents are written and the
   state saved with the rungs marked before anything is sent, so a watch killed in between never sends
   a rung again (the rung is then judged by its deadline); the rungs go out at once, each bounded: a
   GPU reset and a reboot over the kept SSH connection, a power cycle as one Redfish POST to the
   tray's BMC (under the rack lock, like `mctl power`); each result is folded back (`ladder.settle`);
3. the repair hook of a tray just marked for repair runs (a deadline, no shell).

Burn-in runs in a thread of its own (it takes minutes): the sweep starts it and later sweeps read
its result. A watch restarted during a burn-in runs it again.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import subprocess
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from mctl.health import ladder, store
from mctl.health.actuator import Act, Done
from mctl.health.responders import Context, Responder
from mctl.model.drain import Decision
from mctl.model.findings import Finding, Severity

if TYPE_CHECKING:
    from mctl.health.sweep import SweepResult
    from mctl.model.settings import HealthSettings
    from mctl.model.site import Site

REBOOT_SEND_S = 15.0          # `systemctl reboot` returns at once; the connection may drop with the tray
POWER_SEND_S = 30.0           # one Redfish session and POST


class LadderResponder(Responder):
    name = "ladder"

    def __init__(self, site: "Site", settings: "HealthSettings"):
        self.site = site
        self.settings = settings
        self.ls = settings.ladder
        self._burn: dict[str, Future] = {}
        self._pool: ThreadPoolExecutor | None = None

    # ------------------------------------------------------------------ observe + decide

    def _has_bmc(self, host: str) -> bool:
        h = self.site.host(host)
        return bool(h is not None and h.bmc and getattr(self.site, "bmc", None) is not None)

    def _observations(self, result: "SweepResult", records) -> list[ladder.Observation]:
        out = []
        for v in result.verdicts:
            rec = records.get(v.host)
            if rec is None:
                continue
            node = (result.nodes or {}).get(v.host) if result.nodes is not None else None
            out.append(ladder.observe(rec, v, result.facts.get(v.host), node, self.settings,
                                      has_bmc=self._has_bmc(v.host)))
        return out

    def _decide(self, ctx: Context, state: store.HealthState, now: float):
        # a tray of a rack held by rack escalation gets no rung: the rack's hold, lifted by a person, is its answer
        obs = self._observations(ctx.result, {h: r for h, r in state.records.items()
                                              if r.rack not in state.escalations})
        return ladder.decide(state.records, obs, self.settings, state.breaker, ctx.sizes, now=now,
                             burn_ins=self._burn_status(state.records))

    def dry_run(self, ctx: Context, state: store.HealthState) -> list[Decision]:
        """`--dry-run`: each rung the ladder would take, as decisions (nothing is sent or written)."""
        out = self._decide(ctx, state, time.time())
        state.records, state.breaker = out.records, out.breaker
        decisions = [Decision(r.host, r.rung, r.why, rack=r.rack, at=r.at) for r in out.rungs]
        decisions += [Decision(e.host, e.action, e.why, rack=e.rack, at=e.at) for e in out.events
                      if e.action in ("repair", "recovery-failed")]
        return decisions

    # ------------------------------------------------------------------ one sweep

    async def respond(self, ctx: Context, state: store.HealthState) -> list[store.ActionEntry]:
        if ctx.result.nodes is None:
            return []                       # the scheduler did not answer: idle or not is unknown; next sweep
        now = time.time()
        before = {h: r.ladder for h, r in state.records.items()}
        out = self._decide(ctx, state, now)
        events = [self._event_entry(e, ctx) for e in out.events]
        # the records now say which rung is being sent: saved with the intents, before anything is sent
        state.records, state.breaker = out.records, out.breaker
        acts = [self._rung_act(ctx, state, r, before.get(r.host)) for r in out.rungs]
        acts += [a for host in out.repairs for a in self._hook_acts(ctx, state, host)]
        lines = await ctx.actuator.run(state, acts, before=events)
        self._start_burn_ins(state.records)
        return lines

    def _rung_act(self, ctx: Context, state: store.HealthState, r: ladder.Rung, before) -> Act:
        async def run(go) -> Done:
            evidence = await asyncio.to_thread(self._evidence, ctx, r) if self.ls.evidence else None
            outcome, text = await self._send(ctx, r)
            if outcome == "not-taken":
                result = f"refused: {text}"
            else:
                result = "ok" if outcome == "ok" else (f"failed: {text}" if outcome == "failed"
                                                       else f"sent, answer lost: {text}")
            return Done(result, raw=outcome, fields={"detail": text or None, "evidence": evidence})

        def settle(done: Done) -> list:
            if done.raw == "not-taken":
                ladder.not_taken(state.records, r, before, done.fields["detail"] or "")
            else:
                ladder.settle(state.records, r, {"ok": True, "failed": False, "unknown": None}[done.raw])
            return []

        return Act(Decision(r.host, r.rung, r.why, rack=r.rack, at=r.at), run=run,
                   fields={"gpus": list(r.gpus) or None}, settle=settle)

    def _evidence(self, ctx: Context, r: ladder.Rung) -> str:
        """The tray's evidence bundle before the rung wipes what it shows (mctl/health/evidence.py): its path
        in the state directory, for the rung's action-log line; what went wrong, when nothing was kept."""
        from mctl.health import evidence

        host = self.site.host(r.host)
        if host is None:
            return f"not taken: {r.host} is not in the inventory"
        verdict = next((v for v in ctx.result.verdicts if v.host == r.host), None)
        try:
            (bundle,) = evidence.collect(self.site, [host], ctx.state_dir, reason=f"before {r.rung}",
                                         deadline_s=self.ls.evidence_deadline_s,
                                         facts={r.host: ctx.result.facts.get(r.host)},
                                         findings={r.host: verdict.findings if verdict else ()})
        except Exception as exc:  # noqa: BLE001 - evidence never holds up the rung
            return f"not taken: {type(exc).__name__}: {exc}"[:300]
        return bundle.to_dict(ctx.state_dir)["path"]

    def _hook_acts(self, ctx: Context, state: store.HealthState, host: str) -> list[Act]:
        """One repair-hook act per exec sink of `repair` events (`health.ladder.repair_hook` is one of them,
        mctl.model.settings.HealthSettings.repair_sinks); with none, one act that notes there is none."""
        rec = state.records.get(host)
        why = ladder.state_of(rec).repair_why or "marked for repair"

        def act(sink) -> Act:
            async def run(go) -> Done:
                return await asyncio.to_thread(self._repair_hook, ctx, host, state, sink)
            # the old hook's line stays as it was; an exec sink of health.events is named on its line
            fields = {"sink": sink.name} if sink is not None and sink.name != "repair_hook" else {}
            return Act(Decision(host, "repair-hook", why, rack=rec.rack if rec else None), run=run, intent=False,
                       fields=fields)

        return [act(s) for s in self.settings.repair_sinks()] or [act(None)]

    def _event_entry(self, e: ladder.Event, ctx: Context) -> store.ActionEntry:
        extra: dict[str, Any] = dict(e.extra)
        if e.seconds is not None:
            extra["seconds"] = e.seconds
        if e.phase:
            extra["phase"] = e.phase
        reason = e.why if e.action == "breaker-trip" else None      # the watch shows a trip's reason
        return store.action_entry(e.action, e.host, reason, who=ctx.who, at=e.at, result=e.result, why=e.why,
                                  rack=e.rack, **extra)

    # ------------------------------------------------------------------ the rungs

    async def _send(self, ctx: Context, r: ladder.Rung) -> tuple[str, str]:
        """("ok" | "failed" | "unknown" | "not-taken", text)."""
        try:
            if r.rung == ladder.POWER_CYCLE:
                return await asyncio.to_thread(self._power_cycle, ctx, r)
            target = next((t for t in ctx.targets if t.name == r.host), None)
            if target is None:
                return "failed", "no SSH target for the tray"
            if r.rung == ladder.GPU_RESET:
                from mctl.health import gpu_reset

                # NVIDIA's preconditions, on the tray in one command (mctl/health/gpu_reset.py): refused while
                # processes hold the GPUs, persistence mode off, one reset of the set, persistence back, verified
                deadline = self.ls.gpu_reset_deadline_s
                res = await ctx.pool.run_one(target, gpu_reset.script(r.gpus, deadline), timeout=deadline + 60,
                                             deadline=deadline + 65)
                if not res.status.reached:
                    return "unknown", _said(res)
                done = gpu_reset.parse(res.stdout, res.exit_code)
                if done.status == "refused":
                    return "not-taken", done.text
                if done.status == "ok":
                    return "ok", f"reset {', '.join(r.gpus)}: {done.text}"
                return "failed", done.text or _said(res)
            res = await ctx.pool.run_one(target, f"timeout 10 {ladder.REBOOT_COMMAND}", timeout=REBOOT_SEND_S,
                                            deadline=REBOOT_SEND_S + 5)
            if res.ok:
                return "ok", "reboot asked of the OS"
            if not res.status.reached or res.exit_code is None:
                return "unknown", _said(res)      # the tray may have gone down under the command
            return "failed", _said(res)
        except Exception as exc:  # noqa: BLE001 - one tray's rung must not end the watch
            return "failed", f"{type(exc).__name__}: {exc}"

    def _power_cycle(self, ctx: Context, r: ladder.Rung) -> tuple[str, str]:
        from mctl.bmc import power
        from mctl.bmc.client import BMCError, RedfishClient, base_url
        from mctl.bmc.inventory import settings_for
        from mctl.errors import MctlError
        from mctl.state.lock import file_lock, rack_lock_path

        host = self.site.host(r.host)
        if host is None or not host.bmc:
            return "failed", "no BMC address for the tray in the inventory"
        try:
            bmc = settings_for(self.site)
        except MctlError as exc:
            return "failed", exc.message
        url = base_url(host.bmc, scheme=bmc.scheme, port=bmc.port)
        tray = power.TrayPower(host.name, host.role, host.bmc, url)
        with contextlib.ExitStack() as stack:
            if host.rack:
                try:
                    stack.enter_context(file_lock(rack_lock_path(ctx.state_dir, host.rack),
                                                  purpose="mctl health watch: power-cycle", label=f"rack {host.rack}"))
                except MctlError as exc:
                    return "not-taken", exc.message     # `mctl power` or another command holds the rack: later
            client = RedfishClient(url, bmc.credentials, verify_tls=bmc.verify_tls, timeout_s=bmc.timeout_s,
                                   deadline=time.monotonic() + min(POWER_SEND_S, bmc.deadline_s), warn=lambda m: None,
                                   resume_tls=False)
            stack.callback(client.close)
            try:
                system = power.host_system(client)
                reset = "On" if system.power_state == "Off" else "PowerCycle"
                power.send_reset(client, system, reset, tray)
                return "ok", f"{reset} sent to {system.path} (was {system.power_state})"
            except BMCError as exc:
                if tray.sent and exc.kind in ("timeout", "unreachable"):
                    return "unknown", f"{exc.kind}: {exc.message}"      # sent; never sent again
                return "failed", f"{exc.kind}: {exc.message}"

    # ------------------------------------------------------------------ repair

    def _repair_hook(self, ctx: Context, host: str, state: store.HealthState, sink) -> Done:
        """Run one exec sink of the `repair` event (the repair hook): an argument list, no shell, its deadline."""
        rec = state.records.get(host)
        st = ladder.state_of(rec)
        why = st.repair_why or "marked for repair"
        rack = rec.rack if rec else None
        if sink is None:
            return Done("noted", why="no health.ladder.repair_hook configured")
        argv = ladder.fill_argv(sink.command, host, rack, why, len(st.failures))
        timeout = sink.timeout_s
        env = {**os.environ, "MCTL_TRAY": host, "MCTL_RACK": rack or "", "MCTL_REASON": why,
               "MCTL_FAILURES": str(len(st.failures)), "MCTL_SITE": self.site.name}
        t0 = time.monotonic()
        try:
            proc = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                  timeout=timeout, cwd=str(self.site.root))
            said = (proc.stdout + proc.stderr).strip()[-500:]
            result = "ok" if proc.returncode == 0 else f"failed: exit {proc.returncode}" + (f": {said}" if said else "")
        except subprocess.TimeoutExpired:
            result, said = f"failed: no answer within {timeout:g}s (killed)", ""
        except OSError as exc:
            result, said = f"failed: cannot run {argv[0]!r}: {exc.strerror or exc}", ""
        return Done(result, fields={"command": [shlex.quote(a) for a in argv], "seconds": round(time.monotonic() - t0, 3),
                                    "output": said or None})

    def findings(self, records) -> list[Finding]:
        """A critical `tray.repair` finding for every tray the ladder marked for repair."""
        out = []
        for host, rec in sorted(records.items()):
            st = ladder.state_of(rec)
            if st.phase == ladder.REPAIR:
                out.append(Finding(Severity.CRITICAL, host, "tray.repair", f"marked for repair: {st.repair_why}",
                                   "repair the tray, then 'mctl health resume' it", details={"failures": len(st.failures)}))
        return out

    # ------------------------------------------------------------------ burn-in

    def _burn_status(self, records) -> dict[str, str]:
        out: dict[str, str] = {}
        for host, fut in list(self._burn.items()):
            st = ladder.state_of(records.get(host))
            if st.phase != ladder.BURN_IN:
                self._burn.pop(host, None)
                continue
            if not fut.done():
                out[host] = "running"
                continue
            try:
                out[host] = fut.result()
            except Exception as exc:  # noqa: BLE001
                out[host] = f"failed: burn-in could not run: {type(exc).__name__}: {exc}"
        return out

    def _start_burn_ins(self, records) -> None:
        for host, rec in records.items():
            if ladder.state_of(rec).phase == ladder.BURN_IN and host not in self._burn:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="mctl-burn-in")
                self._burn[host] = self._pool.submit(self._burn_in, host)

    def _burn_in(self, host_name: str) -> str:
        """DCGM then NCCL on the tray (mctl.health.burnin); "ok" or "failed: why". No tools is a failure:
        a site that asks for burn-in before a resume gets it, or the tray stays out."""
        from mctl.health import burnin

        host = self.site.host(host_name)
        tools, failed = burnin.probe_tools(self.site, [host])
        if host_name in failed:
            return f"failed: burn-in tools could not be looked up: {failed[host_name]}"
        found = tools.get(host_name) or {}
        if not found:
            return "failed: burn-in is configured but the tray has neither dcgmi nor all_reduce_perf"
        rack = self.site.racks.get(host.rack) if host.rack else None
        gpus = rack.gpus_per_tray if rack is not None else 4
        verdicts = burnin.run_burn_in(self.site, [host], {host_name: found}, gpus, self.ls.burn_in,
                                      deadline=self.ls.burn_in_deadline_s)
        bad = [v.text for v in verdicts.get(host_name, []) if not v.ok]
        return "ok" if not bad else "failed: " + "; ".join(bad)[:300]


def _said(res) -> str:
    text = (res.stdout + res.stderr).strip()
    return (text.splitlines()[-1] if text else res.summary())[:300]
