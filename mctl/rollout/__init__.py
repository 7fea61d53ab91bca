"""Provisioning that never breaks running work without consent, and rolling changes (layer 3).

    mctl.rollout.request   ProvisionRequest: the consent (--drain, --wait, --force, --yes), --rolling N, --resume
    mctl.rollout.ui        RolloutUI: what provisioning shows and asks (the CLI's terminal; silent by default)
    mctl.rollout.service   execute(): the work on the trays, the check pass, the jobs rule, then the plain run or
                           the journaled rollout, and the result
    mctl.rollout.run       the journaled rollout: batches of trays held, drained, provisioned, rebooted, verified
                           and released; its resume
    mctl.rollout.tray      one tray's reboot and verification over SSH (image diff, the node check)

It composes provisioning (mctl.provision), the scheduler (mctl.sched: the work, the holds) and the
audit's image diff, so it sits above them, as the partition change service (mctl.change) does.
See docs/provisioning.md ("Running work") and docs/decisions.md (D71-D74).
"""
