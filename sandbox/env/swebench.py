"""SWE-bench rows as shipped: the test command SWE-bench runs for a row, and where its specs come from.

A SWE-bench row has no `test_cmd`. SWE-bench builds one per row, and so does this module, at the step that
gives instances their environment spec (`sandbox.env.spec.apply_specs`), so every later check sees it:

- **classic rows** (specs by repo and version: `swebench` ≤ 4.1's `MAP_REPO_VERSION_TO_SPECS`, or a spec file
  in that shape): the spec's `eval_commands`, then its `test_cmd` followed by the test directives SWE-bench
  derives from `test_patch` (the files it touches, minus data files; the module-path form for Django's runner);
- **5.x rows** (`eval_script`, `log_parser`, `eval_type`, `image`): the lines of `eval_script` between its
  start and end markers, after its `export`s and conda activation; its git reset, test-patch application and
  reinstall are left out, because the sandbox restores the tests and applies `test_patch` itself and the
  environment image holds the install.

The framework follows from the command — pytest (and tox) → `pytest`, Django's `tests/runtests.py` → `django`,
SymPy's `bin/test` → `sympy` — and `log_parser` (SWE-bench's parser name: the row's, the spec's, SWE-bench's
per-repo choice, else the framework's own) says how test ids are spelled when grading (`sandbox.parsers.swebench`).

SWE-bench's per-repo data (where `requirements.txt` and `environment.yml` live, which parser a repo uses) is
read from the installed `swebench` when it has it, else from the copy below (swebench 4.1.0).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# swebench.harness.constants (4.1.0): MAP_REPO_TO_REQS_PATHS, MAP_REPO_TO_ENV_YML_PATHS, NON_TEST_EXTS.
REQS_PATHS: dict[str, list[str]] = {
    "dbt-labs/dbt-core": ["dev-requirements.txt", "dev_requirements.txt"],
    "django/django": ["tests/requirements/py3.txt"],
    "matplotlib/matplotlib": ["requirements/dev/dev-requirements.txt", "requirements/testing/travis_all.txt"],
    "pallets/flask": ["requirements/dev.txt"],
    "pylint-dev/pylint": ["requirements_test.txt"],
    "pyvista/pyvista": ["requirements_test.txt", "requirements.txt"],
    "sqlfluff/sqlfluff": ["requirements_dev.txt"],
    "sympy/sympy": ["requirements-dev.txt", "requirements-test.txt"],
}
ENV_YML_PATHS: dict[str, list[str]] = {
    "matplotlib/matplotlib": ["environment.yml"],
    "pydata/xarray": ["ci/requirements/environment.yml", "environment.yml"],
}
# swebench.harness.log_parsers.python (4.1.0) MAP_REPO_TO_PARSER_PY, by the parser's own name.
REPO_PARSERS: dict[str, str] = {
    "astropy/astropy": "parse_log_pytest_v2", "django/django": "parse_log_django",
    "marshmallow-code/marshmallow": "parse_log_pytest", "matplotlib/matplotlib": "parse_log_matplotlib",
    "mwaskom/seaborn": "parse_log_seaborn", "pallets/flask": "parse_log_pytest",
    "psf/requests": "parse_log_pytest_options", "pvlib/pvlib-python": "parse_log_pytest",
    "pydata/xarray": "parse_log_pytest", "pydicom/pydicom": "parse_log_pytest_options",
    "pylint-dev/astroid": "parse_log_pytest", "pylint-dev/pylint": "parse_log_pytest_options",
    "pytest-dev/pytest": "parse_log_pytest", "pyvista/pyvista": "parse_log_pytest",
    "scikit-learn/scikit-learn": "parse_log_pytest_v2", "sqlfluff/sqlfluff": "parse_log_pytest",
    "sphinx-doc/sphinx": "parse_log_pytest_v2", "sympy/sympy": "parse_log_sympy",
}
NON_TEST_EXTS = (".json", ".png", "csv", ".txt", ".md", ".jpg", ".jpeg", ".pkl", ".yml", ".yaml", ".toml")
START_MARK, END_MARK = ">>>>> Start Test Output", ">>>>> End Test Output"
SPECS_UP_TO = (4, 1)  # MAP_REPO_VERSION_TO_SPECS exists in swebench up to 4.1.x
WORKS = ("pip install 'swebench>=2,<=4.1.0' (the last release with MAP_REPO_VERSION_TO_SPECS), or pass "
         "--env-specs FILE with SWE-bench's specs as JSON {repo: {version: spec}} (bench/swebench_specs.py "
         "writes one from swebench 4.1.0)")


class SWEbenchError(ValueError):
    """The `swebench` package is missing or cannot give specs; the message names the version and what works."""


@dataclass(frozen=True)
class RunSpec:
    """How SWE-bench runs a spec's tests: `test_cmd` (a string, or a list run one after the other),
    `eval_commands` run before it, and the log parser that reads its output (optional)."""

    test_cmd: tuple[str, ...] = ()
    eval_commands: tuple[str, ...] = ()
    log_parser: str | None = None

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str) -> RunSpec | None:
        def strs(key: str) -> tuple[str, ...]:
            v = d.get(key)
            v = [v] if isinstance(v, str) else v
            if v in (None, []):
                return ()
            if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
                raise ValueError(f"{where}: `{key}` must be a string or a list of strings, got {v!r}")
            return tuple(x for x in v if x.strip())

        lp = d.get("log_parser")
        if lp is not None and not isinstance(lp, str):
            raise ValueError(f"{where}: `log_parser` must be a parser name, got {lp!r}")
        run = cls(strs("test_cmd"), strs("eval_commands"), lp or None)
        return run if run.test_cmd else None


# ------------------------------------------------------------------------------------ the command


def test_directives(test_patch: str, *, module_paths: bool = False) -> list[str]:
    """SWE-bench's `get_test_directives`: the files `test_patch` touches, minus data files; for Django's
    runner, `tests/a/b.py` → `a.b`."""
    out = [d for d in re.findall(r"diff --git a/.* b/(.*)", test_patch or "")
           if not any(d.endswith(ext) for ext in NON_TEST_EXTS)]
    if module_paths:
        out = [(d[:-3] if d.endswith(".py") else d).removeprefix("tests/").replace("/", ".") for d in out]
    return out


def framework_of(command: str) -> str | None:
    """The sandbox framework a SWE-bench test command runs under, from its last line."""
    last = [ln for ln in command.strip().splitlines() if ln.strip()][-1:] or [""]
    line = last[0]
    if re.search(r"(^|[\s/])runtests\.py\b", line):
        return "django"
    if re.search(r"(^|[\s;&|])(\./)?bin/test\b", line):
        return "sympy"
    if re.search(r"(^|[\s/;&|])tox\b", line):
        return None  # UNSUPPORTED_RUNNERS says why
    if re.search(r"(^|[\s/;&|])(pytest|py\.test)\b|-m\s+pytest\b", line):
        return "pytest"
    if re.search(r"-m\s+unittest\b", line):
        return "unittest"
    return None


UNSUPPORTED_RUNNERS = {
    "tox": "tox runs pytest in an environment it filters, so the sandbox's report settings (PYTEST_ADDOPTS, "
           "PYTHONPATH, the result pipe) do not reach it",
}
FRAMEWORK_PARSER = {"pytest": "parse_log_pytest", "django": "parse_log_django", "sympy": "parse_log_sympy",
                    "unittest": None}


def classic_command(repo: str, test_patch: str, run: RunSpec) -> tuple[str, str, str | None]:
    """(test_cmd, framework, log_parser) for a classic row: eval_commands, then test_cmd + directives."""
    if len(run.test_cmd) == 1:
        framework = framework_of(run.test_cmd[0])
        directives = test_directives(test_patch, module_paths=framework == "django")
        test = " ".join([run.test_cmd[0], *(shlex.quote(d) for d in directives)])
    else:  # SWE-bench runs a list of commands as they are (no directives)
        test, framework = "\n".join(run.test_cmd), framework_of(run.test_cmd[-1])
    if framework is None:
        why = next((w for r, w in UNSUPPORTED_RUNNERS.items() if re.search(rf"(^|\s){r}\b", run.test_cmd[-1])),
                   "cannot tell which test runner it is")
        raise ValueError(f"{repo}: `{run.test_cmd[-1]}` is not supported: {why} (supported: pytest, Django's "
                         "tests/runtests.py, SymPy's bin/test)")
    cmd = "\n".join([*run.eval_commands, test])
    return cmd, framework, run.log_parser or parser_for(repo, framework)


_CONDA_ACTIVATE = re.compile(r"^\s*(source\s+\S*/bin/activate\b.*|conda\s+activate\b.*)$")
_HEREDOC = re.compile(r"<<-?\s*'?\"?(\w+)'?\"?")
_DROPPED = re.compile(r"^\s*(git\b|cd\s|: '|echo\b|\w*pip\s+install\b|python[\d.]*\s+-m\s+pip\s+install\b|python"
                      r"[\d.]*\s+setup\.py\s+(install|develop)\b|conda\s+(install|env|create|update)\b)")


def command_from_eval_script(script: str) -> str:
    """The test command of a SWE-bench 5.x `eval_script`: its `export` lines and conda activation (guarded, so
    the command also runs in an environment without conda), then the lines between the start and end markers.
    Git steps, the heredoc'd test patch and the reinstall are left out (see the module docstring)."""
    lines = script.replace("\r\n", "\n").split("\n")
    pre: list[str] = []
    body: list[str] | None = None
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if START_MARK in line:
            body = []
            continue
        if END_MARK in line:
            break
        if body is not None:
            if not re.fullmatch(r"\s*\w+=\$\?\s*", line):  # 5.x's exit-code capture would mask the tests' status
                body.append(line)
            continue
        m = _HEREDOC.search(line)
        if m:  # skip the heredoc body (the test patch)
            while i < len(lines) and lines[i].strip() != m.group(1):
                i += 1
            i += 1
            continue
        if _CONDA_ACTIVATE.match(line):
            pre.append(f"if command -v conda >/dev/null 2>&1 || [ -f /opt/miniconda3/bin/activate ]; then "
                       f"{line.strip()}; fi")
        elif line.strip().startswith("export ") and not _DROPPED.match(line):
            pre.append(line.strip())
    if not body or not any(ln.strip() for ln in body):
        raise ValueError(f"eval_script has no test command between `: '{START_MARK}'` and `: '{END_MARK}'`")
    return "\n".join([*pre, *[ln for ln in body if ln.strip()]])


