"""The safety settings (issue 27): `safety.budget` and the leak response under `health.leak`, their defaults,
their conversion into the model (Site.safety, HealthSettings) and their refusals at file:line with a hint."""

from __future__ import annotations

import json
from dataclasses import FrozenInstanceError
from pathlib import Path

import pytest

from mctl.inventory import load_site, validate_inventory
from mctl.inventory.convert import health_settings, safety_settings
from mctl.inventory.schema import HealthSpec, SafetySpec
from mctl.model.settings import LEAK_SWITCH_TRAY, BudgetSettings, HealthSettings, SafetySettings

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = (REPO / "inventories" / "example-gb200" / "mctl.yml").read_text().replace(
    "images_dir: ../../images", f"images_dir: {REPO / 'images'}")


def site_text(budget: str = "", leak: str = "", text: str = EXAMPLE) -> str:
    if leak:
        text = text.replace("health:\n", "health:\n  leak:\n" + "".join(f"    {b}\n" for b in leak.splitlines()), 1)
    if budget:
        text += "safety:\n  budget:\n" + "".join(f"    {b}\n" for b in budget.splitlines())
    return text


def check(tmp_path: Path, text: str):
    folder = tmp_path / f"site{len(list(tmp_path.iterdir()))}"
    folder.mkdir()
    (folder / "mctl.yml").write_text(text)
    return validate_inventory(folder)


def line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.split("\n"), start=1) if needle in line)


# --- the budget ----------------------------------------------------------------------------------------------

def test_budget_defaults_and_limits():
    b = BudgetSettings()
    assert (b.rack_share, b.rack_max, b.site_share, b.site_max, b.allow_whole_rack) == (0.25, 4, 0.25, 64, False)
    assert [b.rack_limit(n) for n in (0, 1, 3, 4, 8, 18)] == [0, 0, 0, 1, 2, 4]
    assert [b.site_limit(n) for n in (4, 36, 256, 1000)] == [1, 9, 64, 64]
    assert BudgetSettings(rack_share=0.5, rack_max=100).rack_limit(18) == 9
    assert SafetySettings().budget == b
    with pytest.raises(FrozenInstanceError):
        b.rack_max = 18                                             # type: ignore[misc]


def test_a_budget_that_allows_a_whole_rack_or_site_is_named():
    racks = {"r1": 18, "r2": 4}
    assert BudgetSettings().whole(racks) == []
    assert BudgetSettings(rack_share=0.99, rack_max=18, site_share=0.99, site_max=100).whole(racks) == []
    assert [k for k, _ in BudgetSettings(rack_share=1.0).whole(racks)] == ["rack_share"]
    assert [k for k, _ in BudgetSettings(site_share=1.0, site_max=22).whole(racks)] == ["site_share"]
    assert [k for k, _ in BudgetSettings(rack_share=1.0, site_share=1.0).whole(racks)] == ["rack_share", "site_share"]
    assert BudgetSettings(rack_share=1.0, site_share=1.0, allow_whole_rack=True).whole(racks) == []
    assert BudgetSettings(rack_share=1.0).whole({}) and BudgetSettings(site_share=0.5).whole({"r": 0}) == []


def test_the_budget_reaches_the_site_converted_once(tmp_path):
    site = load_site(REPO / "inventories" / "example-gb200")
    assert site.safety == SafetySettings() and type(site.safety.budget) is BudgetSettings
    text = site_text("rack_share: '0.5'\nrack_max: 6.0\nsite_share: 0.125\nsite_max: 8\nallow_whole_rack: false")
    site, problems = check(tmp_path, text)
    assert problems == []
    assert site.safety.budget == BudgetSettings(rack_share=0.5, rack_max=6, site_share=0.125, site_max=8)
    assert type(site.safety.budget.rack_max) is int and type(site.safety.budget.rack_share) is float
    assert safety_settings(SafetySpec()) == SafetySettings()


def test_a_small_rack_keeps_one_tray_without_an_acknowledgement(tmp_path, capsys):
    """The defaults on the lab's 4-tray racks: a limit of 1, valid as it is."""
    from mctl.lab.layout import LabLayout
    from mctl.lab.site import inventory

    lab = tmp_path / "lab"
    lab.mkdir()
    (lab / "mctl.yml").write_text(inventory(LabLayout("lab", 2, 4), identity_file=tmp_path / "id",
                                            known_hosts=lab / "known_hosts"))
    site = load_site(lab)
    assert [site.safety.budget.rack_limit(len(r.compute)) for r in site.racks.values()] == [1, 1]


