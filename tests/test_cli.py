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
