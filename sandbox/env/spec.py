"""Environment specs: what an instance's environment image holds (the contract: docs/environments.md).

A spec has SWE-bench's per-version keys, installed with pip and apt: `python`, `apt_packages`, `packages` (a
requirements file in the repo; SWE-bench's `requirements.txt` / `environment.yml`, found where SWE-bench looks;
or a conda package list), `pip_packages`, `pre_install`, `install`, plus `go` and `java` toolchain versions; its
test keys (`test_cmd`, `eval_commands`, `log_parser`) are kept apart in `EnvSpec.run` and give a row without
`test_cmd` its command (`apply_specs`, `sandbox.env.swebench`). It comes from the instance's `env`, else from
`--env-specs FILE` (`{repo: {version: spec}}`, the shape of SWE-bench's `MAP_REPO_VERSION_TO_SPECS`), or from
the installed `swebench` ≤ 4.1 (`--env-specs swebench`), translated. Bad input raises `SpecError` with a message
naming the repo/version/instance and the offending key.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sandbox.env.swebench import RunSpec, SWEbenchError, package_specs, row_command

KEYS = ("python", "apt_packages", "packages", "conda_packages", "pip_packages", "pre_install", "install", "go",
        "java")
# SWE-bench keys that say how to run the tests: kept apart (`EnvSpec.run`), never part of the image.
RUN_KEYS = ("test_cmd", "eval_commands", "log_parser")
# SWE-bench keys that size containers or steer its own harness: accepted so a dumped SWE-bench map loads, ignored.
IGNORED_KEYS = ("nano_cpus", "execute_test_as_nonroot", "docker_specs", "no_use_env", "env_patches")
ALIASES = {"apt-pkgs": "apt_packages"}  # SWE-bench's spelling in some versions of its constants
# `packages` values with SWE-bench's meaning: the repo's own requirement files / its conda environment file,
# found and read at the environment commit (sandbox.env.swebench).
SWEBENCH_FILES = ("requirements.txt", "environment.yml")
_CONDA = re.compile(r"\bconda\b")
_NON_EDITABLE = ((re.compile(r"\bpip\s+install\s+(?!.*(?:-e|--editable)\s)(.*?)(?<![\w/.-])\.(\[[\w,-]+\])?(?=\s|$)"),
                  r"pip install \1-e .\2"),
                 (re.compile(r"\bsetup\.py\s+install\b"), "setup.py develop"))


def _editable(cmd: str) -> str:
    """An install of the repository itself, made editable: the image's copy of the source is deleted after the
    build, and SWE-bench reinstalls the patched tree before each run, which an offline, read-only test
    container cannot; an editable install imports each rollout's tree from /testbed instead."""
    for pat, repl in _NON_EDITABLE:
        cmd = pat.sub(repl, cmd)
    return cmd


class SpecError(ValueError):
    """An environment spec or spec file that cannot be used; the message names where and why."""


def _strs(v: Any, key: str, where: str) -> tuple[str, ...]:
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list) or not all(isinstance(x, str) and x.strip() for x in v):
        raise SpecError(f"{where}: `{key}` must be a list of non-empty strings, got {v!r}")
    return tuple(x.strip() for x in v)


