"""`gagar` — one console script; each subcommand lives in its own package.

The dispatcher only maps the first word to `module:function`; the package parses its own arguments, so
`gagar eval` never imports torch and `gagar train` never imports the Docker SDK unless it needs it.
Every handler has the signature `main(argv: list[str]) -> int` and returns the process exit code
(0 done, 2 bad usage or unreadable input, as argparse does).
"""

from __future__ import annotations

import importlib
import sys

# word -> (module, function, one-line help)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "eval": ("sandbox.cli", "eval_main", "evaluate predictions in the Docker sandbox (SWE-bench compatible)"),
    "image": ("sandbox.cli", "image_main", "build or list sandbox images: base (offline, debootstrap) and environment images"),
    "validate": ("sandbox.env.validate", "main", "check tasks: gold resolves, base fails, no flaky tests (repeats)"),
    "sandbox": ("sandbox.cli", "sandbox_main", "sandbox maintenance: `gagar sandbox gc` removes leftovers"),
    "grade": ("grader.cli", "main", "rank the passing candidates of groups (heuristic or LLM judge)"),
    "serve": ("grader.serve", "main", "serve a transformers model over the OpenAI chat API"),
    "sft": ("sft.cli", "main", "judge training data, fine-tuning and evaluation"),
    "train": ("trainer.cli", "main", "RL post-training of a code agent"),
    "experiment": ("trainer.experiments.cli", "main", "controlled experiments: `bloat`, `skew`"),
    "model": ("inference.models", "main", "base models: `pull NAME` (pinned, sha256-verified, cached) and `ls`"),
}


def _usage() -> str:
    lines = ["usage: gagar COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {name:<11} {help_}" for name, (_, _, help_) in COMMANDS.items()]
    lines += ["", "Run `gagar COMMAND --help` for a command's options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in {"-h", "--help", "help"}:
        print(_usage())
        return 0 if argv else 2
    if argv[0] in {"-V", "--version"}:
        from gagar import __version__

        print(f"gagar {__version__}")
        return 0
    word, rest = argv[0], argv[1:]
    if word not in COMMANDS:
        print(f"gagar: unknown command {word!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module_name, func_name, _ = COMMANDS[word]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        print(f"gagar {word}: this command is not available in this installation ({exc})", file=sys.stderr)
        return 2
    handler = getattr(module, func_name)
    try:
        return int(handler(rest) or 0)
    except KeyboardInterrupt:
        print(f"gagar {word}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
