"""The `gagar` front door: real argparse subparsers, every nested subcommand in `gagar --help`, lazy imports."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NESTED = ["grade eval", "experiment loop", "experiment bloat", "experiment skew", "image build", "image ls",
          "image prune", "sandbox gc", "sft data", "sft train", "sft eval"]


def _gagar(*args: str, code: str | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-c", code] if code else [sys.executable, "-m", "gagar.cli", *args]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_help_lists_every_command_and_subcommand_without_importing_torch_or_docker() -> None:
    out = _gagar("--help")
    assert out.returncode == 0, out.stderr
    lines = [ln.strip() for ln in out.stdout.splitlines()]
    for words in NESTED + ["eval", "validate", "serve", "train"]:
        assert any(ln.startswith(words + " ") for ln in lines), (words, out.stdout)
    probe = _gagar(code="import io, sys, contextlib\nfrom gagar.cli import main\n"
                        "with contextlib.redirect_stdout(io.StringIO()):\n    main(['--help'])\n"
                        "print(sorted(m for m in ('torch', 'docker', 'transformers') if m in sys.modules))")
    assert probe.stdout.strip() == "[]", probe.stderr


def test_unknown_or_missing_command_exits_2() -> None:
    bad = _gagar("evaluate")
    assert bad.returncode == 2 and "invalid choice: 'evaluate'" in bad.stderr and "eval" in bad.stderr
    none = _gagar()
    assert none.returncode == 2 and "COMMAND" in none.stderr


@pytest.mark.parametrize("words", NESTED)
def test_each_listed_subcommand_is_one_its_package_parses(words: str, capsys: pytest.CaptureFixture) -> None:
    """The table the help is built from must not drift from the packages: `gagar W S --help` is S's help."""
    from gagar.cli import main

    try:
        rc = main([*words.split(), "--help"])
    except SystemExit as exc:  # argparse's --help
        rc = exc.code
    out = capsys.readouterr().out
    assert rc == 0 and "usage:" in out.lower(), out
    assert "unknown command" not in out and "invalid choice" not in out


def test_a_command_sees_its_arguments_unchanged(monkeypatch) -> None:
    """The top level picks the command only; the package gets the rest of the line exactly as typed."""
    import gagar.cli as cli
    import sandbox.cli

    seen = []
    monkeypatch.setattr(sandbox.cli, "eval_main", lambda argv: seen.append(argv) or 0)
    args = ["--instances", "a b", "--", "-x", "--run-id=r", "pos"]
    assert cli.main(["eval", *args]) == 0 and seen == [args]


@pytest.mark.parametrize("signame", ["SIGINT", "SIGTERM"])
def test_an_interrupted_command_exits_130_when_signalled_again_during_shutdown(signame: str) -> None:
    """An impatient second Ctrl-C (or SIGTERM) that lands after the command's cleanup, while the interpreter shuts
    down, must not turn the exit status 130 into a death by signal: Python has put the default actions back by then.
    The signal is sent from an object finalised in that shutdown, so the test hits the window every time."""
    code = (
        "import os, signal, sys\nimport gagar.cli as cli\n"
        "class Late:\n"
        f"    def __del__(self, kill=os.kill, pid=os.getpid(), sig=signal.{signame}):\n"
        "        kill(pid, sig)\n"
        "late = Late()\n"
        "cli.main = lambda argv=None: 130  # the interrupted command, its cleanup done\n"
        "cli.run()\n"
    )
    out = _gagar(code=code)
    assert out.returncode == 130, (out.returncode, out.stderr)


class _Caught(Exception):
    def __init__(self, parser) -> None:
        self.parser = parser


def _command_lines() -> list[list[str]]:
    """Every command line whose words choose a parser: each command, each listed subcommand, and the
    environment-image parser `gagar image build --instances` reaches."""
    from gagar.cli import COMMANDS

    lines = [[word] for word in COMMANDS]
    lines += [[word, sub] for word, cmd in COMMANDS.items() for sub, _ in cmd.subcommands]
    return lines + [["image", "build", "--instances", "x"], ["image"]]


