"""Every option and argument more than one command takes, defined once (pip's cmdoptions).

A flag means one thing in every command: one name, one help text, one type. A command that takes
one of these uses the definition here, never one of its own (tests/unit/test_cli_options.py walks
every command and fails on a flag with two meanings, or one defined inline that is defined here).
Where a command's default differs (a deadline read from the inventory), its own help text says so.
See docs/decisions.md (D65) for the flags that had two meanings and what each one means now.
"""

import math
from pathlib import Path
from typing import Annotated, Any, List, Optional

import typer

try:  # typer >= 0.22 carries its own copy of click
    from typer._click.types import FloatRange
except ImportError:  # pragma: no cover - older typer on click
    from click.types import FloatRange


class FiniteFloat(FloatRange):
    """The one float type of mctl's options: a finite number within optional bounds.

    click's FloatRange lets NaN through every bound (all comparisons with NaN are false)
    and takes 'inf'; a NaN deadline never expires and makes every healthy tray look hung.
    """

    def __init__(self, min: float | None = None, max: float | None = None):
        super().__init__(min=min, max=max)
        if min is None and max is None:
            self.name = "float"             # help shows <float>, as for a plain float option

    def _describe_range(self) -> str:
        return "" if self.min is None and self.max is None else super()._describe_range()

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        number = super().convert(value, param, ctx)
        if isinstance(number, float) and not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number (NaN and infinity are refused).", param, ctx)
        return number


def finite(min: float | None = None, max: float | None = None) -> FiniteFloat:
    """click_type for a float option: `typer.Option("--timeout", click_type=finite(min=1.0))`."""
    return FiniteFloat(min=min, max=max)


# ------------------------------------------------------------------ output and safety

JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")]
DryRunOpt = Annotated[bool, typer.Option("--dry-run", help="Print the plan and change nothing.")]
YesOpt = Annotated[bool, typer.Option("--yes", "-y", help="Do not ask: go ahead without a confirmation (needed "
                                                          "where there is no terminal to ask on).")]
ForceOpt = Annotated[bool, typer.Option("--force", help="Go ahead although work runs on the trays (Slurm jobs, GPU "
                                                        "pods) or cannot be read: the work is named, and broken.")]

# ------------------------------------------------------------------ which trays and racks

NodesArg = Annotated[str, typer.Argument(metavar="NODESET", help="A node set, a rack name or an @group (@all, "
                                                                 "@compute, @head, @RACK).", show_default=False)]
TargetArg = Annotated[Optional[str], typer.Argument(metavar="[NODESET|RACK]",
                                                    help="A node set, a rack name or an @group (default: every "
                                                         "tray the command acts on).", show_default=False)]
RackArg = Annotated[str, typer.Argument(metavar="RACK", help="Rack name (see 'mctl inventory show').",
                                        show_default=False)]
OneRackArg = Annotated[Optional[str], typer.Argument(metavar="[RACK]", help="Only this rack (default: every rack).",
                                                     show_default=False)]
RacksArg = Annotated[Optional[List[str]], typer.Argument(metavar="[RACK]...", help="Rack names (see 'mctl inventory "
                                                         "show'), or --all.", show_default=False)]
AllRacksOpt = Annotated[bool, typer.Option("--all", help="Every rack of the inventory.")]
TraysOpt = Annotated[Optional[str], typer.Option("--trays", metavar="NODESET",
                                                 help="Trays: a node set (e.g. rack-a-tray[01-09]).")]

# ------------------------------------------------------------------ deadlines and waits

TimeoutOpt = Annotated[Optional[float], typer.Option(
    "--timeout", "-t", click_type=finite(min=1.0), metavar="SECONDS",
    help="Deadline for each tray (or host) on its own: its probe, command or BMC reads; the default is the "
         "command's (see above).")]
DeadlineOpt = Annotated[Optional[float], typer.Option(
    "--deadline", click_type=finite(min=1.0),
    help="Seconds each stage may take to report its state (Redfish and SSH; default 600).")]
GracefulOpt = Annotated[Optional[float], typer.Option(
    "--graceful-wait", click_type=finite(min=0.0),
    help="Seconds a GracefulShutdown may take before ForceOff (default 60).")]
ImexWaitOpt = Annotated[float, typer.Option("--imex-wait", click_type=finite(min=0),
                                            help="Seconds to wait for the IMEX domains to be UP (0: do not wait).")]

# ------------------------------------------------------------------ running work on the trays (issue 27)

DrainOpt = Annotated[bool, typer.Option("--drain", help="When jobs run on the trays the change disrupts: hold those "
                                                        "trays in Slurm (reason 'mctl: partition change ...', "
                                                        "'mctl: provision ...'), wait for the jobs to end (--wait), "
                                                        "then go on.")]
WaitOpt = Annotated[Optional[float], typer.Option("--wait", click_type=finite(min=0.0), metavar="SECONDS",
                                                  help="With --drain: how long to wait for the jobs on the held "
                                                       "trays (default 600).")]

# ------------------------------------------------------------------ runs, snapshots, findings

ResumeOpt = Annotated[bool, typer.Option("--resume", help="Continue the rack's last run that did not finish, from "
                                                          "the step it stopped at (its journal says which).")]
SnapshotDiffOpt = Annotated[bool, typer.Option("--diff", help="Show what changed since the last snapshot.")]
NoHistoryOpt = Annotated[bool, typer.Option("--no-history", help="Do not record this run in the history.")]
NoSaveOpt = Annotated[bool, typer.Option("--no-save", help="Do not store this run as a snapshot.")]
FailOnOpt = Annotated[str, typer.Option("--fail-on", help="Exit 1 when a finding is at or above: warn|critical.")]
PassedOpt = Annotated[bool, typer.Option("--passed", help="List passed checks too.")]
RemediateOpt = Annotated[Optional[bool], typer.Option(
    "--remediate/--no-remediate",
    help="Drain and resume trays through the scheduler, as the watch does (default: health.remediate in the "
         "watch; off in a one-off check).")]

# ------------------------------------------------------------------ the partition commands (cli/partition.py)

NmxOnlyOpt = Annotated[bool, typer.Option("--nmx-only", help="Change the inventory and NMX-M only, not journaled: "
                                                             "IMEX, Slurm and the labels are left behind ('mctl "
                                                             "audit' names them), as before issue 18.")]
NoApplyOpt = Annotated[bool, typer.Option("--no-apply", help="Change the inventory only, not NMX-M.")]
ByLocationOpt = Annotated[bool, typer.Option("--by-location", help="Create partitions with location members "
                                             "(domain, chassis, slot, host, device) instead of GPU IDs.")]

# ------------------------------------------------------------------ the lab (cli/lab.py)

LabDirOpt = Annotated[Optional[Path], typer.Option("--dir", envvar="MCTL_LAB_DIR", show_envvar=False,
                                                   help="Lab folder (default <state dir>/lab).")]
HangOpt = Annotated[bool, typer.Option("--hang", help="The fault's target takes connections and answers nothing "
                                                      "(open connections too): logins work and commands never "
                                                      "return on a host, requests are never answered by a BMC.")]
SlowOpt = Annotated[Optional[float], typer.Option("--slow", metavar="SECONDS", click_type=finite(min=0),
                                                  help="The fault's target answers SECONDS late: every command "
                                                       "of a host starts late, every request of a BMC.")]
