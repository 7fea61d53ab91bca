"""Health checks, the drain policy and the watch (docs/health.md).

Layers: probe/nvml (facts) -> checks (pure, one module per check) -> policy and
breaker (pure decisions) -> scheduler adapters (act) -> store (state, action
log). Everything `mctl node check` needs on a tray is standard library only;
the rest (engine, watch, screen, service) runs on the operator's machine.
"""
