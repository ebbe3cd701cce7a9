"""The one `ArgumentParser` of every gagar command (and of the repository's scripts).

Two things differ from argparse's own defaults, for every parser and every subparser made from one
(`add_subparsers` makes its parsers with the parent's class):
- no abbreviated options: argparse would take `--out 5m` as `--output-limit 5m` wherever `--out` is not an
  option itself, so a typo or a half-remembered flag silently sets another one;
- each option's default is shown in `--help`, unless its help already says what the default is (`default`)
  or there is none to show (None, False, an empty list).
`tests/test_cli.py` walks the parser of every command and subcommand and checks both, and that every option
has a help text.
"""

from __future__ import annotations

import argparse
from typing import Any


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """argparse's formatter, with `(default: X)` after a help text that does not mention its default."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "%(default)" in text or "default" in text.lower() or not shows_default(action):
            return text
        return f"{text} (default: %(default)s)" if text else "default: %(default)s"


def shows_default(action: argparse.Action) -> bool:
    """Whether the option has a default worth printing."""
    if action.default is None or action.default is False or action.default == argparse.SUPPRESS \
            or action.default == []:  # (0 is a default to show: `0 in (None, False)` would say it is not)
        return False
    if isinstance(action, (argparse._HelpAction, argparse._VersionAction, argparse._SubParsersAction)):
        return False
    return bool(action.option_strings) or action.nargs in ("?", "*")


class ArgumentParser(argparse.ArgumentParser):
    """argparse.ArgumentParser with allow_abbrev=False and DefaultsHelpFormatter unless told otherwise."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("formatter_class", DefaultsHelpFormatter)
        super().__init__(*args, **kwargs)
