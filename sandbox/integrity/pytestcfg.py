"""The files pytest reads as its configuration, and what of them pytest would load.

pytest looks for its configuration in every directory from the common ancestor of its arguments up to `/`:
`pytest.ini`, `.pytest.ini`, `pytest.toml` and `.pytest.toml` (pytest >= 9) always count; `pyproject.toml` with
a `[tool.pytest.ini_options]` (or pytest 9's `[tool.pytest]`) table; `tox.ini` with a `[pytest]` section;
`setup.cfg` with `[tool:pytest]`. And it imports every `conftest.py` on the way to the tests. Any of them can
load a plugin (`addopts = -p ...`), move the import path (`pythonpath`) or change what is collected, so the
sandbox reverts each one a patch touches (`sandbox.apply.restore_task_tests`), and makes the run suspicious
when one changes while the tests run.

`pyproject.toml` and `setup.cfg` hold other things too (version bumps are honest edits), so for those two only a
change to what pytest reads counts. That is decided the way pytest reads them, not by a second opinion: TOML
through `tomllib` (the parser pytest uses), and INI files by the rule every INI parser pytest has shipped
(`iniconfig`) shares — a line starting with `[` opens a section, every other line belongs to the section above —
keeping *every* section whose header line mentions pytest, comments included (and the lines before the first
header, which pytest refuses). So `[tool:pytest]#]`, which
`configparser` reads as a section named `tool:pytest]#` and `iniconfig` as `tool:pytest`, is kept too. A file
that is a symlink is never read through: pytest follows it, so a symlink at one of these names counts as
touched whatever it points to.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from sandbox.integrity.treefs import read_capped

ALWAYS = frozenset({"conftest.py", "pytest.ini", ".pytest.ini", "pytest.toml", ".pytest.toml", "tox.ini"})
SECTIONED = frozenset({"pyproject.toml", "setup.cfg"})
NAMES = ALWAYS | SECTIONED
MAX_CONFIG_BYTES = 4 << 20  # a configuration file over this is not read by the host: any change to it counts


def is_config_name(path: str) -> bool:
    return path.rsplit("/", 1)[-1] in NAMES


def pytest_view(name: str, data: bytes | None) -> object:
    """What pytest would read from the file `name` holding `data` (None: absent). Comparable with `==`;
    a TOML file pytest could not parse gives its text (so any edit to it counts)."""
    if data is None:
        return None
    text = data.decode("utf-8", "replace")
    if name.endswith(".toml"):
        try:
            import tomllib
        except ImportError:  # Python 3.10: no parser in the standard library, so every edit counts
            return ("unparsed", text)
        try:
            doc = tomllib.loads(text)
        except ValueError:
            return ("unparsed", text)
        if name != "pyproject.toml":  # pytest.toml / .pytest.toml: a top-level [pytest] table
            return doc.get("pytest")
        tool = doc.get("tool", {})
        return tool.get("pytest") if isinstance(tool, dict) else ("unparsed", text)
    preamble: list[str] = []  # lines before any header: a parse error to pytest, which a patch could "fix"
    sections: list[list[str]] = []
    for line in text.splitlines():
        if line.startswith("["):
            sections.append([line])
        else:
            (sections[-1] if sections else preamble).append(line)
    kept = [s for s in sections if "pytest" in s[0].lower()]
    # A parse error anywhere (a repeated section, a stray line in a section pytest never reads) makes pytest refuse
    # the whole file: an edit outside the pytest sections can turn a file pytest refused into one it reads.
    return [preamble, *kept, ["parses", str(_ini_parses(text))]] if kept else None


def _ini_parses(text: str) -> bool:
    """Whether iniconfig (pytest's INI parser) reads `text` without a ParseError: its rules, restated so that the
    host needs no pytest."""
    sections: dict[str, set[str]] = {}
    current: str | None = None
    last_key = False  # a continuation line needs a key line (or a continuation of one) before it
    for line in text.removeprefix("\ufeff").splitlines():
        line = "" if line.lstrip()[:1] in ("#", ";") else line.rstrip()
        if not line:
            continue
        if line[0] == "[":
            head = re.split(r"[#;]", line, maxsplit=1)[0].rstrip()
            if head.endswith("]"):
                name = head[1:-1]
                if not name or name in sections:
                    return False
                sections[name], current, last_key = set(), name, False
                continue
            if not last_key:  # not a header: iniconfig reads it as a continuation line
                return False
        elif not line[0].isspace():
            key, eq, _ = line.partition("=")
            if not eq or ":" in key:
                key, colon, _ = line.partition(":")
                if not colon:
                    return False
            key = key.strip()
            if current is None or key in sections[current]:
                return False
            sections[current].add(key)
            last_key = True
        elif not last_key:
            return False
    return True


def _ini_values(sections: list[list[str]], key: str) -> list[str]:
    """The values of `key` in INI sections (a value goes on over the indented lines that follow it)."""
    out: list[str] = []
    for sec in sections:
        taking = False
        for line in sec[1:]:
            if line[:1].isspace():
                if taking:
                    out.append(line.strip())
                continue
            k, sep, v = line.partition("=") if "=" in line else line.partition(":")
            taking = bool(sep) and k.strip() == key
            if taking:
                out.append(v.strip())
    return out


def pythonpath_dirs(tree: Path) -> set[str]:
    """The tree-relative directories the `pythonpath` option of the repository's root configuration files puts
    on sys.path ("" for the root itself)."""
    out: set[str] = set()
    for name in sorted(NAMES - {"conftest.py"}):
        data = read_capped(tree / name, MAX_CONFIG_BYTES)
        view = pytest_view(name, data)
        if not view or (isinstance(view, tuple) and view[:1] == ("unparsed",)):
            continue
        if isinstance(view, dict):
            opts = view.get("ini_options", view) if name == "pyproject.toml" else view
            raw = opts.get("pythonpath", []) if isinstance(opts, dict) else []
            values = raw.split() if isinstance(raw, str) else [str(x) for x in raw] if isinstance(raw, list) else []
        else:
            values = [v for line in _ini_values(view, "pythonpath") for v in line.split()]
        for v in values:
            rel = os.path.normpath(v)
            if not rel.startswith(("/", "..")):
                out.add("" if rel == "." else rel)
    return out
