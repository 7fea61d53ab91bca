"""mctl deploy slurm|k8s: put a scheduler on the racks, derived from the inventory and its partitions."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from mctl.cli import render
from mctl.cli.context import options
from mctl.cli.options import DryRunOpt, JsonOpt
from mctl.cli.provision import host_failure
from mctl.errors import EXIT_PARTIAL

app = typer.Typer(help="Deploy the site's scheduler: Slurm (daemons, blocks from NVLink partitions) or Kubernetes.\n\n"
                       "Example: mctl -i inventories/lab deploy slurm --dry-run",
                  no_args_is_help=True)


@app.command("slurm")
def slurm(
    topology_only: Annotated[bool, typer.Option("--topology-only",
                                                help="Only topology.conf (after a partition change), then "
                                                     "'scontrol reconfigure'.")] = False,
    no_verify: Annotated[bool, typer.Option("--no-verify", help="Do not wait for the trays to register.")] = False,
    dry_run: DryRunOpt = False,
    json_: JsonOpt = False,
) -> None:
    """Deploy Slurm: slurm.conf, gres.conf, cgroup.conf and topology.conf, the MUNGE key, the daemons.

    Node lines come from 'slurmd -C' on every tray, GPUs from the rack model, one
    topology block per NVLink partition (a rack without partitions is one block).
    Then the controller must show every tray registered and the blocks equal to the
    partitions. --dry-run shows the rendered files and their diff against the hosts.
    Exit 2 for bad input (nothing changed), 3 when hosts failed or did not register.

    Example: mctl -i inventories/lab deploy slurm --dry-run
    """
    from mctl.sched.slurm import apply, dry_run as diff_hosts, plan_slurm

    from mctl.cli.locking import hold_racks
    from mctl.sched.site import check_scheduler

    opts = options()
    site = opts.site()
    check_scheduler(site, "slurm")                  # a wrong command is refused before any state is touched
    hold_racks(list(site.racks), "deploy slurm", dry_run=dry_run)    # before it asks a tray or prints
    out = render.output(json_)
    plan = plan_slurm(site, opts.state_dir, topology_only=topology_only)
    _print_plan(out, plan)
    if dry_run:
        diff = diff_hosts(plan)
        out.result({"dry_run": True, "plan": plan.to_dict(), "diff": diff.to_dict()},
                   lambda: _print_diff(out, plan, diff))
        return
    result = apply(plan, on_event=lambda ev: host_failure(out, ev), verify=not no_verify, locked=True)
    out.result(result.to_dict(), lambda: _print_result(out, result))
    if result.run.status == "canceled":
        raise typer.Exit(130)
    if result.run.failed_hosts or result.run.status != "successful" or (
            result.verification is not None and not result.verification.ok):
        raise typer.Exit(EXIT_PARTIAL)


def _print_plan(out: render.Output, plan) -> None:
    from mctl.model.site import fold

    cfg = plan.config
    out.line(f"Slurm {cfg.version} on {cfg.controller.name} (slurmctld); {len(cfg.nodes)} trays {fold(cfg.nodes)}")
    sizes = f", BlockSizes={','.join(map(str, cfg.block_sizes))}" if cfg.block_sizes else ""
    out.line(f"topology/{cfg.plugin}: {len(cfg.blocks)} block(s){sizes}{'; switch/nvidia_imex' if cfg.imex else ''}")
    for b in cfg.blocks:
        why = {"partition": f"NVLink partition {b.partition}", "rack": "whole rack (no partitions)",
               "unpartitioned": "trays in no partition (fabric default partition)"}[b.kind]
        out.line(f"  {b.name:<24} {b.nodeset:<32} {b.size:>3} trays  {why}")
    for w in cfg.warnings:
        out.warn(w, in_result=True)


def _print_diff(out: render.Output, plan, diff) -> None:
    from mctl.model.site import fold

    for f in diff.files:
        where = f"{fold(f.hosts)} ({len(f.hosts)})"
        if f.status == "same":
            out.line(f"{f.path}: unchanged on {where}")
        elif f.status == "unreachable":
            out.line(f"{f.path}: unknown on {where}: unreachable")
        else:
            out.line(f"{f.path}: {'new' if f.status == 'new' else 'changes'} on {where}")
            out.verbatim(f.diff.rstrip("\n"))
    key = diff.munge
    if key.get("would-create"):
        out.line(f"MUNGE key: a new site key would be made ({plan.key_path}) and installed on "
                 f"{fold(key['would-create'])}")
    for state, text in (("missing", "would be installed on"), ("differs", "differs, would be replaced on"),
                        ("same", "already in place on")):
        if key.get(state):
            out.line(f"MUNGE key {text} {fold(key[state])}")
    out.line(f"{diff.changes} change(s); nothing changed (--dry-run)")


def _print_result(out: render.Output, result) -> None:
    from mctl.model.site import fold

    run = result.run
    changed = sorted(h for h, r in run.hosts.items() if r.changed)
    out.line(f"playbook {run.run_id}: {run.status} in {run.ended - run.started:.1f}s; "
             f"changed {fold(changed) if changed else 'nothing'}")
    if result.key_created:
        out.line(f"MUNGE key made for the site: {result.plan.key_path} (0600)")
    for name in run.failed_hosts:
        r = run.hosts[name]
        out.line(f"{name}: {r.status} at task '{r.failed_task}': {r.message}")
    v = result.verification
    if v is not None:
        if v.ok:
            drained = f" ({len(v.drained)} drained: {fold(v.drained)})" if v.drained else ""
            out.line(f"verified in {v.seconds:.0f}s: all {len(v.nodes)} trays registered{drained}; "
                     f"{v.topology_plugin} blocks match the partitions ({len(v.blocks_found)})")
        else:
            for p in v.problems():
                out.error(p)
    out.line(f"run folder: {run.run_dir}")


@app.command("k8s")
def k8s(
    render_dir: Annotated[Optional[Path], typer.Option("--render", metavar="DIR",
                                                       help="Write the manifests, Helm values and install script to "
                                                            "DIR; touch no cluster.")] = None,
    kubeconfig: Annotated[Optional[Path], typer.Option("--kubeconfig", metavar="PATH",
                                                       help="Kubeconfig (default: scheduler.k8s.kubeconfig, "
                                                            "KUBECONFIG, ~/.kube/config).")] = None,
    context: Annotated[Optional[str], typer.Option("--context", help="Kubeconfig context to use.")] = None,
    no_tray_check: Annotated[bool, typer.Option("--no-tray-check",
                                                help="Do not read the trays' host nvidia-imex service over SSH "
                                                     "before the apply (said in the output; `mctl audit` "
                                                     "checks it too).")] = False,
    dry_run: DryRunOpt = False,
    json_: JsonOpt = False,
) -> None:
    """Kubernetes for GB200: GPU Operator and DRA driver values, labels, ComputeDomains, KAI topology.

    With --render DIR everything an operator needs is written (Helm values and an
    install script, node labels, one ComputeDomain and one example Job per NVLink
    partition, the KAI Scheduler Topology). Without it the labels, ComputeDomains
    and Topology are applied through the Kubernetes API, after checks that change
    nothing when they fail: among them every tray's host nvidia-imex service, read
    over SSH, which must be stopped and disabled where the DRA driver's
    ComputeDomains run IMEX (a tray that runs it or has it enabled is named with
    the fix and nothing is applied; --no-tray-check skips the read). Exit 2 for bad
    input or a cluster not ready, 3 when the API cannot be reached or a write failed.

    Example: mctl -i inventories/example-gb200 deploy k8s --render out/k8s
    """
    from mctl.sched.k8s import KubeClient, apply_k8s, plan_k8s, render_k8s
    from mctl.sched.k8s import kubeconfig as kc
    from mctl.sched.site import check_scheduler

    opts = options()
    site = opts.site()
    out = render.output(json_)
    check_scheduler(site, "k8s")
    from mctl.cli.locking import hold_racks

    hold_racks(list(site.racks), "deploy k8s", dry_run=dry_run)     # before it writes, asks or prints
    bundle = render_k8s(site)
    for w in bundle.warnings:
        out.warn(w, in_result=True)
    if render_dir is not None:
        if no_tray_check:
            from mctl.errors import UsageError

            raise UsageError("--no-tray-check goes with the apply: --render reads no tray and writes no cluster",
                             hint="drop --no-tray-check, or --render")
        written = [] if dry_run else _write_bundle(bundle, render_dir)
        out.result({"dry_run": dry_run, "dir": str(render_dir), **bundle.to_dict()},
                   lambda: out.lines([f"{'would write' if dry_run else 'wrote'} {render_dir / rel}"
                                      for rel in sorted(bundle.files)]
                                     + ([] if dry_run else [f"{len(written)} files; next: see "
                                                            f"{render_dir / 'README.md'}"])))
        return
    settings = site.scheduler.k8s         # check_scheduler: a k8s site
    path = kubeconfig or ((site.root / settings.kubeconfig) if settings.kubeconfig else kc.default_path())
    client = KubeClient(kc.load(path, context or settings.context))
    host_imex = _host_imex(site, out, skip=no_tray_check)
    plan = plan_k8s(bundle, client)
    if not dry_run:
        apply_k8s(plan, client)
    out.result({"dry_run": dry_run, "host_imex": host_imex, **plan.to_dict()},
               lambda: _print_k8s_plan(out, plan, dry_run, host_imex))


def _host_imex(site, out: render.Output, *, skip: bool) -> dict:
    """The trays' host nvidia-imex service, before anything is written: one that runs or is enabled beside the
    DRA driver's ComputeDomains is refused (exit 2) with the fix; a tray that could not be read is said."""
    from mctl.audit.collect import read_host_imex
    from mctl.errors import MctlError

    trays = [h for r in site.racks.values() for h in r.compute]
    if skip:
        out.warn("host nvidia-imex service not checked on the trays (--no-tray-check); `mctl audit` checks it",
                 in_result=True)
        return {"checked": 0, "skipped": "--no-tray-check", "conflicts": [], "unread": {}}
    got = read_host_imex(site, trays)
    if got.conflicts:
        named = "; ".join(f"{f.host}: {f.message.split(' while ')[0].removeprefix('the ')}" for f in got.conflicts[:6])
        more = f" (+{len(got.conflicts) - 6} more)" if len(got.conflicts) > 6 else ""
        raise MctlError(f"{len(got.conflicts)} tray(s) run the host IMEX service where the DRA driver's "
                        f"ComputeDomains manage IMEX: {named}{more}; nothing was applied",
                        hint=got.conflicts[0].action)
    for host, why in sorted(got.unread.items()):
        out.warn(f"{host}: host nvidia-imex service not checked: {why}", in_result=True)
    return {"checked": len(got.findings), "skipped": None, "conflicts": [],
            "unread": dict(sorted(got.unread.items()))}


