"""`mctl rack bring-up`: a new rack from racked hardware to schedulable, resumably (docs/bringup.md).

Public API:
    mctl.bringup.service.bring_up(site, rack, state_dir, options, resume=False, report=None) -> BringUpResult
    mctl.bringup.service.plan_bring_up(site, rack, state_dir, options) -> list[PlannedPhase]
    mctl.bringup.context.Options, Reporter, PHASES
    mctl.bringup.journal.Journal (runs(state_dir, rack), latest(...), load(path))
"""