@dataclass(frozen=True)
class EnvSpec:
    python: str | None = None
    apt_packages: tuple[str, ...] = ()
    packages: str | None = None
    pip_packages: tuple[str, ...] = ()
    pre_install: tuple[str, ...] = ()
    install: tuple[str, ...] = ()
    go: str | None = None
    java: str | None = None
    conda_packages: tuple[str, ...] = ()
    ignored: tuple[str, ...] = field(default=(), compare=False)
    run: RunSpec | None = field(default=None, compare=False)

    @classmethod
    def from_dict(cls, d: Any, where: str) -> EnvSpec:
        if not isinstance(d, dict):
            raise SpecError(f"{where}: an env spec must be a JSON object, got {type(d).__name__}")
        d = {ALIASES.get(k, k): v for k, v in d.items()}
        unknown = sorted(k for k in d if k not in KEYS and k not in IGNORED_KEYS and k not in RUN_KEYS)
        if unknown:
            raise SpecError(f"{where}: unknown env spec key(s) {', '.join(map(repr, unknown))}; known: "
                            f"{', '.join(KEYS)} (and SWE-bench's {', '.join(RUN_KEYS)})")
        try:
            run = RunSpec.from_dict(d, where)
        except ValueError as exc:
            raise SpecError(str(exc)) from exc
        out: dict[str, Any] = {"ignored": tuple(sorted(k for k in d if k in IGNORED_KEYS)), "run": run}
        for key in ("python", "go", "java"):
            v = d.get(key)
            if v is None:
                continue
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                v = str(v)
            if not isinstance(v, str) or not re.fullmatch(r"\d+(\.\d+){0,2}", v.strip()):
                raise SpecError(f"{where}: `{key}` must be a version like \"3.11\", got {v!r}")
            out[key] = v.strip()
        for key in ("apt_packages", "conda_packages", "pip_packages", "pre_install", "install"):
            if d.get(key) not in (None, "", []):
                out[key] = _strs(d[key], key, where)
        if "install" in out:
            out["install"] = tuple(_editable(c) for c in out["install"])
        for pkg in out.get("apt_packages", ()):
            if not re.fullmatch(r"[a-z0-9][a-z0-9+.-]*(=[\w.+:~-]+)?", pkg):
                raise SpecError(f"{where}: apt package {pkg!r} is not a Debian package name")
        pk = d.get("packages")
        if pk not in (None, ""):
            if not isinstance(pk, str):
                raise SpecError(f"{where}: `packages` must name a requirements file in the repo, got {pk!r}")
            pk = pk.strip()
            if re.search(r"\s", pk) or not re.search(r"(/|\.(txt|in|yml|yaml)$)", pk):
                # SWE-bench's conda package list (`numpy scipy 'pandas<2'`): installed with pip where PyPI has them
                out["conda_packages"] = (*out.get("conda_packages", ()), *shlex.split(pk))
            elif pk.startswith("/") or ".." in pk.split("/"):
                raise SpecError(f"{where}: `packages` must be a repo-relative requirements file, got {pk!r}")
            else:
                out["packages"] = pk
        return cls(**out)

    def to_dict(self) -> dict[str, Any]:
        """The spec's content (what the image hash covers), without empty keys."""
        d = asdict(self)
        d.pop("ignored")
        d.pop("run")
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in d.items() if v not in (None, ())}

    @property
    def language(self) -> str | None:
        return "go" if self.go else "java" if self.java else "python" if self.python else None


def parse_spec_map(data: Any, where: str) -> dict[str, dict[str, EnvSpec]]:
    """`{repo: {version: spec}}` → EnvSpecs; anything else is a SpecError saying what the shape must be."""
    shape = 'the documented shape is {"owner/name": {"version": {spec keys…}}}'
    if not isinstance(data, dict) or not data:
        raise SpecError(f"{where}: not an env-spec map ({shape})")
    out: dict[str, dict[str, EnvSpec]] = {}
    for repo, versions in data.items():
        if not isinstance(repo, str) or repo.count("/") != 1:
            raise SpecError(f"{where}: key {repo!r} is not a repo 'owner/name' ({shape})")
        if not isinstance(versions, dict) or not versions:
            raise SpecError(f"{where}: {repo} must map versions to specs ({shape})")
        out[repo] = {}
        for version, spec in versions.items():
            if not isinstance(spec, dict):
                raise SpecError(f"{where}: {repo} version {version!r} maps to {type(spec).__name__}, not a spec "
                                f"object ({shape})")
            out[repo][str(version)] = _from_swebench(spec, f"{where}: {repo} version {version}")
    return out


def load_spec_file(arg: str | Path) -> dict[str, dict[str, EnvSpec]]:
    """`--env-specs`: a JSON file, or `swebench` for the installed package's specs (translated)."""
    if str(arg) == "swebench" and not Path(arg).exists():
        return swebench_specs()
    path = Path(arg)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise SpecError(f"--env-specs {path}: cannot read it ({exc.strerror or exc})") from exc
    except ValueError as exc:
        raise SpecError(f"--env-specs {path}: not valid JSON ({exc})") from exc
    return parse_spec_map(data, f"--env-specs {path}")


