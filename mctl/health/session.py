"""One `mctl health watch` run as an object: scope, settings, metrics, the remediation lock and the loop.

WatchSession.configure() resolves what the run watches and how (the command's
options over the inventory's health settings) and checks it before anything
starts; run() serves or writes the metrics after each sweep, takes the watch
lock when it acts, and drives the loop of mctl.health.watch. What the operator
sees is the caller's: it passes on_update (called after each sweep and event,
with the WatchView) and, for a live screen, a context manager that is open
while the loop runs. Nothing here prints or imports a renderer.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, ContextManager

from mctl.errors import UsageError
from mctl.health.watch import Event, WatchView

if TYPE_CHECKING:
    from mctl.model.settings import HealthSettings
    from mctl.health.site_view import Scope, Shard
    from mctl.model.site import Site

OnUpdate = Callable[[WatchView, "list[Event]", bool], None]

NO_SCHEDULER = "the inventory names no scheduler: watching without remediation"
NO_BUDGET = ("the safety budget (safety.budget) is kept by slurmctld; this Kubernetes site has no shared ledger, "
             "so only the watch's circuit breaker caps its drains (node checks and other actors are not counted)")


@dataclass
class WatchSession:
    site: "Site"
    scope: "Scope"
    settings: "HealthSettings"
    state_dir: Path
    interval: float
    remediate: bool                 # drains and resumes (the inventory names a scheduler)
    dry_run: bool
    textfile: Path | None
    port: int | None
    listen: str
    view: WatchView
    timeout: float | None = None
    max_sweeps: int | None = None
    shard: "Shard | None" = None
    failover: bool = False          # a leader lease in etcd (health.failover.etcd), for an acting watch

    @classmethod
    def configure(cls, site: "Site", state_dir: Path, target: str | None, *, interval: float | None = None,
                  racks: str | None = None, shard: str | None = None,
                  remediate: bool | None = None, metrics_textfile: Path | None = None,
                  metrics_port: int | None = None, metrics_listen: str | None = None, sweeps: int | None = None,
                  timeout: float | None = None, dry_run: bool = False,
                  on_warning: Callable[[str], None] | None = None) -> "WatchSession":
        """The run the options ask for; UsageError for options that cannot work (nothing started yet)."""
        from mctl.health.metrics import listen_address
        from mctl.health.site_view import resolve_scope, resolve_shard, settings_of

        owned = resolve_shard(site, shard, racks)
        if target and not owned.whole_site:
            raise UsageError("a node set and --rack-set/--shard both given",
                             hint="a shard's watch watches all its racks: give the shard, or the node set alone")
        scope = resolve_scope(site, target if owned.whole_site else ",".join(owned.racks))
        settings = settings_of(site)
        every = float(interval if interval is not None else settings.interval)
        acting = settings.remediate if remediate is None else remediate
        if acting and site.scheduler is None:
            acting = False
            if on_warning is not None:
                on_warning(NO_SCHEDULER)
        if acting and site.scheduler is not None and site.scheduler.type != "slurm" and on_warning is not None:
            on_warning(NO_BUDGET)
        textfile = metrics_textfile or (Path(site.health.metrics_textfile) if site.health.metrics_textfile else None)
        port = metrics_port or site.health.metrics_port
        listen_text = metrics_listen if metrics_listen is not None else site.health.metrics_listen
        try:
            listen = listen_address(listen_text)
        except ValueError as exc:
            where = "--metrics-listen" if metrics_listen is not None else "health.metrics_listen"
            raise UsageError(f"{where}: {exc}", hint="give an IP address of this machine; 127.0.0.1 keeps /metrics "
                                                     "local, 0.0.0.0 or :: opens it to the network") from None
        if metrics_listen is not None and not port:
            raise UsageError("--metrics-listen needs a port to listen on",
                             hint="add --metrics-port PORT (or set health.metrics_port)")
        view = WatchView(site=site.name, racks=racks_of(scope), interval=every, remediate=acting, dry_run=dry_run,
                         shard=None if owned.whole_site else owned.name)
        failover = settings.failover.enabled and acting and not dry_run
        if settings.failover.enabled and not failover and on_warning is not None:
            on_warning("health.failover is set, but this watch does not act (dry run or no remediation): "
                       "it takes no lease and runs beside the leader")
        return cls(site, scope, settings, Path(state_dir), every, acting, dry_run, textfile, port or None, listen,
                   view, timeout=timeout, max_sweeps=sweeps, shard=owned, failover=failover)

    @property
    def sweeps_done(self) -> int:
        return self.view.last.number if self.view.last else 0

    @property
    def locks(self) -> bool:
        """The run takes the state directory's watch lock (it acts: remediation on, not a dry run), unless a
        leader lease in etcd excludes the other watches instead (D121)."""
        return self.remediate and not self.dry_run and not self.failover

    def elector(self):
        """The leader lease's side of this watch (health.failover), or None."""
        if not self.failover:
            return None
        from mctl.health.failover import Elector

        return Elector.configure(self.settings.failover, self.site.name, self.shard.name if self.shard else "site",
                                 self.interval)

    def run(self, on_update: OnUpdate, *, display: ContextManager | None = None) -> None:
        """Serve /metrics, take the lock, open *display*, sweep until stopped (a signal or max_sweeps)."""
        import asyncio

        from mctl.health import store
        from mctl.health.watch import run_watch

        server = self._serve()
        publish = self._publisher(server)

        def update(view: WatchView, events: "list[Event]", swept: bool) -> None:
            publish(view)
            on_update(view, events, swept)

        async def main() -> None:
            await run_watch(self.site, self.scope, self.settings, self.state_dir, interval=self.interval,
                            remediate=self.remediate, dry_run=self.dry_run, view=self.view, on_update=update,
                            timeout=self.timeout, max_sweeps=self.max_sweeps, elector=self.elector())

        try:
            with contextlib.ExitStack() as stack:
                if self.locks:
                    stack.enter_context(store.watch_lock(self.state_dir, "mctl health watch"))
                if self.remediate and not self.dry_run:
                    store.load_state(self.state_dir)    # a damaged state file stops the watch before it starts
                if display is not None:
                    stack.enter_context(display)
                asyncio.run(main())
        finally:
            if server is not None:
                server.close()

    def _serve(self):
        if not self.port:
            return None
        from mctl.health.metrics import MetricsServer

        try:
            return MetricsServer(self.port, self.listen).start()
        except OSError as exc:
            shown = f"[{self.listen}]" if ":" in self.listen else self.listen
            raise UsageError(f"cannot serve metrics on {shown}:{self.port}: {exc.strerror}",
                             hint="pick another --metrics-port, or an address of this machine for "
                                  "--metrics-listen") from None

    def _publisher(self, server) -> Callable[[WatchView], None]:
        from mctl.health import metrics

        def publish(view: WatchView) -> None:
            if view.last is None or not (self.textfile or server):
                return
            text = metrics.render(view.last, site=self.site.name, counters=view.counters, interval=self.interval,
                                  shard=view.shard, role=view.role)
            if self.textfile:
                metrics.write_textfile(self.textfile, text)
            if server:
                server.update(text)

        return publish


def racks_of(scope: "Scope") -> dict[str, list[str]]:
    """rack -> its trays in the scope, in inventory order ('-' for trays of no rack)."""
    racks: dict[str, list[str]] = {}
    for h in scope.hosts:
        racks.setdefault(h.rack or "-", []).append(h.name)
    return racks