@pytest.mark.parametrize("budget,key", [
    ("rack_share: 1", "rack_share"),
    ("rack_share: 1.0\nrack_max: 2", "rack_share"),
    ("site_share: 1", "site_share"),
    ("rack_share: 1\nsite_share: 1\nallow_whole_rack: no", "rack_share"),
], ids=["rack-share-1", "rack-share-1-capped", "site-share-1", "acknowledgement-false"])
def test_a_whole_rack_budget_needs_the_acknowledgement(tmp_path, budget, key):
    text = site_text(budget)
    site, problems = check(tmp_path, text)
    assert site is None
    (p, *_) = [p for p in problems if p.field == f"safety.budget.{key}"]
    assert p.line == line_of(text, f"{key}:") and p.file.endswith("mctl.yml")
    assert "allow_whole_rack: true" in p.hint
    site, problems = check(tmp_path, site_text(budget.replace("allow_whole_rack: no", "") + "\nallow_whole_rack: true"))
    assert problems == [] and site.safety.budget.allow_whole_rack is True


@pytest.mark.parametrize("budget,words", [
    ("rack_share: 0", "greater than 0"),
    ("rack_share: -0.1", "greater than 0"),
    ("rack_share: 1.5", "less than or equal to 1"),
    ("site_share: .nan", "finite"),
    ("rack_max: 0", "greater than or equal to 1"),
    ("site_max: 2.5", "fractional part"),
    ("rack_max: true", "valid integer"),
    ("site_max: many", "valid integer"),
    ("allow_whole_rack: maybe", "valid boolean"),
    ("rack_sahre: 0.2", "unknown key"),
])
def test_budget_values_outside_their_bounds_are_refused(tmp_path, budget, words):
    text = site_text(budget)
    _, problems = check(tmp_path, text)
    key = budget.split(":")[0]
    (p,) = problems
    assert p.field == f"safety.budget.{key}" and p.line == line_of(text, f"{key}:") and words in p.message
    assert p.hint


def test_the_schema_and_the_model_agree_on_the_budget():
    from mctl.inventory.schema import BudgetSpec

    spec = BudgetSpec()
    assert {name: getattr(spec, name) for name in BudgetSpec.model_fields} == vars(BudgetSettings())


# --- the leak response -----------------------------------------------------------------------------------------

def test_leak_response_defaults():
    s = HealthSettings()
    assert (s.leak_exclude, s.leak_rack_share, s.leak_rack_power_off, s.leak_switch_tray) == \
        ((), 0.25, True, "power-off")
    assert health_settings(HealthSpec()) == s
    assert LEAK_SWITCH_TRAY == ("power-off", "rack", "alert")


def test_leak_response_reaches_the_model_and_travels_to_the_node_check(tmp_path):
    text = site_text(leak="exclude: [rack-a-tray03, rack-b-nvsw09]\nrack_share: 0.5\nrack_power_off: false\n"
                          "switch_tray: rack")
    site, problems = check(tmp_path, text)
    assert problems == []
    h = site.health
    assert (h.leak_exclude, h.leak_rack_share, h.leak_rack_power_off, h.leak_switch_tray) == \
        (("rack-a-tray03", "rack-b-nvsw09"), 0.5, False, "rack")
    data = json.loads(json.dumps(h.to_dict()))
    assert data["leak_exclude"] == ["rack-a-tray03", "rack-b-nvsw09"]
    assert HealthSettings.from_dict(data) == h
    with pytest.raises(ValueError, match="leak_switch_tray"):
        HealthSettings.from_dict({**data, "leak_switch_tray": "explode"})
    for choice in LEAK_SWITCH_TRAY:
        assert check(tmp_path, site_text(leak=f"switch_tray: {choice}"))[0].health.leak_switch_tray == choice


@pytest.mark.parametrize("leak,field,words", [
    ("exclude: [rack-z-tray01]", "health.leak.exclude[0]", "unknown tray 'rack-z-tray01'"),
    ("exclude: [rack-a-head]", "health.leak.exclude[0]", "head node"),
    ("exclude: [rack-a-tray01, rack-a-tray01]", "health.leak.exclude[1]", "listed twice"),
    ("exclude: ['rack-a-tray[01-02]']", "health.leak.exclude[0]", "unknown tray"),
    ("exclude: rack-a-tray01", "health.leak.exclude", "valid list"),
    ("exclude: [\"rack-a-tray01\\u200b\"]", "health.leak.exclude[0]", "U+200B"),
    ("rack_share: 0", "health.leak.rack_share", "greater than 0"),
    ("rack_share: 2", "health.leak.rack_share", "less than or equal to 1"),
    ("rack_share: .inf", "health.leak.rack_share", "finite"),
    ("rack_power_off: sometimes", "health.leak.rack_power_off", "valid boolean"),
    ("switch_tray: poweroff", "health.leak.switch_tray", "'power-off', 'rack' or 'alert'"),
    ("switch_tray: off", "health.leak.switch_tray", "'power-off', 'rack' or 'alert'"),
])
def test_leak_response_values_are_refused_at_their_line(tmp_path, leak, field, words):
    text = site_text(leak=leak)
    site, problems = check(tmp_path, text)
    assert site is None
    (p,) = [p for p in problems if p.field == field]
    assert p.line == line_of(text, leak.split(":")[0] + ":") and words in p.message and p.hint
