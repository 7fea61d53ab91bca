"""deploy k8s' immutable-spec check against what a server stores (pure)."""

from __future__ import annotations

from mctl.sched.k8s.apply import _holds, _minor

RENDERED = {"numNodes": 0, "channel": {"resourceClaimTemplate": {"name": "rack-a-p0-channel"},
                                       "allocationMode": "Single"}}


def test_server_defaults_are_the_same_spec():
    stored = {"numNodes": 0, "channel": {"resourceClaimTemplate": {"name": "rack-a-p0-channel"},
                                         "allocationMode": "Single", "newDefaultedField": "x"}}
    assert _holds(stored, RENDERED)


def test_a_different_or_missing_value_is_not():
    assert not _holds({"numNodes": 9, "channel": RENDERED["channel"]}, RENDERED)
    assert not _holds({"numNodes": 0, "channel": {"resourceClaimTemplate": {"name": "other"}}}, RENDERED)
    assert not _holds(None, RENDERED)
    levels = [{"nodeLabel": "nvidia.com/gpu.clique"}, {"nodeLabel": "kubernetes.io/hostname"}]
    assert _holds(levels, levels) and not _holds(levels[:1], levels) and not _holds(levels[::-1], levels)


def test_versions():
    assert _minor("1.32") == (1, 32) and _minor("v1.20.2") == (1, 20) and _minor("1.27+") == (1, 27)
    assert _minor("latest") is None and _minor(None) is None
