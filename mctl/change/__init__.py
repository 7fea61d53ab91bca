"""The change service: one conductor for every partition change (layer 3).

    mctl.change.request   ChangeRequest: which command (create, apply, delete, isolate, restore, resume), on what,
                          with which consent (--drain, --force, --yes)
    mctl.change.ui        ChangeUI: what the change shows and asks (the CLI's terminal; SilentUI for the watch)
    mctl.change.service   execute(): the lock, the plans, the jobs rule, the run, the result
    mctl.change.commands  each command's own plan (the inventory edit, the NMX-M plan) and the paths that skip
                          the journaled run (--no-apply, --nmx-only)
    mctl.change.plan      the cross-layer plan: NMX-M, IMEX, Slurm blocks, Kubernetes labels, the work on the trays
    mctl.change.run       the journaled run across every layer, its rollback and its resume

See docs/architecture.md, "The path of one partition change".
"""