def _print_k8s_plan(out: render.Output, plan, dry_run: bool, host_imex: dict) -> None:
    out.line(f"Kubernetes {plan.server_version} at {plan.server} (context {plan.context})")
    if host_imex["skipped"] is None:
        unread = f", {len(host_imex['unread'])} not read" if host_imex["unread"] else ""
        out.line(f"host IMEX: off on the {host_imex['checked']} tray(s) read (the DRA driver runs IMEX){unread}")
    for w in plan.warnings:
        out.warn(w)
    verb = {"create": "would create" if dry_run else "created", "update": "would update" if dry_run else "updated",
            "unchanged": "unchanged", "skip": "skipped"}
    for c in plan.changes:
        where = f"{c.namespace}/" if c.namespace else ""
        out.line(f"  {verb[c.action]:<13} {c.kind} {where}{c.name}{'  ' + c.detail if c.detail else ''}")
    out.line(f"{len(plan.pending)} change(s){'; nothing changed (--dry-run)' if dry_run else ''}")


def _write_bundle(bundle, folder: Path) -> list[Path]:
    from mctl.state import atomic_write

    out = []
    for rel, text in sorted(bundle.files.items()):
        out.append(atomic_write(folder / rel, text, mode=0o755 if rel.endswith(".sh") else 0o644))
    return out
