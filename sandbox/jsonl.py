"""The project's one JSONL reader and writer, with one policy for bad lines.

- Reading is strict by default: a line that is not UTF-8, not JSON or not a JSON object raises `JsonlError`
  naming the file and line — input files a user wrote must not lose records silently.
- `skip_bad=True` is for files whose documentation promises skipping (predictions of `gagar eval`, a results
  or metrics file whose last line a crash cut short): the bad line is skipped and a note naming the file and line
  goes to `notes` (or to stderr when no list is given); the rest is used.
- Writing replaces the file atomically (temp file + rename), so readers never see half a file:
  `atomic_write_text` is the project's one atomic-write helper, JSONL or not.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any


class JsonlError(ValueError):
    """An unreadable JSONL file or line; the message names the file (and line)."""


def read_text(path: str | Path) -> tuple[str, bool]:
    """(text, whether some bytes were not UTF-8 — those decode to surrogates and are caught per line)."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise JsonlError(f"cannot read {p}: {exc.strerror or exc}") from exc
    try:
        return data.decode("utf-8"), False
    except UnicodeDecodeError:
        return data.decode("utf-8", "surrogateescape"), True


def _bad(msg: str, skip_bad: bool, notes: list[str] | None) -> None:
    if not skip_bad:
        raise JsonlError(msg)
    if notes is None:
        print(f"{msg}; skipped", file=sys.stderr)
    else:
        notes.append(f"{msg}; skipped")


def parse_lines(text: str, where: str, *, skip_bad: bool = False, notes: list[str] | None = None,
                bad_utf8: bool = False) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) for every non-blank line of `text`; `where` names the source in messages."""
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if bad_utf8 and any("\udc80" <= ch <= "\udcff" for ch in line):
            _bad(f"{where}:{n}: not valid UTF-8", skip_bad, notes)
            continue
        try:
            row = json.loads(line)
        except ValueError as exc:
            msg = getattr(exc, "msg", str(exc))
            col = getattr(exc, "colno", None)
            _bad(f"{where}:{n}: not valid JSON ({msg}{f' at column {col}' if col else ''})", skip_bad, notes)
            continue
        if not isinstance(row, dict):
            _bad(f"{where}:{n}: expected a JSON object per line, got {type(row).__name__}", skip_bad, notes)
            continue
        yield n, row


def iter_jsonl(path: str | Path, *, skip_bad: bool = False,
               notes: list[str] | None = None) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) per record of a JSONL file (see the module docstring for bad lines)."""
    text, bad_utf8 = read_text(path)
    yield from parse_lines(text, str(path), skip_bad=skip_bad, notes=notes, bad_utf8=bad_utf8)


def read_jsonl(path: str | Path, *, skip_bad: bool = False, notes: list[str] | None = None) -> list[dict[str, Any]]:
    return [row for _, row in iter_jsonl(path, skip_bad=skip_bad, notes=notes)]


def dumps_jsonl(rows: Iterable[dict[str, Any]]) -> str:
    return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write to a temporary file beside `path`, fsync, then rename: readers never see a half-written file.

    The one atomic-write helper of the project (the grader, trainer and experiments use it too).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; results are meant to be shared
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_jsonl_atomic(path: str | Path, rows: Iterable[dict[str, Any]]) -> None:
    """Write JSONL to a temporary file beside `path`, then rename, so readers never see a half-written file."""
    atomic_write_text(path, dumps_jsonl(rows))


def append_jsonl(path: str | Path, row: dict[str, Any]) -> None:
    """Append one record as one write (a crash leaves at most a cut last line, which `skip_bad` readers skip)."""
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(row, ensure_ascii=False) + "\n")
        fh.flush()