def translate_swebench(spec: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """One SWE-bench spec → (a spec dict `EnvSpec.from_dict` takes, what cannot be translated). SWE-bench builds
    conda environments; pip and apt do what they can here: `packages` keeps its meaning (a conda package list is
    installed with pip, `requirements.txt`/`environment.yml` are read from the repo), and conda commands in
    `pre_install`/`install` are dropped and named."""
    out = dict(spec)
    lost: list[str] = []
    build = out.pop("build", None)  # SWE-bench runs a spec's `build` right after `install` in the repo image
    if build:
        inst = out.get("install") or []
        out["install"] = [*([inst] if isinstance(inst, str) else inst), *([build] if isinstance(build, str) else build)]
    for key in ("pre_install", "install"):
        cmds = out.get(key)
        cmds = [cmds] if isinstance(cmds, str) else cmds
        if isinstance(cmds, list):
            lost += [f"{key} uses conda: {c!r}" for c in cmds if isinstance(c, str) and _CONDA.search(c)]
            out[key] = [c for c in cmds if not (isinstance(c, str) and _CONDA.search(c))]
    return out, lost


def _from_swebench(spec: Any, where: str) -> EnvSpec:
    if not isinstance(spec, dict):
        raise SpecError(f"{where}: an env spec must be a JSON object, got {type(spec).__name__}")
    d, lost = translate_swebench(spec)
    s = EnvSpec.from_dict(d, where)
    return EnvSpec(**{**{k: getattr(s, k) for k in s.__dataclass_fields__},
                      "ignored": (*s.ignored, *(f"lost: {x}" for x in lost))})


def swebench_specs() -> dict[str, dict[str, EnvSpec]]:
    """`--env-specs swebench`: the installed swebench's MAP_REPO_VERSION_TO_SPECS (≤ 4.1), translated (above).
    What cannot be translated is recorded in `EnvSpec.ignored` as `lost: …` so callers can name it."""
    try:
        return parse_spec_map(package_specs(), "swebench")
    except SWEbenchError as exc:
        raise SpecError(str(exc)) from exc


def spec_for(instance: Any, specs: dict[str, dict[str, EnvSpec]] | None) -> EnvSpec | None:
    """The instance's own `env`, else the spec file's entry for (repo, version), else None (plain base)."""
    env = getattr(instance, "env", None)
    if env:
        return env if isinstance(env, EnvSpec) else EnvSpec.from_dict(env, f"instance {instance.instance_id}: env")
    if specs:
        version = getattr(instance, "version", None)
        by_version = specs.get(instance.repo) or {}
        if version is not None and str(version) in by_version:
            return by_version[str(version)]
    return None


def check_instance_env(d: dict[str, Any]) -> None:
    """Validate a raw instance record's `env` (called while loading instances, so bad specs stop the run)."""
    if d.get("env") not in (None, {}):
        EnvSpec.from_dict(d["env"], f"instance {d.get('instance_id')}: env")


def apply_specs(instances: dict[str, Any], specs: dict[str, dict[str, EnvSpec]] | None) -> list[str]:
    """Give each instance without `env` its spec from the map (by repo and version), so the spec travels with
    the instance to whichever executor evaluates it; and give each row without `test_cmd` SWE-bench's command
    for it (`sandbox.env.swebench`: from its `eval_script`, else from the spec's `test_cmd`). Returns notes on
    rows that got no command although they look like SWE-bench's (the reason in words)."""
    notes: list[str] = []
    for inst in instances.values():
        spec = None
        try:
            spec = spec_for(inst, specs) if specs else None
        except SpecError:
            pass  # an instance's own bad env was refused at load; nothing to add here
        if not inst.env and specs and spec is not None:
            inst.env = spec.to_dict()
            if inst.eval_script and inst.image:
                inst.image = None  # a 5.x row's registry image: the spec's environment is built instead
        if (inst.test_cmd or "").strip():
            continue
        if spec is None and specs:  # the instance's own env has no run keys: the map's may
            spec = (specs.get(inst.repo) or {}).get(str(inst.version)) if inst.version is not None else None
        try:
            got = row_command(inst, spec.run if spec is not None else None)
        except ValueError as exc:
            notes.append(f"instance {inst.instance_id}: no test command: {exc}")
            continue
        if got is not None:
            inst.test_cmd, inst.test_framework, inst.log_parser = got
    return notes
