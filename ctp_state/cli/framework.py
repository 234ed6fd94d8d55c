"""The ``ctp`` command line's framework: the click group, the ``--store``/``--json``
plumbing every command shares (:func:`command`), one-line errors, option types built from
the settings, output (tables or JSON) and progress bars. Commands live beside it, one
module per area; they only parse, call the library and print.

Every command takes ``--store URL`` (default: ``$CTP_STORE``, else a local store under
``~/.ctp/store``), prints a human table by default and JSON with ``--json``, and exits
non-zero with a one-line cause on failure.
"""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Callable
from functools import wraps
from typing import Any, overload

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from ctp_state.errors import CtpError
from ctp_state.settings import options
from ctp_state.storage import open_store

DEFAULT_STORE = "file://" + os.path.join(os.path.expanduser("~"), ".ctp", "store")

err_console = Console(stderr=True)


def default_store_url() -> str:
    return os.environ.get("CTP_STORE") or DEFAULT_STORE


def fail(message: str) -> None:
    """Print ``message`` as one line (a driver's message may span several) and exit 1."""
    click.echo("error: " + " ".join(line.strip() for line in message.strip().splitlines() if line.strip()), err=True)
    sys.exit(1)


#: How a command opens its store: ``"read"`` refuses a ``file://`` store that does not
#: exist (a mistyped path must not read as an empty store), ``"create"`` creates it,
#: ``"flag"`` refuses unless ``--create-store`` is given.
StoreMode = str


@overload
def command(fn: Callable[..., Any]) -> Callable[..., Any]: ...


@overload
def command(fn: None = None, *, store: StoreMode = "read") -> Callable[[Callable[..., Any]], Callable[..., Any]]: ...


def command(fn: Callable[..., Any] | None = None, *, store: StoreMode = "read") -> Any:
    """Add ``--store``/``--json`` (and ``--create-store`` for ``store="flag"``) and turn
    every error into one line: usage errors exit 2, everything else 1."""
    if fn is None:
        return lambda f: command(f, store=store)

    def wrapper(store_url: str, as_json: bool, create_store: bool = False, **kwargs: Any) -> None:
        from ctp_state.errors import StoreNotFound

        try:
            opened = open_store(store_url, os.environ, create=store == "create" or create_store)
            fn(opened, as_json, **kwargs)
        except click.ClickException:
            raise  # usage errors: _OneLineErrors prints "error: ..." and exits 2
        except StoreNotFound as e:
            hint = "ctp topic create creates it" + (", or pass --create-store" if store == "flag" else "")
            fail(f"{e}: check --store / $CTP_STORE; {hint}")
        except CtpError as e:
            fail(str(e))
        except (OSError, ValueError) as e:
            fail(f"{type(e).__name__}: {e}")
        except Exception as e:
            if os.environ.get("CTP_DEBUG"):
                raise
            fail(f"unexpected {type(e).__name__}: {e} (set CTP_DEBUG=1 for a traceback)")

    decorated: Callable[..., Any] = wraps(fn)(wrapper)
    if store == "flag":
        decorated = click.option(
            "--create-store", is_flag=True, help="Create the file:// store directory if it does not exist."
        )(decorated)
    decorated = click.option("--json", "as_json", is_flag=True, help="Print JSON for machines.")(decorated)
    return click.option(
        "--store",
        "store_url",
        default=default_store_url,
        show_default="$CTP_STORE or ~/.ctp/store",
        help="Store URL: file:///abs/path or s3://bucket/prefix.",
    )(decorated)


def emit(as_json: bool, data: Any, table: Table | str | None = None) -> None:
    if as_json:
        click.echo(json.dumps(data, indent=2, sort_keys=True))
    elif isinstance(table, str):
        click.echo(table)
    elif table is not None:
        # Piped output (logs, files, other programs) must not be cut to 80 columns.
        out = Console()
        if not out.is_terminal:
            out = Console(width=240)
        out.print(table)


class _OneLineErrors(click.Group):
    """Usage errors (a bad option value, a missing argument) print one line, as every
    other error does: ``error: Invalid value for '--limit': -1 is not in the range x>=0.``"""

    def main(self, *args: Any, **kwargs: Any) -> Any:
        kwargs["standalone_mode"] = False
        try:
            return super().main(*args, **kwargs)
        except click.exceptions.Exit as e:  # --help, --version
            sys.exit(e.exit_code)
        except click.Abort:
            click.echo("error: aborted", err=True)
            sys.exit(1)
        except click.ClickException as e:
            click.echo(f"error: {e.format_message()}", err=True)
            sys.exit(e.exit_code)


class _Seconds(click.ParamType):  # type: ignore[type-arg]
    """A finite number >= 0 (no nan, no inf)."""

    name = "seconds"

    def convert(self, value: Any, param: Any, ctx: Any) -> float:
        try:
            f = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number", param, ctx)
        if not (0 <= f < math.inf):
            self.fail(f"{value!r} is not a finite number >= 0", param, ctx)
        return f


SECONDS = _Seconds()


class _Positive(_Seconds):
    """A finite number > 0."""

    name = "number"

    def convert(self, value: Any, param: Any, ctx: Any) -> float:
        f = super().convert(value, param, ctx)
        if f == 0:
            self.fail(f"{value!r} is not > 0", param, ctx)
        return f


class _TopicName(click.ParamType):  # type: ignore[type-arg]
    """A topic name by Kafka's rule, checked while the arguments are parsed: before a
    command opens (and perhaps creates) its store."""

    name = "topic"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        from ctp_state.errors import InvalidTopicName
        from ctp_state.validate import topic_name

        try:
            return topic_name(value)
        except InvalidTopicName as e:
            self.fail(str(e), param, ctx)


POSITIVE = _Positive()
COUNT = click.IntRange(min=0)
AT_LEAST_1 = click.IntRange(min=1)
TOPIC_NAME = _TopicName()


def settings_options(cls: type[Any], only: list[str]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """click options generated from a settings class (:mod:`ctp_state.settings`): the
    defaults and help live there once. Values arrive in the options' units, keyed by
    option name; :func:`from_options` turns them into settings."""

    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        for o in reversed(options(cls, only)):
            k = o.knob
            if k.kind is bool:
                fn = click.option(o.flag, o.name, is_flag=True, default=o.default, help=k.help)(fn)
                continue
            if k.choices:
                typ: Any = click.Choice(k.choices)
            elif k.kind is int:
                typ = click.IntRange(min=int(k.minimum) if k.minimum is not None else None)
            else:
                typ = POSITIVE if k.above == 0 else SECONDS if k.minimum == 0 else float
            unit = o.flag.rsplit("-", 1)[-1]  # --l1-full-sweep-hours: HOURS, not the type's SECONDS
            fn = click.option(
                o.flag,
                o.name,
                type=typ,
                default=o.default,
                show_default=o.default is not None,
                help=k.help,
                metavar=unit.upper()
                if unit in ("seconds", "hours", "mb", "ms", "bytes") and k.kind is not int
                else None,
            )(fn)
        return fn

    return deco


@click.group(cls=_OneLineErrors, context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """ctp: epoch-based reconciliation and garbage collection for object-storage topics."""


def _progress() -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=err_console,
        transient=False,
        disable=not err_console.is_terminal,
    )
