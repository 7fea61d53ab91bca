"""The inventory's validated sections (mctl.inventory.schema) into the model's settings, once.

The loader calls these after the schema checked types and bounds; every command after it reads
mctl.model.settings only. Sections whose keys are the model's fields are copied field by field
(a field missing on either side is an error here, not a silent default); the health section is
reshaped (durations in seconds, the breaker, hysteresis and leak keys flattened, severities typed).
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any, TypeVar

from mctl.errors import UsageError
from mctl.inventory.schema import BMCSpec, HealthSpec, NMXSpec, SafetySpec, SchedulerSpec, SSHSpec
from mctl.model.findings import Severity
from mctl.model.settings import (FABRIC_FLAG_DEFAULTS, BMCSettings, BmcEventSettings, BudgetSettings,
                                 EscalationSettings, EventSink, FailoverSettings, HealthSettings, K8sSettings,
                                 LadderSettings, NMXSettings, SafetySettings,
                                 SchedulerSettings, SlurmSettings, SSHSettings, parse_duration, parse_subcodes)

T = TypeVar("T")


def same_fields(cls: type[T], spec: Any) -> T:
    """*cls* built from the spec section with the same keys (values as validated)."""
    names = [f.name for f in fields(cls)]
    if set(names) != set(type(spec).model_fields):
        raise TypeError(f"{type(spec).__name__} and {cls.__name__} disagree on their keys")
    return cls(**{name: getattr(spec, name) for name in names})


def ssh_settings(spec: SSHSpec) -> SSHSettings:
    return same_fields(SSHSettings, spec)


def nmx_settings(spec: NMXSpec | None) -> NMXSettings | None:
    return None if spec is None else same_fields(NMXSettings, spec)


def bmc_settings(spec: BMCSpec | None) -> BMCSettings | None:
    return None if spec is None else same_fields(BMCSettings, spec)


def safety_settings(spec: SafetySpec) -> SafetySettings:
    return SafetySettings(budget=same_fields(BudgetSettings, spec.budget))


def scheduler_settings(spec: SchedulerSpec | None) -> SchedulerSettings | None:
    if spec is None:
        return None
    return SchedulerSettings(type=spec.type, cluster_name=spec.cluster_name, controller=spec.controller,
                             slurm=same_fields(SlurmSettings, spec.slurm), k8s=same_fields(K8sSettings, spec.k8s))


def ladder_settings(spec) -> LadderSettings:
    """`health.ladder` as the recovery ladder reads it. The repair hook is an argument list: no shell runs
    it, each argument is passed as it is, its placeholders filled per argument."""
    argv = tuple(str(a) for a in spec.repair_hook or ())
    return LadderSettings(
        gpu_reset=bool(spec.gpu_reset), reboot=bool(spec.reboot), power_cycle=bool(spec.power_cycle),
        power_cycle_when=str(spec.power_cycle_when), burn_in=str(spec.burn_in),
        max_failures=int(spec.max_failures), failure_window_s=parse_duration(spec.failure_window),
        fail_after_sweeps=int(spec.fail_after_sweeps),
        retry_after_s=parse_duration(spec.retry_after),
        gpu_reset_deadline_s=parse_duration(spec.gpu_reset_deadline),
        reboot_deadline_s=parse_duration(spec.reboot_deadline),
        power_cycle_deadline_s=parse_duration(spec.power_cycle_deadline),
        verify_deadline_s=parse_duration(spec.verify_deadline), burn_in_deadline_s=parse_duration(spec.burn_in_deadline),
        repair_hook=argv, repair_hook_timeout_s=parse_duration(spec.repair_hook_timeout),
        evidence=bool(spec.evidence), evidence_deadline_s=parse_duration(spec.evidence_deadline))


def health_settings(spec: HealthSpec) -> HealthSettings:
    """The `health:` section as the checks, the policy and the watch read it.

    A bad `nvlink5_no_drain` entry (the only value the schema cannot check by itself) is a
    UsageError naming the key; the loader reports it as a problem of the inventory."""
    try:
        no_drain = parse_subcodes(spec.nvlink5_no_drain)
    except ValueError as exc:
        raise UsageError(f"inventory health.nvlink5_no_drain: {exc}",
                         hint="quote each entry in the inventory, e.g. nvlink5_no_drain: ['149.38', '149.40']"
                         ) from None
    flags = dict(FABRIC_FLAG_DEFAULTS)
    flags.update({k: Severity(v) for k, v in spec.fabric_flags.items()})
    breaker, hysteresis = spec.breaker, spec.hysteresis
    return HealthSettings(
        interval=float(spec.interval),
        drain_xids=frozenset(int(x) for x in spec.drain_xids),
        nvlink5_drain=str(spec.nvlink5_drain),
        nvlink5_no_drain=no_drain,
        resume_after_healthy_sweeps=int(spec.resume_after_healthy_sweeps),
        unreachable_sweeps_before_drain=int(spec.unreachable_sweeps_before_drain),
        confirm_sweeps=int(spec.confirm_sweeps),
        max_gpu_temp_c=float(spec.max_gpu_temp_c),
        gpu_temp_warn_c=None if spec.gpu_temp_warn_c is None else float(spec.gpu_temp_warn_c),
        max_power_overshoot_pct=float(spec.max_power_overshoot_pct),
        xid_window_s=parse_duration(spec.xid_window),
        nvlink_error_window_s=parse_duration(spec.nvlink_error_window),
        nvlink_error_rate_critical=float(spec.nvlink_error_rate_critical),
        clock_event_sweeps=int(spec.clock_event_sweeps),
        boot_grace_s=parse_duration(spec.boot_grace),
        fabric_flags=flags,
        driver_mismatch=Severity(spec.driver_mismatch),
        imex=str(spec.imex),
        dcgm=str(spec.dcgm),
        disk_paths=tuple(spec.disk_paths),
        disk_warn_pct=float(spec.disk_warn_pct),
        disk_critical_pct=float(spec.disk_critical_pct),
        memory_warn_available_pct=float(spec.memory_warn_available_pct),
        breaker_max_share=float(breaker.max_drained_share),
        breaker_window_s=parse_duration(breaker.window),
        breaker_scope=str(breaker.scope),
        remediate=bool(spec.remediate),
        k8s_taint=str(spec.k8s_taint),
        k8s_evict=bool(spec.k8s_evict),
        hysteresis_clear_sweeps=int(hysteresis.clear_sweeps),
        hysteresis_max_hold_sweeps=int(hysteresis.max_hold_sweeps),
        hysteresis_window_sweeps=int(hysteresis.window_sweeps),
        hysteresis_checks=tuple(sorted(str(c) for c in hysteresis.checks)),
        bmc_checks=str(spec.bmc_checks),
        leak_interval=None if spec.leak_interval is None else float(spec.leak_interval),
        bmc_interval=None if spec.bmc_interval is None else float(spec.bmc_interval),
        bmc_stale_after=int(spec.bmc_stale_after),
        bmc_events=BmcEventSettings(
            listen=spec.bmc_events.listen, port=int(spec.bmc_events.port), url=spec.bmc_events.url,
            tls_cert=spec.bmc_events.tls_cert, tls_key=spec.bmc_events.tls_key,
            leak_interval=None if spec.bmc_events.leak_interval is None else float(spec.bmc_events.leak_interval),
            queue=int(spec.bmc_events.queue)),
        leak_power_off=bool(spec.leak.power_off),
        leak_power_off_after_s=parse_duration(spec.leak.power_off_after),
        leak_clear_sweeps=int(spec.leak.clear_sweeps),
        leak_exclude=tuple(str(t) for t in spec.leak.exclude),
        leak_rack_share=float(spec.leak.rack_share),
        leak_rack_power_off=bool(spec.leak.rack_power_off),
        leak_switch_tray=str(spec.leak.switch_tray),
        tray_deadline=None if spec.tray_deadline is None else float(spec.tray_deadline),
        metrics_textfile=spec.metrics_textfile,
        metrics_port=spec.metrics_port,
        metrics_listen=str(spec.metrics_listen),
        ladder=ladder_settings(spec.ladder),
        escalation=EscalationSettings(
            enabled=bool(spec.escalation.enabled), rack_share=float(spec.escalation.rack_share),
            window_s=parse_duration(spec.escalation.window), min_trays=int(spec.escalation.min_trays),
            on_switch_tray=bool(spec.escalation.on_switch_tray),
            count_unreachable=bool(spec.escalation.count_unreachable)),
        isolate=bool(spec.isolate.enabled),
        isolate_to=str(spec.isolate.to),
        events=tuple(event_sink(e) for e in spec.events),
        shards={str(name): tuple(str(r) for r in racks) for name, racks in spec.shards.items()},
        failover=FailoverSettings(
            etcd=tuple(str(e) for e in spec.failover.etcd), key_prefix=str(spec.failover.key_prefix).rstrip("/")
            or "/mctl", ttl_s=None if spec.failover.ttl is None else parse_duration(spec.failover.ttl),
            timeout_s=parse_duration(spec.failover.timeout)),
    )


def event_sink(spec) -> EventSink:
    """One `health.events` entry as the event stream reads it (the loader checked which keys its type takes)."""
    return EventSink(type=str(spec.type), name=str(spec.name or ""), path=spec.path, address=spec.address,
                     facility=str(spec.facility), url=spec.url, timeout_s=parse_duration(spec.timeout),
                     retries=int(spec.retries), backoff_s=parse_duration(spec.backoff),
                     headers_file=spec.headers_file, command=tuple(str(a) for a in spec.command or ()),
                     kinds=tuple(str(k) for k in spec.kinds), actions=tuple(str(a) for a in spec.actions),
                     queue=int(spec.queue), dead_letter=spec.dead_letter)
