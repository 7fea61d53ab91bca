"""Option types reused by several commands."""

import math
from typing import Annotated, Any

import typer

try:  # typer >= 0.22 carries its own copy of click
    from typer._click.types import FloatRange
except ImportError:  # pragma: no cover - older typer on click
    from click.types import FloatRange

JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")]
DryRunOpt = Annotated[bool, typer.Option("--dry-run", help="Print the plan and change nothing.")]


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
