"""mctl.inventory.spec: the inventory's own validator (pydantic's lax conversions, bounds, locations)."""

from __future__ import annotations

import pytest

from mctl.inventory.schema import HealthSpec, SiteSpec, SSHSpec
from mctl.inventory.spec import ANY, DictOf, Either, F, ListOf, OneOf, Opt, Spec, SpecError


class Inner(Spec):
    n = F(int, ge=1)
    tag = F(Opt(str), None, pattern=r"^[a-z]+$")


class Outer(Spec):
    name = F(str)
    ratio = F(float, 0.5, gt=0, le=1)
    on = F(bool, False)
    mode = F(OneOf("a", "b", "c"), "a")
    tls = F(Either(bool, str), True)
    inner = F(Opt(Inner), None)
    items = F(ListOf(Inner), factory=list)
    table = F(DictOf(str, Inner), factory=dict)
    free = F(DictOf(str, ANY), factory=dict)


def errors_of(data) -> list[tuple]:
    with pytest.raises(SpecError) as info:
        Outer.model_validate(data)
    return [(e["loc"], e["type"], e["msg"], e["input"]) for e in info.value.errors()]


def test_conversions_follow_pydantic_lax_mode():
    o = Outer.model_validate({"name": "x", "ratio": "0.25", "on": "yes", "tls": "/ca.pem",
                              "inner": {"n": "3"}, "items": [{"n": 2.0}], "table": {"k": {"n": 1, "tag": "ab"}},
                              "free": {"any": [1, {"x": None}]}})
    assert (o.ratio, o.on, o.tls, o.inner.n, o.items[0].n, o.table["k"].tag) == (0.25, True, "/ca.pem", 3, 2, "ab")
    assert Outer.model_validate({"name": "x", "ratio": 1, "tls": False}).ratio == 1.0
    assert Outer.model_validate({"name": "x"}).tls is True and Outer(name="x").mode == "a"


def test_every_problem_with_its_location_in_document_order():
    found = errors_of({"mode": "d", "ratio": 0, "name": 5, "inner": {"n": 0, "tag": "A1", "x": 1},
                       "items": [{"n": 1}, {}], "table": {"k": []}, "on": "maybe", "bogus": 1})
    assert found == [
        (("mode",), "literal_error", "Input should be 'a', 'b' or 'c'", "d"),
        (("ratio",), "greater_than", "Input should be greater than 0", 0),
        (("name",), "string_type", "Input should be a valid string", 5),
        (("inner", "n"), "greater_than_equal", "Input should be greater than or equal to 1", 0),
        (("inner", "tag"), "string_pattern_mismatch", "String should match pattern '^[a-z]+$'", "A1"),
        (("inner", "x"), "extra_forbidden", "Extra inputs are not permitted", 1),
        (("items", 1, "n"), "missing", "Field required", {}),
        (("table", "k"), "model_type", "Input should be a valid dictionary or instance of Inner", []),
        (("on",), "bool_type", "Input should be a valid boolean", "maybe"),
        (("bogus",), "extra_forbidden", "Extra inputs are not permitted", 1),
    ]


@pytest.mark.parametrize("value,kind", [("22.5", "int_parsing"), (22.5, "int_from_float"), (True, "int_type"),
                                        (None, "int_type"), ([1], "int_type")])
def test_integers(value, kind):
    with pytest.raises(SpecError) as info:
        SSHSpec.model_validate({"port": value})
    assert [e["type"] for e in info.value.errors()] == [kind]


def test_missing_required_and_wrong_container():
    assert [e[1] for e in errors_of({})] == ["missing"]
    assert [e[1] for e in errors_of({"name": "x", "items": {"n": 1}, "table": [1]})] == ["list_type", "dict_type"]
    with pytest.raises(SpecError):
        Outer.model_validate(["not", "a", "mapping"])


def test_frozen_comparable_hashable_and_dumped():
    a = Outer(name="x", inner={"n": 2}, free={"l": [1, 2]})
    with pytest.raises(AttributeError):
        a.name = "y"
    assert a == Outer(name="x", inner=Inner(n=2), free={"l": [1, 2]}) and a != Outer(name="y")
    assert hash(a) == hash(Outer(name="x", inner={"n": 2}, free={"l": [1, 2]}))
    assert a.model_dump()["inner"] == {"n": 2, "tag": None} and "Outer(name='x'" in repr(a)
    assert list(Outer.model_fields)[:3] == ["name", "ratio", "on"] and Outer.model_fields["name"].required


def test_defaults_are_taken_as_written_and_factories_are_fresh():
    h1, h2 = HealthSpec(), HealthSpec()
    assert h1.interval == 60 and isinstance(h1.interval, int)           # pydantic never validated defaults
    assert h1.drain_xids == h2.drain_xids and h1.drain_xids is not h2.drain_xids
    assert HealthSpec(interval=5).interval == 5.0 and isinstance(HealthSpec(interval=5).interval, float)


def test_site_spec_names_the_racks_key_path():
    with pytest.raises(SpecError) as info:
        SiteSpec.model_validate({"site": "s", "racks": {"r1": {"compute": {"nodes": "t[1-2]"}, "modle": 1}}})
    locs = sorted(e["loc"] for e in info.value.errors())
    assert locs == [("racks", "r1", "compute", "addresses"), ("racks", "r1", "modle")]