def parser_for(repo: str, framework: str | None) -> str | None:
    """SWE-bench's parser for `repo` (installed package first, then the 4.1.0 copy), else the framework's."""
    names = _package_parsers()
    return names.get(repo) or REPO_PARSERS.get(repo) or FRAMEWORK_PARSER.get(framework or "")


def framework_of_parser(log_parser: str) -> str | None:
    """The sandbox framework whose output a SWE-bench log parser reads (None: not supported here)."""
    from sandbox.parsers.swebench import PARSER_FRAMEWORK

    return PARSER_FRAMEWORK.get(log_parser)


def row_command(inst: Any, run: RunSpec | None) -> tuple[str, str, str | None] | None:
    """The command for one row without `test_cmd`: from its `eval_script` (5.x), else from the spec (classic).
    None when neither is there. Raises ValueError naming what is unsupported."""
    if getattr(inst, "eval_script", None):
        lp = inst.log_parser or (run.log_parser if run else None) or parser_for(inst.repo, None)
        framework = framework_of_parser(lp) if lp else None
        cmd = command_from_eval_script(inst.eval_script)
        framework = framework or framework_of(cmd)
        if framework is None or (lp and framework_of_parser(lp) is None):
            from sandbox.parsers.swebench import PARSER_FRAMEWORK

            raise ValueError(f"log_parser {lp!r} is not supported by the sandbox (supported: "
                             f"{', '.join(sorted(PARSER_FRAMEWORK))})")
        return cmd, framework, lp
    if run is None:
        return None
    cmd, framework, lp = classic_command(inst.repo, inst.test_patch, run)
    return cmd, framework, inst.log_parser or lp


