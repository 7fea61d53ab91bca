"""The driver the tray runs is the one its software image names (images/<image>.yml)."""

from __future__ import annotations

from mctl.checks._base import finding, ok
from mctl.model.findings import Finding

CHECK = "gpu.driver"


def check(facts, expect, settings) -> list[Finding]:
    if facts.gpus is None or not expect.driver_version:
        return []
    have = facts.gpus.driver_version
    if have == expect.driver_version:
        return [ok(facts.host, CHECK, f"driver {have}")]
    image = f"image {expect.image}" if expect.image else "the image"
    return [finding(settings.driver_mismatch, facts.host, CHECK,
                    f"driver {have or 'unknown'}, {image} wants {expect.driver_version}",
                    "reprovision the tray with its image (mctl provision TRAY); a mixed rack breaks IMEX",
                    short=f"driver {have or '?'}", have=have, want=expect.driver_version)]
