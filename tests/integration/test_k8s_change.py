"""A partition change on a Kubernetes site against the real kube-apiserver (tests/kube_apiserver.py):
the pods on the affected trays found with one list call, --drain's cordon and evictions (the
PodDisruptionBudgets asked, until the deadline), --force's deletes, the labels step read back,
and an API server that answers 429/5xx or nothing (tests/kube_apiserver.FlakyProxy): asked again
within the deadline, then the change stops with every node as it was, nothing half-labelled.

mctl talks to the server as its RBAC-limited user through an ordinary kubeconfig; the tests
arrange and read back as an admin, play the parts no controller plays here (the kubelets that
finish a graceful deletion, the disruption controller's budget status) in the open, and count
mctl's writes from the server's audit log.
"""

from __future__ import annotations

import threading

import pytest

from mctl.change import run as cr
from mctl.change.request import ChangeRequest
from mctl.change.service import gate
from mctl.change.ui import ChangeUI
from mctl.errors import EnvironmentProblem, PartialFailure, UsageError
from mctl.fabric import change as ch
from mctl.model.site import Partition
from mctl.sched.k8s import evict
from mctl.sched.k8s.client import KubeClient
from mctl.sched.k8s import kubeconfig
from mctl.sched.work import k8s_pod_objects, k8s_pods
from tests.helpers import plan_for, site_with, wait_for
from tests.kube_apiserver import (FlakyProxy, Kubelet, add_budget, add_pods, clear_pods, gb200_node, gpu_pod,
                                  pod_names, set_budget_status)

TRAYS = [f"r1-tray{n:02d}" for n in range(1, 5)]
BEFORE = [Partition("p0", "r1", tuple(TRAYS[:2])), Partition("p1", "r1", tuple(TRAYS[2:]))]
AFTER = [Partition("p0", "r1", tuple(TRAYS[:2])), Partition("p2", "r1", tuple(TRAYS[2:]))]     # p1 renamed p2
CLIQUE = "7b968a6d-c8aa-45e1-9e07-e1e51be99c31"
REASON = evict.change_reason("r1")


@pytest.fixture
def kube(kube_apiserver):
    kube_apiserver.reset([gb200_node(t, f"{CLIQUE}.{1 if i < 2 else 2}",
                                     labels={"mctl.io/nvlink-partition": "r1-p0" if i < 2 else "r1-p1"})
                          for i, t in enumerate(TRAYS)])
    clear_pods(kube_apiserver)
    # on the affected trays (03, 04): two GPU pods of a training job, a pod without GPUs, a DaemonSet's GPU pod;
    # on tray01 (not affected) another GPU pod
    add_pods(kube_apiserver, [gpu_pod("train-0", TRAYS[2]), gpu_pod("train-1", TRAYS[3]),
                              gpu_pod("web-0", TRAYS[2], gpus=0, labels={"app": "web"}),
                              gpu_pod("burn-x1", TRAYS[3], labels={"app": "burn"}, owner="gpu-burn"),
                              gpu_pod("other-0", TRAYS[0], labels={"app": "other"})])
    kube_apiserver.mark()
    try:
        yield kube_apiserver
    finally:
        clear_pods(kube_apiserver)


def site_for(tmp_path, kube, server: str | None = None):
    config = kube.kubeconfig(tmp_path / "kube" / "config", ca="file", token="file", server=server)
    return site_with(tmp_path / "site", scheduler="k8s", k8s={"kubeconfig": str(config)},
                     parts=[{"name": p.name, "trays": ",".join(p.trays)} for p in BEFORE])


@pytest.fixture
def site(tmp_path, kube):
    (tmp_path / "site").mkdir()
    return site_for(tmp_path, kube)


@pytest.fixture
def proxy(kube):
    p = FlakyProxy(kube, stall_s=2.0)
    try:
        yield p
    finally:
        p.close()


@pytest.fixture
def flaky_site(tmp_path, kube, proxy):
    (tmp_path / "site").mkdir()
    return site_for(tmp_path, kube, server=proxy.url)


def change_of(site):
    """The cross-layer plan of renaming p1 (trays 03-04), with the work found on them."""
    affected = TRAYS[2:]
    return plan_for(site, AFTER, k8s_pods(site, affected))


def cordoned(kube, tray) -> bool:
    node = kube.node(tray)
    return bool(node["spec"].get("unschedulable")) and \
        (node["metadata"].get("annotations") or {}).get("mctl.io/cordon-reason") == REASON


class Recorder(ChangeUI):
    def __init__(self):
        self.lines: list[str] = []
        self.held_trays: list[str] = []

    def note(self, text):
        self.lines.append(text)

    def warn(self, text):
        self.lines.append("warning: " + text)

    def confirm(self, cp, breaks):
        self.lines.append("confirm: " + breaks)
        return True

    def held(self, held, refused, busy, seconds):
        self.held_trays = list(held)


