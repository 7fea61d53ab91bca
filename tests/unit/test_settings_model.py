"""The site's settings live in the model (mctl.model.settings); the inventory converts into them once.

The schema (mctl.inventory.schema) says what an operator may write and checks it; the model's
frozen dataclasses are what every command reads. Their keys and defaults must agree, so a key
added to one side only, or a default changed on one side only, fails here.
"""

from __future__ import annotations

import json
from dataclasses import MISSING, FrozenInstanceError, fields
from pathlib import Path

import pytest
import yaml

from mctl.inventory.convert import health_settings, same_fields
from mctl.inventory.loader import load_site, validate_inventory
from mctl.inventory.schema import BMCSpec, HealthSpec, K8sSpec, NMXSpec, SchedulerSpec, SlurmSpec, SSHSpec
from mctl.model.settings import (BMCSettings, HealthSettings, K8sSettings, NMXSettings, SchedulerSettings,
                                 SlurmSettings, SSHSettings)

EXAMPLE = Path(__file__).resolve().parents[2] / "inventories" / "example-gb200"
IMAGES = EXAMPLE.parents[1] / "images"
_NONE = object()

PAIRS = [(SSHSpec, SSHSettings), (NMXSpec, NMXSettings), (BMCSpec, BMCSettings), (SlurmSpec, SlurmSettings),
         (K8sSpec, K8sSettings), (SchedulerSpec, SchedulerSettings)]


def _default(f):
    if f.default is not MISSING:
        return f.default
    return f.default_factory() if f.default_factory is not MISSING else _NONE


@pytest.mark.parametrize("spec, model", PAIRS, ids=[m.__name__ for _, m in PAIRS])
def test_schema_and_model_agree_on_keys_order_and_defaults(spec, model):
    assert list(spec.model_fields) == [f.name for f in fields(model)]
    for f in fields(model):
        sf = spec.model_fields[f.name]
        want = _NONE if sf.required else sf.make_default()
        got = _default(f)
        if hasattr(want, "model_dump"):             # a nested section: compare as data
            want, got = want.model_dump(), got.to_dict() if hasattr(got, "to_dict") else vars(got)
            assert json.dumps(want, sort_keys=True) == json.dumps(got, sort_keys=True, default=vars), f.name
        else:
            assert got == want and type(got) is type(want), f"{model.__name__}.{f.name}: {got!r} != {want!r}"


def test_the_health_sections_defaults_are_the_models():
    assert health_settings(HealthSpec()) == HealthSettings()


def test_every_health_key_reaches_the_model():
    spec = HealthSpec(tray_deadline=12, metrics_textfile="/var/lib/node_exporter/mctl.prom", metrics_port=9400,
                      metrics_listen="0.0.0.0", hysteresis={"clear_sweeps": 2, "window_sweeps": 4,
                                                            "max_hold_sweeps": 8, "checks": ["gpu.xid"]})
    s = health_settings(spec)
    assert (s.tray_deadline, s.metrics_textfile, s.metrics_port, s.metrics_listen) == \
        (12.0, "/var/lib/node_exporter/mctl.prom", 9400, "0.0.0.0")
    assert (s.hysteresis_clear_sweeps, s.hysteresis_window_sweeps, s.hysteresis_max_hold_sweeps,
            s.hysteresis_checks) == (2, 4, 8, ("gpu.xid",))
    assert HealthSettings.from_dict(json.loads(json.dumps(s.to_dict()))) == s


def test_a_section_that_disagrees_with_its_model_is_an_error_not_a_silent_default():
    with pytest.raises(TypeError, match="disagree"):
        same_fields(NMXSettings, SSHSpec())


def test_the_loaded_site_holds_only_model_settings():
    site = load_site(EXAMPLE)
    assert type(site.ssh) is SSHSettings and type(site.health) is HealthSettings
    assert type(site.scheduler) is SchedulerSettings and type(site.scheduler.slurm) is SlurmSettings
    assert all(type(r.nmx) is NMXSettings for r in site.racks.values())
    assert site.racks["rack-a"].nmx.url == "https://10.20.0.5"
    with pytest.raises(FrozenInstanceError):
        site.ssh.port = 2222                                        # type: ignore[misc]
    # `mctl inventory show --json` prints the scheduler as the inventory's section did.
    doc = yaml.safe_load((EXAMPLE / "mctl.yml").read_text())
    assert site.scheduler.to_dict() == SchedulerSpec.model_validate(doc["scheduler"]).model_dump()


def test_a_bad_nvlink5_subcode_is_a_problem_of_the_inventory_at_its_line(tmp_path):
    text = (EXAMPLE / "mctl.yml").read_text().replace("images_dir: ../../images", f"images_dir: {IMAGES}")
    assert validate_inventory(_write(tmp_path / "good", text))[1] == []
    text = text.replace("health:\n", "health:\n  nvlink5_no_drain: ['79.1']\n", 1)
    site, problems = validate_inventory(_write(tmp_path / "bad", text))
    assert site is None and len(problems) == 1
    p = problems[0]
    assert p.field == "health.nvlink5_no_drain" and "not an NVLink5 XID.subcode: '79.1'" in p.message
    assert text.splitlines()[p.line - 1].strip().startswith("nvlink5_no_drain")
    assert "quote each entry" in p.hint


def _write(folder: Path, text: str) -> Path:
    folder.mkdir()
    (folder / "mctl.yml").write_text(text)
    return folder
