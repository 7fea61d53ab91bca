"""Uncorrectable ECC errors, remapped-row failures, Blackwell memory repair (R580) and the driver's GPU
recovery action."""

from __future__ import annotations

from mctl.checks._base import fail, finding, gpu_list, ok
from mctl.model.findings import Finding, Severity

ECC = "gpu.ecc"
ROWS = "gpu.remapped-rows"
RECOVERY = "gpu.recovery"
REPAIR = "gpu.memory-repair"


def check(facts, expect, settings) -> list[Finding]:
    if facts.gpus is None or not facts.gpus.gpus:
        return []
    host = facts.host
    out: list[Finding] = []
    volatile = [(g.index, g.ecc.volatile_uncorrectable) for g in facts.gpus.gpus if g.ecc.volatile_uncorrectable]
    lifetime = [(g.index, g.ecc.aggregate_uncorrectable) for g in facts.gpus.gpus
                if g.ecc.aggregate_uncorrectable and not g.ecc.volatile_uncorrectable]
    if volatile:
        out.append(fail(host, ECC, "uncorrectable ECC errors since the driver loaded: "
                        + ", ".join(f"gpu{i} {n}" for i, n in volatile),
                        "drain, reset the GPU (or reboot) so pending row remaps apply; replace it if errors return",
                        short=f"ecc uncorrectable {gpu_list(i for i, _ in volatile)}",
                        gpus={str(i): n for i, n in volatile}))
    if lifetime:
        out.append(finding(Severity.WARN, host, ECC, "uncorrectable ECC errors in the GPU's lifetime (none since "
                           "the driver loaded): " + ", ".join(f"gpu{i} {n}" for i, n in lifetime),
                           "keep an eye on it; a GPU that keeps collecting them should be replaced"))
    failed = [g.index for g in facts.gpus.gpus if g.remapped_rows.failure]
    pending = [g.index for g in facts.gpus.gpus if g.remapped_rows.pending and not g.remapped_rows.failure]
    if failed:
        out.append(fail(host, ROWS, f"row remapping failed on {gpu_list(failed)}",
                        "the GPU ran out of spare rows: drain and replace it (RMA)",
                        short=f"row remap failure {gpu_list(failed)}"))
    if pending:
        out.append(finding(Severity.WARN, host, ROWS, f"row remap pending on {gpu_list(pending)}",
                           "reset the GPU when it is idle so the remap takes effect"))
    unrepairable = [g.index for g in facts.gpus.gpus if g.repair.unrepairable_memory]
    sram = [g.index for g in facts.gpus.gpus if g.repair.sram_threshold_exceeded]
    repair_pending = [(g.index, ", ".join(w for w, on in (("channel", g.repair.channel_repair_pending),
                                                            ("TPC", g.repair.tpc_repair_pending)) if on))
                      for g in facts.gpus.gpus if g.repair.channel_repair_pending or g.repair.tpc_repair_pending]
    if unrepairable:
        out.append(fail(host, REPAIR,
                        f"memory the GPU could not repair on {gpu_list(unrepairable)}",
                        "the GPU's memory repair is exhausted: drain and replace it (RMA)",
                        short=f"unrepairable memory {gpu_list(unrepairable)}"))
    if sram:
        out.append(fail(host, REPAIR, f"SRAM error threshold exceeded on {gpu_list(sram)}",
                        "drain; NVIDIA treats a GPU over its SRAM uncorrectable-error threshold as a replacement "
                        "(RMA) case", short=f"sram threshold {gpu_list(sram)}"))
    if repair_pending:
        out.append(finding(Severity.WARN, host, REPAIR, "memory repair pending (applies at the next GPU reset): "
                           + ", ".join(f"gpu{i} {what}" for i, what in repair_pending),
                           "reset the GPU when it is idle so the repair takes effect"))
    reset = [(g.index, g.gpu_recovery_action) for g in facts.gpus.gpus
             if g.gpu_recovery_action and g.gpu_recovery_action.strip().lower() not in ("none", "n/a")]
    if reset:
        action = reset[0][1]
        out.append(fail(host, RECOVERY,
                        "driver asks for recovery: " + ", ".join(f"gpu{i} {a}" for i, a in reset),
                        f"drain, then {action.lower()} the GPU (nvidia-smi -r) or reboot the tray",
                        short=f"{gpu_list(i for i, _ in reset)} needs {action.lower()}"))
    if not out:
        out.append(ok(host, ECC, "no uncorrectable ECC errors, no remap or repair pending, no recovery action"))
    return out