class Counting(KubeClient):
    def __init__(self, conn):
        super().__init__(conn)
        self.requests: list[str] = []

    def _request(self, method, path, body=None, content_type="application/json"):
        self.requests.append(f"{method} {path}")
        return super()._request(method, path, body, content_type)


def _evictions(writes: list[str], code: int | None = None) -> list[str]:
    return [w for w in writes if "/eviction " in w and (code is None or w.endswith(f" {code}"))]


# ------------------------------------------------------------------ the work on the trays: one list call

def test_the_pods_on_the_trays_are_found_with_one_list_call(tmp_path, kube, site):
    client = Counting(kubeconfig.load(tmp_path / "kube" / "config"))
    pods = k8s_pod_objects(client, TRAYS[2:])
    assert client.requests == ["GET /api/v1/pods?fieldSelector=spec.nodeName%21%3D%2Cstatus.phase%21%3DSucceeded"
                               "%2Cstatus.phase%21%3DFailed&limit=500"]
    assert sorted(p["metadata"]["name"] for p in pods) == ["burn-x1", "train-0", "train-1", "web-0"]
    one = Counting(client.conn)
    assert [p["metadata"]["name"] for p in k8s_pod_objects(one, [TRAYS[0]])] == ["other-0"]
    assert one.requests == ["GET /api/v1/pods?fieldSelector=spec.nodeName%3Dr1-tray01%2Cstatus.phase%21%3DSucceeded"
                            "%2Cstatus.phase%21%3DFailed&limit=500"]
    # pages: the server's continue token is followed to the end
    paged = Counting(client.conn)
    assert len(paged.list("Pod", field_selector="spec.nodeName!=", limit=2)) == 5 and len(paged.requests) == 3
    # the work: GPU pods only, as API objects named namespace/name
    work = {w.id: w for w in k8s_pods(site, TRAYS[2:])}
    assert sorted(work) == ["default/burn-x1", "default/train-0", "default/train-1"]
    assert work["default/train-0"].nodes == (TRAYS[2],) and work["default/train-0"].why == "4 nvidia.com/gpu"
    assert work["default/train-0"].state == "Running"
    assert kube.writes() == []


# ------------------------------------------------------------------ --drain

def test_drain_cordons_evicts_through_the_budget_and_waits_until_gone(kube, site):
    add_budget(kube, "train-pdb", {"app": "train"}, 1)
    set_budget_status(kube, "train-pdb", allowed=1, healthy=2, desired=1, expected=2)
    cp = change_of(site)
    assert cp.affected == tuple(TRAYS[2:]) and ch.decide(cp, drain=True, force=False) == ch.DRAIN
    ui = Recorder()
    kube.mark()
    with Kubelet(kube) as kubelet:
        # the budget allows one disruption: the first eviction goes, the second waits for the budget to
        # allow another, as the disruption controller says once train-0 is gone (played here)
        def controller():
            wait_for("train-0 evicted", lambda: "train-0" in kubelet.finished, 30, every=0.05)
            set_budget_status(kube, "train-pdb", allowed=1, healthy=1, desired=0, expected=1)
        thread = threading.Thread(target=controller)
        thread.start()
        held = gate(site, cp, ChangeRequest("apply", rack="r1", drain=True, wait=30), ui)
        thread.join(35)
    assert held == TRAYS[2:] and ui.held_trays == TRAYS[2:]
    assert all(cordoned(kube, t) for t in TRAYS[2:]) and not cordoned(kube, TRAYS[0])
    taints = kube.node(TRAYS[2])["spec"]["taints"]
    assert {"key": "mctl.io/partition-change", "effect": "NoSchedule"} in taints
    # the GPU pods are gone; the DaemonSet's, the pod without GPUs and the other tray's stay
    assert pod_names(kube) == ["burn-x1", "other-0", "web-0"]
    writes = kube.writes()
    assert writes[:2] == [f"patch /api/v1/nodes/{t} 200" for t in TRAYS[2:]]
    assert _evictions(writes, 201) == [f"create /api/v1/namespaces/default/pods/{p}/eviction 201"
                                       for p in ("train-0", "train-1")]
    assert not [w for w in writes if w.startswith("delete")]            # evicted, never deleted by mctl
    # the change's release lifts exactly its cordon and taint
    kube.mark()
    assert evict.release(site, held, REASON) == {}
    for t in TRAYS[2:]:
        node = kube.node(t)
        assert not node["spec"].get("unschedulable") and not node["spec"].get("taints")
        assert not any(k.startswith("mctl.io/cordon") for k in node["metadata"].get("annotations") or {})
    assert kube.writes() == [f"patch /api/v1/nodes/{t} 200" for t in TRAYS[2:]]


