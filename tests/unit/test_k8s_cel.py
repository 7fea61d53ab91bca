"""The CRDs' CEL rules (x-kubernetes-validations) evaluated on what mctl renders.

The test tier's kube-apiserver (1.20) drops these rules; a 1.25+ server enforces them on
create and update. cel-python evaluates them here, on every rendered ComputeDomain and KAI
Topology: rules without oldSelf as on create, transition rules (oldSelf) as on mctl's second
apply of the same object, and each rule is shown to catch the mistake it exists for.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Iterator

import celpy
import pytest
import yaml

from mctl.sched.k8s import render_k8s
from tests.helpers import k8s_site

CRDS = Path(__file__).resolve().parents[1] / "fixtures" / "golden" / "k8s" / "crds"
ENV = celpy.Environment()


def rules_of(schema: dict, path: tuple = ()) -> Iterator[tuple[tuple, str, str]]:
    """(path in the object, rule, message) for every x-kubernetes-validations under schema; '*' = each item."""
    for rule in schema.get("x-kubernetes-validations") or []:
        yield path, rule["rule"], rule.get("message", "")
    for name, sub in (schema.get("properties") or {}).items():
        yield from rules_of(sub, path + (name,))
    if isinstance(schema.get("items"), dict):
        yield from rules_of(schema["items"], path + ("*",))
    if isinstance(schema.get("additionalProperties"), dict):
        yield from rules_of(schema["additionalProperties"], path + ("*",))


def crd_rules() -> dict[tuple[str, str], list[tuple[tuple, str, str]]]:
    out = {}
    for path in sorted(CRDS.glob("*.yaml")):
        crd = next(d for d in yaml.safe_load_all(path.read_text()) if d)
        for v in crd["spec"]["versions"]:
            key = (f"{crd['spec']['group']}/{v['name']}", crd["spec"]["names"]["kind"])
            out[key] = list(rules_of(v["schema"]["openAPIV3Schema"]))
    return out


def values_at(obj: Any, path: tuple) -> list[Any]:
    if not path:
        return [obj]
    head, rest = path[0], path[1:]
    if head == "*":
        items = obj if isinstance(obj, list) else list(obj.values()) if isinstance(obj, dict) else []
        return [v for item in items for v in values_at(item, rest)]
    return values_at(obj[head], rest) if isinstance(obj, dict) and head in obj else []


def evaluate(rule: str, value: Any, old: Any = None) -> bool:
    act = {"self": celpy.json_to_cel(value)}
    if "oldSelf" in rule:
        act["oldSelf"] = celpy.json_to_cel(old)
    result = ENV.program(ENV.compile(rule)).evaluate(act)
    if isinstance(result, celpy.CELEvalError):
        raise AssertionError(f"{rule!r} could not be evaluated: {result}")
    return bool(result)


def violations(obj: dict, rules: list, old: dict | None = None) -> list[str]:
    """Messages of the rules obj breaks; transition rules only when there is an old object (an update)."""
    out = []
    for path, rule, message in rules:
        if "oldSelf" in rule and old is None:
            continue
        for value, before in zip(values_at(obj, path), values_at(old, path) if old is not None
                                 else [None] * len(values_at(obj, path))):
            if not evaluate(rule, value, before):
                out.append(f"{'.'.join(path)}: {message}")
    return out


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    return render_k8s(k8s_site(tmp_path_factory.mktemp("cel"))).objects


def test_the_crds_carry_the_rules_we_evaluate():
    rules = crd_rules()
    assert [r[1] for r in rules[("resource.nvidia.com/v1beta1", "ComputeDomain")]] == ["self == oldSelf"]
    topo = rules[("kai.scheduler/v1alpha1", "Topology")]
    assert [r[0] for r in topo] == [("spec", "levels")] * 3
    assert [r[2] for r in topo] == ["field is immutable", "must be unique",
                                    "the kubernetes.io/hostname label can only be used at the lowest level of topology"]


def test_every_rendered_custom_resource_passes_its_rules_on_create_and_on_reapply(rendered):
    rules = crd_rules()
    checked = 0
    for obj in rendered:
        key = (obj["apiVersion"], obj["kind"])
        if key not in rules:
            continue
        assert violations(obj, rules[key]) == [], obj["metadata"]["name"]
        assert violations(obj, rules[key], old=copy.deepcopy(obj)) == [], obj["metadata"]["name"]
        checked += 1
    assert checked == 3 + 1                 # three ComputeDomains (rack-a-p0, -p1, rack-b-all), one Topology


def test_a_changed_compute_domain_spec_is_refused(rendered):
    rules = crd_rules()[("resource.nvidia.com/v1beta1", "ComputeDomain")]
    cd = next(o for o in rendered if o["kind"] == "ComputeDomain")
    changed = copy.deepcopy(cd)
    changed["spec"]["channel"]["allocationMode"] = "All"
    assert violations(changed, rules, old=cd) == ["spec: A computeDomain.spec is immutable"]


@pytest.mark.parametrize("levels, message", [
    ([{"nodeLabel": "kubernetes.io/hostname"}, {"nodeLabel": "nvidia.com/gpu.clique"}],
     "the kubernetes.io/hostname label can only be used at the lowest level of topology"),
    ([{"nodeLabel": "nvidia.com/gpu.clique"}, {"nodeLabel": "nvidia.com/gpu.clique"},
      {"nodeLabel": "kubernetes.io/hostname"}], "must be unique"),
])
def test_topology_rules_catch_what_they_are_for(rendered, levels, message):
    rules = crd_rules()[("kai.scheduler/v1alpha1", "Topology")]
    topo = copy.deepcopy(next(o for o in rendered if o["kind"] == "Topology"))
    topo["spec"]["levels"] = levels
    assert violations(topo, rules) == [f"spec.levels: {message}"]


def test_a_changed_topology_is_refused(rendered):
    rules = crd_rules()[("kai.scheduler/v1alpha1", "Topology")]
    topo = next(o for o in rendered if o["kind"] == "Topology")
    changed = copy.deepcopy(topo)
    changed["spec"]["levels"] = changed["spec"]["levels"][1:]
    assert violations(changed, rules, old=topo) == ["spec.levels: field is immutable"]