# -------------------------------------------------------------------------------- the package


def swebench_version() -> str | None:
    try:
        from importlib.metadata import PackageNotFoundError, version
    except ImportError:  # pragma: no cover
        return None
    try:
        return version("swebench")
    except PackageNotFoundError:
        return None


def _vtuple(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v)[:2])


def package_specs() -> dict[str, dict[str, dict]]:
    """SWE-bench's MAP_REPO_VERSION_TO_SPECS from the installed package, each spec with its repo's
    `log_parser` added. SWEbenchError when the package is missing or too new to have it."""
    found = swebench_version()
    if found is None:
        raise SWEbenchError(f"--env-specs swebench needs the `swebench` package, which is not installed; {WORKS}")
    try:
        from swebench.harness.constants import MAP_REPO_VERSION_TO_SPECS  # type: ignore[import-not-found]
    except ImportError as exc:
        why = (f"swebench {found} no longer ships MAP_REPO_VERSION_TO_SPECS (5.x rows carry `eval_script`, "
               "`log_parser` and `image` instead: those rows need no spec map for their test command, but their "
               "environment still comes from a spec)" if _vtuple(found) > SPECS_UP_TO
               else f"swebench {found} cannot be imported ({type(exc).__name__}: {exc})")
        raise SWEbenchError(f"--env-specs swebench: {why}; {WORKS}") from exc
    parsers = _package_parsers()
    return {repo: {str(v): {**spec, **({"log_parser": parsers[repo]} if repo in parsers else {})}
                   for v, spec in versions.items()} for repo, versions in MAP_REPO_VERSION_TO_SPECS.items()}


def _package_parsers() -> dict[str, str]:
    try:
        from swebench.harness.log_parsers import MAP_REPO_TO_PARSER  # type: ignore[import-not-found]
    except Exception:  # noqa: BLE001 - absent, too new, or broken: the 4.1.0 copy stands in
        return {}
    return {repo: getattr(f, "__name__", "") for repo, f in MAP_REPO_TO_PARSER.items() if getattr(f, "__name__", "")}