def test_a_budget_that_keeps_refusing_stops_the_change_at_the_deadline_and_names_it(kube, site):
    add_budget(kube, "train-pdb", {"app": "train"}, 2)
    set_budget_status(kube, "train-pdb", allowed=0, healthy=2, desired=2, expected=2)
    cp = change_of(site)
    kube.mark()
    with Kubelet(kube), pytest.raises(PartialFailure) as exc:
        gate(site, cp, ChangeRequest("apply", rack="r1", drain=True, wait=3), Recorder())
    msg = exc.value.message
    assert "could not all be evicted within 3s" in msg
    assert "default/train-0 is kept by a PodDisruptionBudget: The disruption budget train-pdb needs 2 healthy pods " \
           "and has 2 currently" in msg and "default/train-1" in msg
    assert "nothing was changed, and the cordons are lifted again" in msg and "relax the PodDisruptionBudget" in \
        exc.value.hint
    # every node as it was, every pod still there
    assert not any(kube.node(t)["spec"].get("unschedulable") for t in TRAYS)
    assert pod_names(kube) == ["burn-x1", "other-0", "train-0", "train-1", "web-0"]
    writes = kube.writes()
    assert len(_evictions(writes, 429)) >= 4 and not _evictions(writes, 201)      # asked again, refused each time
    assert [w for w in writes if w.startswith("patch")] == [f"patch /api/v1/nodes/{t} 200" for t in TRAYS[2:]] * 2


def test_without_drain_or_force_pods_refuse_the_change(kube, site):
    from mctl.change.service import WorkRefused

    with pytest.raises(WorkRefused) as exc:
        gate(site, change_of(site), ChangeRequest("apply", rack="r1"), Recorder())
    assert "pod default/train-0" in exc.value.message and "--drain" in exc.value.hint
    assert kube.writes() == []


# ------------------------------------------------------------------ --force

def test_force_says_what_breaks_then_deletes_without_asking_the_budget(kube, site):
    add_budget(kube, "train-pdb", {"app": "train"}, 2)
    set_budget_status(kube, "train-pdb", allowed=0, healthy=2, desired=2, expected=2)
    cp = change_of(site)
    ui = Recorder()
    kube.mark()
    with Kubelet(kube):
        held = gate(site, cp, ChangeRequest("apply", rack="r1", force=True, yes=True), ui)
    said = "\n".join(ui.lines)
    first_warning = next(ln for ln in ui.lines if ln.startswith("warning: --force"))
    assert "pod default/train-0" in first_warning and "PodDisruptionBudgets not asked" in first_warning
    assert ui.lines.index(first_warning) < next(i for i, ln in enumerate(ui.lines) if ln.startswith("confirm:"))
    assert "deleted default/train-0, default/train-1" in said
    assert "left (DaemonSet pods" in said and "burn-x1" in said
    assert held == TRAYS[2:] and all(cordoned(kube, t) for t in TRAYS[2:])
    assert pod_names(kube) == ["burn-x1", "other-0", "web-0"]
    writes = kube.writes()
    assert [w for w in writes if w.startswith("delete")] == [f"delete /api/v1/namespaces/default/pods/{p} 200"
                                                             for p in ("train-0", "train-1")]
    assert not _evictions(writes)
    evict.release(site, held, REASON)


def test_force_not_confirmed_changes_nothing(kube, site):
    with pytest.raises(UsageError, match="not confirmed"):
        gate(site, change_of(site), ChangeRequest("apply", rack="r1", force=True), ChangeUI())
    assert kube.writes() == []


# ------------------------------------------------------------------ an API server that answers 429/5xx or nothing

def test_429_5xx_and_dropped_answers_are_asked_again_within_the_deadline(kube, flaky_site, proxy):
    cp = change_of(flaky_site)
    proxy.fail("GET /api/v1/pods?", [503])                 # the first listing of the drain
    proxy.fail("PATCH /api/v1/nodes/r1-tray04", [500])     # its cordon
    proxy.fail("/eviction", [429, 503, "stall", 504])      # its evictions
    kube.mark()
    with Kubelet(kube):
        held = gate(flaky_site, cp, ChangeRequest("apply", rack="r1", drain=True, wait=30), Recorder())
    assert held == TRAYS[2:] and all(cordoned(kube, t) for t in TRAYS[2:])
    assert pod_names(kube) == ["burn-x1", "other-0", "web-0"]
    assert _evictions(kube.writes(), 201) == [f"create /api/v1/namespaces/default/pods/{p}/eviction 201"
                                              for p in ("train-0", "train-1")]
    assert sum("/eviction" in s for s in proxy.seen) == 6           # four not-nows, then one each
    evict.release(flaky_site, held, REASON)


