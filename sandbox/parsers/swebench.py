"""SWE-bench's log parsers by name (`log_parser` of a 5.x row, or SWE-bench's choice for a repo), as the sandbox
runs them: which framework's output each reads, and how each spells a test id.

For pytest the sandbox reads the JUnit report (cross-checked by the guard plugin) rather than `-rA` lines a
patch could print; `swebench_ids` re-spells the report's node ids the way the named parser would have read them
off the `-rA` summary, so a row's FAIL_TO_PASS/PASS_TO_PASS ids match what SWE-bench's grading would see:
- `parse_log_pytest` and its aliases, `parse_log_seaborn`: the id up to its first whitespace (`-rA` lines are
  split on whitespace, so `test_x[a b]` is `test_x[a`);
- `parse_log_pytest_options` (requests, pylint, pydicom): that, with an absolute-path parameter cut to its last
  component (`test_x[/tmp/p/f.txt]` → `test_x[/f.txt]`);
- `parse_log_pytest_v2` (astropy, scikit-learn, sphinx): the whole id, whitespace runs as one space;
- `parse_log_matplotlib`: the first-token form with `MouseButton.LEFT`/`RIGHT` as `1`/`3`.
Django's and SymPy's runners print their own lines, read by `sandbox.parsers.django` / `sympy` as SWE-bench does.

`graded_ids` is what grading looks ids up in: every id as pytest spells it (the JUnit name, spaces and all) and
as the row's parser spells it — SWE-bench's datasets hold both (pallets__flask-5063 lists
`tests/test_cli.py::test_locate_app[cliapp.factory- create_app () -app]` whole) — and, for a pytest row with no
parser named, as SWE-bench's default `parse_log_pytest` does (cut at the first whitespace).
"""

from __future__ import annotations

import re
from collections.abc import Callable

from sandbox.parsers.base import merge

_PYTEST = ("parse_log_pytest", "parse_log_astroid", "parse_log_flask", "parse_log_marshmallow", "parse_log_pvlib",
           "parse_log_pyvista", "parse_log_sqlfluff", "parse_log_xarray", "parse_log_seaborn")
_OPTIONS = ("parse_log_pytest_options", "parse_log_pydicom", "parse_log_requests", "parse_log_pylint")
_V2 = ("parse_log_pytest_v2", "parse_log_astropy", "parse_log_scikit", "parse_log_sphinx")

PARSER_FRAMEWORK: dict[str, str] = {
    **dict.fromkeys((*_PYTEST, *_OPTIONS, *_V2, "parse_log_matplotlib"), "pytest"),
    "parse_log_django": "django",
    "parse_log_sympy": "sympy",
}
_OPTION = re.compile(r"(.*?)\[(.*)\]")


def _first(tid: str) -> str:
    return (tid.split() or [tid])[0]


def _options(tid: str) -> str:
    tid = _first(tid)
    m = _OPTION.search(tid)
    if not m:
        return tid
    main, option = m.groups()
    if option.startswith("/") and not option.startswith("//") and "*" not in option:
        option = "/" + option.split("/")[-1]
    return f"{main}[{option}]"


def _matplotlib(tid: str) -> str:
    return _first(tid.replace("MouseButton.LEFT", "1").replace("MouseButton.RIGHT", "3"))


ID_FORMS: dict[str, Callable[[str], str]] = {
    **dict.fromkeys(_PYTEST, _first),
    **dict.fromkeys(_OPTIONS, _options),
    **dict.fromkeys(_V2, lambda tid: " ".join(tid.split())),
    "parse_log_matplotlib": _matplotlib,
}


def swebench_ids(statuses: dict[str, str], log_parser: str | None) -> dict[str, str]:
    """`statuses` keyed the way `log_parser` spells ids (unchanged for parsers that read their runner's own
    lines, or without a parser). Two ids spelled alike keep the worse outcome."""
    form = ID_FORMS.get(log_parser or "")
    if form is None:
        return statuses
    out: dict[str, str] = {}
    for tid, status in statuses.items():
        merge(out, form(tid), status)
    return out


def graded_ids(statuses: dict[str, str], log_parser: str | None, framework: str | None = None) -> dict[str, str]:
    """The statuses a listed id is looked up in: the parser's spelling of every id (the worse outcome where two
    ids collapse into one), overlaid with each id as pytest spelled it, which names exactly one test."""
    form = ID_FORMS.get(log_parser or "") or (_first if (framework or "").lower() == "pytest" else None)
    if form is None:
        return statuses
    out: dict[str, str] = {}
    for tid, status in statuses.items():
        merge(out, form(tid), status)
    return {**out, **statuses}
