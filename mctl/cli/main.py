"""Root command, global options and the one error boundary.

Noun modules are imported here but keep their heavy imports (asyncssh,
ansible-runner, pydantic) inside command bodies, and only the invoked noun's
command tree is built, so `mctl --help` stays fast.
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from mctl import __version__
from mctl.cli import render
from mctl.cli.context import DEFAULT_STATE_DIR, Options, set_options
from mctl.cli.options import JsonOpt
from mctl.errors import EXIT_INTERNAL, EXIT_USAGE, MctlError

try:  # typer >= 0.22 carries its own copy of click
    from typer._click import exceptions as _cx
except ImportError:  # pragma: no cover - older typer on click
    from click import exceptions as _cx

# (command name, module); each module exposes `app` (a Typer) or `command` (a function).
NOUNS: tuple[tuple[str, str], ...] = (
    ("inventory", "mctl.cli.inventory"),
    ("lab", "mctl.cli.lab"),
    ("provision", "mctl.cli.provision"),
    ("image", "mctl.cli.image"),
    ("exec", "mctl.cli.exec_"),
    ("ssh", "mctl.cli.ssh"),
    ("rack", "mctl.cli.rack"),
    ("partition", "mctl.cli.partition"),
    ("imex", "mctl.cli.imex"),
    ("deploy", "mctl.cli.deploy"),
    ("health", "mctl.cli.health"),
    ("node", "mctl.cli.node"),
    ("audit", "mctl.cli.audit"),
    ("bmc", "mctl.cli.bmc"),
    ("power", "mctl.cli.power"),
)

ROOT_HELP = ("Manage NVIDIA GB200/GB300 NVL72 racks: inventory, provisioning, NVLink partitions, "
             "IMEX, schedulers and self-healing health checks.\n\n"
             "Example: mctl -i inventories/example-gb200 inventory show")
# Root options that take a value, so the invoked noun can be found in argv.
_VALUE_OPTIONS = {"-i", "--inventory", "--state-dir"}


def _version(value: bool) -> None:
    if value:
        render.write(f"mctl {__version__}\n")
        raise typer.Exit()


def root(
    inventory: Annotated[Optional[str], typer.Option("--inventory", "-i", envvar="MCTL_INVENTORY",
                                                     help="Inventory directory or mctl.yml file.")] = None,
    json_out: JsonOpt = False,
    verbose: Annotated[int, typer.Option("--verbose", "-v", count=True, help="More detail; repeat for more.")] = 0,
    state_dir: Annotated[Optional[Path], typer.Option("--state-dir", envvar="MCTL_STATE_DIR",
                                                      help=f"State directory (default {DEFAULT_STATE_DIR}).")] = None,
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
) -> None:
    opts = Options(inventory=inventory, json=json_out, verbose=verbose)
    if state_dir is not None:
        opts.state_dir = state_dir
    set_options(opts)


def invoked_noun(args: list[str]) -> str | None:
    """The noun this command line runs, or None (help, version, a typo)."""
    skip = False
    for arg in args:
        if skip:
            skip = False
            continue
        if arg in _VALUE_OPTIONS:
            skip = True
            continue
        if arg.startswith("-"):
            continue
        return arg
    return None


def build_app(args: list[str] | None = None) -> typer.Typer:
    """The root command with every noun.

    Only the noun being run gets its full command tree; the others are
    registered by name and help text alone, because turning every noun's tree
    into click commands is most of the start-up time. Shell completion, which
    walks the whole tree, gets everything.
    """
    app = typer.Typer(name="mctl", help=ROOT_HELP,
                      context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
                      no_args_is_help=True, pretty_exceptions_enable=False, rich_markup_mode=None,
                      add_completion=True)
    app.callback()(root)
    wanted = None if args is None or "_MCTL_COMPLETE" in os.environ else invoked_noun(args)
    full = args is None or "_MCTL_COMPLETE" in os.environ
    for name, module_name in NOUNS:
        module = importlib.import_module(module_name)
        if full or name == wanted:
            if hasattr(module, "app"):
                app.add_typer(module.app, name=name)
            else:
                app.command(name=name, **getattr(module, "COMMAND_SETTINGS", {}))(module.command)
        elif hasattr(module, "app"):
            app.add_typer(typer.Typer(help=module.app.info.help), name=name)
        else:
            settings = getattr(module, "COMMAND_SETTINGS", {})
            app.command(name=name, help=settings.get("help") or (module.command.__doc__ or "").strip().split("\n")[0],
                        context_settings=settings.get("context_settings"))(_placeholder)
    return app


def _placeholder() -> None:  # pragma: no cover - replaced by the real command when invoked
    raise typer.Exit(EXIT_USAGE)


def main(argv: list[str] | None = None) -> int:
    """Console-script entry point: run the app inside the error boundary."""
    render.reset()
    # mctl uses no pydantic plugins; without this pydantic scans every installed distribution's entry
    # points the first time a schema is built (~20-40 ms of each start). An operator's value wins.
    os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        result = build_app(args)(args=args, prog_name="mctl", standalone_mode=False)
        return int(result or 0)
    except MctlError as exc:
        render.error(exc.message, exc.hint)
        return exc.exit_code
    except typer.Exit as exc:
        return exc.exit_code
    except getattr(_cx, "NoArgsIsHelpError", ()) as exc:
        render.write(exc.format_message() + "\n")
        return 0
    except _cx.ClickException as exc:
        # Usage errors: unknown option, missing argument, bad value.
        render.error(exc.format_message(), _usage_hint(exc))
        return EXIT_USAGE
    except SystemExit as exc:  # completion helpers exit directly
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else EXIT_USAGE)
    except (typer.Abort, KeyboardInterrupt):
        render.write("mctl: interrupted\n", err=True)
        return 130
    except BrokenPipeError:
        # Output piped into head/less that closed early.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as exc:  # noqa: BLE001 - the last net: one line, never a traceback unless -v
        return _internal_error(exc, args)


def _internal_error(exc: BaseException, args: list[str]) -> int:
    """An exception no layer turned into an MctlError: a bug. One line and exit 70; the traceback with -v."""
    import traceback

    text = " ".join(str(exc).split())[:500]
    what = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    verbose = _verbose(args)
    try:
        if verbose:
            render.write("".join(traceback.format_exception(type(exc), exc, exc.__traceback__)), err=True)
        render.error(f"internal error: {what}",
                     "this is a bug in mctl; please report it with the output of the same command run with -v"
                     if not verbose else "this is a bug in mctl; please report it with the traceback above")
    except Exception:  # noqa: BLE001 - even the error printer failed: plain text, still one line
        render.write(f"mctl: error: internal error: {what}\n", err=True)
    return EXIT_INTERNAL


def _verbose(args: list[str]) -> bool:
    from mctl.cli.context import options

    if options().verbose:
        return True
    for arg in args:
        if arg == "--":
            break
        if arg == "--verbose" or (arg.startswith("-") and not arg.startswith("--") and set(arg[1:]) == {"v"}):
            return True
    return False


def _usage_hint(exc: Exception) -> str:
    ctx = getattr(exc, "ctx", None)
    if ctx is not None:
        return f"see '{ctx.command_path} --help'"
    return "see 'mctl --help'"


def run() -> None:
    sys.exit(main())


if __name__ == "__main__":
    run()