def test_an_api_server_that_keeps_failing_stops_the_drain_with_every_node_as_it_was(kube, flaky_site, proxy):
    cp = change_of(flaky_site)
    proxy.fail("/eviction", "503")
    kube.mark()
    with pytest.raises(PartialFailure) as exc:
        gate(flaky_site, cp, ChangeRequest("apply", rack="r1", drain=True, wait=2), Recorder())
    assert "injected by the test's proxy (503)" in exc.value.message
    assert "nothing was changed, and the cordons are lifted again" in exc.value.message
    assert not any(kube.node(t)["spec"].get("unschedulable") for t in TRAYS)
    assert pod_names(kube) == ["burn-x1", "other-0", "train-0", "train-1", "web-0"]
    assert not _evictions(kube.writes())


# ------------------------------------------------------------------ the labels step

def _ctx(site, tmp_path, **spec_kw) -> cr._Ctx:
    """The change (p1 renamed p2) as its journaled run holds it just before the labels step, the GPUs' cliques
    as its cliques step read them (p2 got a new clique)."""
    spec = cr.ChangeSpec.of("r1", "apply", BEFORE, AFTER, **spec_kw)
    journal = cr.ChangeJournal.create(tmp_path / "state", site.name, str(site.file), "r1", list(ch.STEPS),
                                      list(ch.STEPS), {})
    journal.data["change"] = spec.to_dict()
    journal.start(ch.CLIQUES)
    journal.finish_outcome(ch.CLIQUES, cr.Outcome("done", "read", artifacts={"labels": {
        TRAYS[0]: f"{CLIQUE}.1", TRAYS[1]: f"{CLIQUE}.1", TRAYS[2]: f"{CLIQUE}.3", TRAYS[3]: f"{CLIQUE}.3"}}))
    return cr._Ctx(site, spec, journal, cr.Report())


def _labels(kube) -> dict[str, tuple[str, str]]:
    out = {}
    for t in TRAYS:
        lab = kube.node(t)["metadata"]["labels"]
        out[t] = (lab.get("mctl.io/nvlink-partition"), lab.get("nvidia.com/gpu.clique"))
    return out


def test_the_labels_step_moves_partition_and_clique_labels_and_reads_them_back(kube, site, tmp_path):
    before = _labels(kube)
    out = cr._labels(_ctx(site, tmp_path))
    assert out.status == "done" and out.changed and "read back" in out.summary
    assert _labels(kube) == {**before, TRAYS[2]: ("r1-p2", f"{CLIQUE}.3"), TRAYS[3]: ("r1-p2", f"{CLIQUE}.3")}
    assert f"{TRAYS[2]}: mctl.io/nvlink-partition r1-p1 -> r1-p2" in out.details
    assert kube.writes() == [f"patch /api/v1/nodes/{t} 200" for t in TRAYS[2:]]       # one patch per moved node
    kube.mark()
    again = cr._labels(_ctx(site, tmp_path))                                         # nothing left to move
    assert not again.changed and kube.writes() == []


def test_a_labels_step_that_fails_half_way_is_rolled_back_to_nothing_half_labelled(kube, flaky_site, proxy, tmp_path):
    before = _labels(kube)
    proxy.fail(f"PATCH /api/v1/nodes/{TRAYS[3]}", "503")
    ctx = _ctx(flaky_site, tmp_path, labels_wait=2.0)
    with pytest.raises(EnvironmentProblem) as exc:
        cr._labels(ctx)
    assert f"labelling Node {TRAYS[3]}: the Kubernetes API kept failing until the deadline" in exc.value.message
    assert _labels(kube)[TRAYS[2]] == ("r1-p2", f"{CLIQUE}.3")               # half-labelled, for now
    # the run's rollback: undo-cliques read the GPUs back in their clique, then undo-labels (the API answers again)
    proxy.clear()
    cr._begin_rollback(ctx.journal, ch.LABELS, exc.value)
    undo = [p["name"] for p in ctx.journal.data["phases"] if p["name"].startswith(ch.UNDO)]
    assert undo.index("undo-cliques") < undo.index("undo-labels")
    ctx.journal.start("undo-cliques")
    ctx.journal.finish_outcome("undo-cliques", cr.Outcome("done", "read", artifacts={"labels": {
        t: before[t][1] for t in TRAYS}}))
    ctx.undo = True
    back = cr._labels(ctx)
    assert back.status == "done" and "read back" in back.summary
    assert _labels(kube) == before