def _parsers(monkeypatch) -> dict[str, object]:
    """The parser each command line builds, caught when it starts parsing (nothing runs)."""
    import argparse

    import gagar.cli as cli

    real_parse, real_build = argparse.ArgumentParser.parse_known_args, cli.build_parser

    def build():
        top = real_build()
        for _, p in _walk(top, "gagar"):
            p.gagar_top = True
        return top

    def catch(self, args=None, namespace=None):
        if getattr(self, "gagar_top", False):  # the top level, choosing the command: let it
            return real_parse(self, args, namespace)
        raise _Caught(self)

    monkeypatch.setattr(cli, "build_parser", build)
    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", catch)
    main = cli.main
    found = {"gagar": real_build()}
    for words in _command_lines():
        try:
            main(words)
        except _Caught as got:
            found[" ".join(words)] = got.parser
    monkeypatch.undo()
    return found


def _walk(parser, name: str):
    import argparse

    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for word, sub in action.choices.items():
                yield from _walk(sub, f"{name} {word}")


def test_every_parser_refuses_abbreviations_and_every_option_has_help(monkeypatch) -> None:
    """`--out 5m` must not be taken as `--output-limit 5m`: no parser or subparser allows abbreviations. Every
    option says what it does, and its default where it has one (in its own words or argparse's)."""
    import argparse

    from gagar.args import shows_default

    found = _parsers(monkeypatch)
    assert {"eval", "grade", "grade eval", "sft history", "tasks synth", "train", "serve", "model pull",
            "experiment loop", "image build --instances x"} <= set(found)
    missing, abbrev, no_default = [], [], []
    for top, parser in found.items():
        for name, p in _walk(parser, top):
            if p.allow_abbrev:
                abbrev.append(name)
            if name == "gagar" or name.startswith("gagar "):
                continue  # the top level only chooses the command (its subparsers hold no options)
            formatter = p._get_formatter()
            for a in p._actions:
                if isinstance(a, (argparse._HelpAction, argparse._VersionAction, argparse._SubParsersAction)):
                    continue
                flag = a.option_strings[0] if a.option_strings else a.dest
                if not a.help or a.help == argparse.SUPPRESS:
                    missing.append(f"{name} {flag}")
                elif shows_default(a) and "default" not in formatter._get_help_string(a).lower():
                    no_default.append(f"{name} {flag}")
    assert not abbrev, f"parsers allowing abbreviations: {abbrev}"
    assert not missing, f"options without help: {missing}"
    assert not no_default, f"defaults not shown: {no_default}"


def test_an_abbreviated_option_is_an_error_not_another_option(capsys) -> None:
    from gagar.cli import main

    try:
        rc = main(["eval", "--instances", "i", "--predictions", "p", "--repos-dir", "d", "--run-id", "r",
                   "--report-dir", "o", "--output", "5m"])
    except SystemExit as exc:
        rc = exc.code
    assert rc == 2 and "unrecognized arguments: --output" in capsys.readouterr().err


def test_every_subcommand_is_in_the_top_level_help_and_its_own() -> None:
    """`gagar --help` lists every subcommand a package parses (sft history was missing), and a command's own help
    names all of its subcommands (`experiment --help` left out `loop`)."""
    out = _gagar("--help").stdout
    assert "sft history" in out
    exp = _gagar("experiment", "--help").stdout
    assert all(w in exp.split("positional arguments")[0] for w in ("bloat", "skew", "loop")), exp


def test_every_script_parser_refuses_abbreviations_too() -> None:
    """The repository's own scripts (bench/, examples/, recipes/) and modules: every `argparse.ArgumentParser(...)`
    passes allow_abbrev=False, every bare `ArgumentParser(...)` is gagar's (`gagar.args`)."""
    import ast

    bad = []
    skip = ("tests", ".venv", ".git", ".gagar", "examples/tasks", "examples/synth", "build")
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith(skip) or "/repo/" in rel:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        ours = any(isinstance(n, ast.ImportFrom) and n.module == "gagar.args" for n in ast.walk(tree))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            if isinstance(f, ast.Attribute) and f.attr == "ArgumentParser":
                if not any(k.arg == "allow_abbrev" and isinstance(k.value, ast.Constant) and k.value.value is False
                           for k in node.keywords):
                    bad.append(f"{rel}:{node.lineno}")
            elif isinstance(f, ast.Name) and f.id == "ArgumentParser" and not ours and rel != "gagar/args.py":
                bad.append(f"{rel}:{node.lineno}")
    assert not bad, f"parsers that allow abbreviations: {bad}"