def _package_map(name: str, fallback: dict[str, list[str]]) -> dict[str, list[str]]:
    try:
        import swebench.harness.constants as c  # type: ignore[import-not-found]
    except Exception:  # noqa: BLE001
        return fallback
    return getattr(c, name, None) or fallback


# ------------------------------------------------------------------- requirements, environment.yml

Reader = Callable[[str], "str | None"]  # repo path → text at the environment commit, or None


def _first_file(paths: list[str], read: Reader, what: str, repo: str) -> tuple[str, str]:
    """The first of `paths` that exists at the environment commit, with its text (SWE-bench's lookup order)."""
    for path in paths:
        text = read(path)
        if text is not None:
            return path, text
    raise ValueError(f"no {what} at {', '.join(paths)} (where SWE-bench looks for {repo})")


def requirements(repo: str, read: Reader) -> tuple[str, list[str]]:
    """SWE-bench's `get_requirements_by_commit` on the local clone: the first of the repo's requirement paths
    that exists (`requirements.txt` for a repo SWE-bench has none listed for), its `-r` includes expanded one
    level deep (their lines first, as SWE-bench does), `-e .`, comments and `.[test…` lines dropped,
    `types-pkg_resources` → `types-setuptools`. Returns (the file used, requirement lines); ValueError naming the
    paths tried when none exists."""
    paths = _package_map("MAP_REPO_TO_REQS_PATHS", REQS_PATHS).get(repo) or ["requirements.txt"]
    path, text = _first_file(paths, read, "requirements file", repo)
    base = "/".join(path.split("/")[:-1])

    def keep(line: str) -> bool:
        s = line.strip()
        return bool(s) and not any(s.startswith(x) for x in ("-e .", "#", ".[test"))

    own, extra = [], []
    for line in text.split("\n"):
        if line.strip().startswith("-r"):
            inc = read("/".join(p for p in (base, line.strip()[2:].strip()) if p))
            extra += [x for x in (inc or "").split("\n") if keep(x)]
        elif keep(line):
            own.append(line)
    lines = [re.sub(r"^types-pkg_resources([<>=!~]=?.*|$)", "types-setuptools", x.rstrip()) for x in extra + own]
    return path, lines


def environment_yml(repo: str, read: Reader) -> tuple[str, list[str], list[str]]:
    """A repo's conda `environment.yml` (SWE-bench's paths) as pip: (file used, conda dependencies as pip
    requirement strings, the yml's own `pip:` list). `python`, `pip` and compilers are dropped (the base image
    gives Python; a wheel needs no compiler); `name=1.2` becomes `name==1.2.*`."""
    import yaml

    paths = _package_map("MAP_REPO_TO_ENV_YML_PATHS", ENV_YML_PATHS).get(repo) or ["environment.yml"]
    path, text = _first_file(paths, read, "environment.yml", repo)
    try:
        doc = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise ValueError(f"{path} is not valid YAML ({exc})") from exc
    conda, pip = [], []
    for dep in doc.get("dependencies") or []:
        if isinstance(dep, dict):
            pip += [str(x).strip() for x in dep.get("pip") or [] if str(x).strip()]
        elif isinstance(dep, str):
            req = conda_to_pip(dep)
            if req:
                conda.append(req)
    return path, conda, pip


_NOT_PYTHON = {"python", "pip", "compilers", "c-compiler", "cxx-compiler", "fortran-compiler", "make", "cmake",
               "pkg-config", "ninja"}


def conda_to_pip(dep: str) -> str | None:
    """One conda match spec as a pip requirement (`numpy=1.2` → `numpy==1.2.*`, `x>=1` as is), or None for
    what pip cannot and need not install (python itself, pip, compilers)."""
    dep = dep.split("::")[-1].split("#")[0].strip()
    m = re.match(r"^([A-Za-z0-9_.\-]+)\s*(.*)$", dep)
    if not m or m.group(1).lower() in _NOT_PYTHON:
        return None
    name, rest = m.group(1), m.group(2).replace(" ", "")
    rest = rest.split("=", 2)[:2] if re.fullmatch(r"=[^=<>!].*", rest) else [rest]
    if len(rest) == 2 and rest[0] == "":  # `=1.2` or `=1.2=build`: conda's fuzzy equality
        version = rest[1].split("=")[0]
        return f"{name}=={version}" + ("" if "*" in version else ".*")
    spec = rest[0]
    if spec[:1].isdigit():  # `numpy 1.2.*`: conda's space-separated version
        spec = "==" + spec
    return f"{name}{spec}" if spec else name
