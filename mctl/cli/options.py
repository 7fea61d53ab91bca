"""Option types reused by several commands."""

from typing import Annotated

import typer

JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")]
DryRunOpt = Annotated[bool, typer.Option("--dry-run", help="Print the plan and change nothing.")]
