"""Environment specs: what an instance's environment image holds (the contract: docs/environments.md).

A spec has SWE-bench's per-version keys, pip only: `python`, `apt_packages`, `packages` (a requirements file in
the repo), `pip_packages`, `pre_install`, `install`, plus `go` and `java` toolchain versions. It comes from the
instance's `env`, else from `--env-specs FILE` (`{repo: {version: spec}}`, the shape of SWE-bench's
`MAP_REPO_VERSION_TO_SPECS`), or from the installed `swebench` package (`--env-specs swebench`), translated.
Bad input raises `SpecError` with a message naming the repo/version/instance and the offending key.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

KEYS = ("python", "apt_packages", "packages", "pip_packages", "pre_install", "install", "go", "java")
# SWE-bench keys that say how to run tests or size containers, not what the environment holds: accepted so a
# dumped SWE-bench map loads, and ignored.
IGNORED_KEYS = ("test_cmd", "eval_commands", "nano_cpus", "execute_test_as_nonroot", "docker_specs",
                "no_use_env", "env_patches")
ALIASES = {"apt-pkgs": "apt_packages"}  # SWE-bench's spelling in some versions of its constants


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
    ignored: tuple[str, ...] = field(default=(), compare=False)

    @classmethod
    def from_dict(cls, d: Any, where: str) -> EnvSpec:
        if not isinstance(d, dict):
            raise SpecError(f"{where}: an env spec must be a JSON object, got {type(d).__name__}")
        d = {ALIASES.get(k, k): v for k, v in d.items()}
        unknown = sorted(k for k in d if k not in KEYS and k not in IGNORED_KEYS)
        if unknown:
            raise SpecError(f"{where}: unknown env spec key(s) {', '.join(map(repr, unknown))}; known: "
                            f"{', '.join(KEYS)}")
        out: dict[str, Any] = {"ignored": tuple(sorted(k for k in d if k in IGNORED_KEYS))}
        for key in ("python", "go", "java"):
            v = d.get(key)
            if v is None:
                continue
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                v = str(v)
            if not isinstance(v, str) or not re.fullmatch(r"\d+(\.\d+){0,2}", v.strip()):
                raise SpecError(f"{where}: `{key}` must be a version like \"3.11\", got {v!r}")
            out[key] = v.strip()
        for key in ("apt_packages", "pip_packages", "pre_install", "install"):
            if d.get(key) not in (None, "", []):
                out[key] = _strs(d[key], key, where)
        for pkg in out.get("apt_packages", ()):
            if not re.fullmatch(r"[a-z0-9][a-z0-9+.-]*(=[\w.+:~-]+)?", pkg):
                raise SpecError(f"{where}: apt package {pkg!r} is not a Debian package name")
        pk = d.get("packages")
        if pk not in (None, ""):
            if not isinstance(pk, str):
                raise SpecError(f"{where}: `packages` must name a requirements file in the repo, got {pk!r}")
            pk = pk.strip()
            if pk.startswith("/") or ".." in pk.split("/") or " " in pk:
                raise SpecError(f"{where}: `packages` must be a repo-relative requirements file, got {pk!r} "
                                "(conda package lists and environment.yml are not supported: use pip_packages)")
            out["packages"] = pk
        return cls(**out)

    def to_dict(self) -> dict[str, Any]:
        """The spec's content (what the image hash covers), without empty keys."""
        d = asdict(self)
        d.pop("ignored")
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
            out[repo][str(version)] = EnvSpec.from_dict(spec, f"{where}: {repo} version {version}")
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
    """One SWE-bench spec → (our spec dict, what could not be translated). SWE-bench builds conda envs:
    `packages` may be a conda package list or environment.yml, `pip_packages` pip pins, `python` a conda
    Python. We keep what pip and apt can do and name the rest."""
    out: dict[str, Any] = {}
    lost: list[str] = []
    for key in ("python", "pip_packages", "pre_install", "install", "apt_packages"):
        if spec.get(key):
            out[key] = spec[key]
    if spec.get("apt-pkgs"):
        out["apt_packages"] = spec["apt-pkgs"]
    pk = spec.get("packages")
    if pk == "environment.yml":
        lost.append("packages=environment.yml (a conda environment)")
    elif pk == "requirements.txt":
        out["packages"] = "requirements.txt"
    elif isinstance(pk, str) and pk.strip():
        lost.append(f"conda packages {pk.strip()!r} (added to pip_packages where pip has them)")
        out["pip_packages"] = [*out.get("pip_packages", []), *pk.split()]
    install = spec.get("install") or ""
    if isinstance(install, str) and re.search(r"\bconda\b", install):
        lost.append(f"install uses conda: {install!r}")
        out.pop("install", None)
    for cmd in spec.get("pre_install") or []:
        if re.search(r"\bconda\b", cmd):
            lost.append(f"pre_install uses conda: {cmd!r}")
    if "pre_install" in out:
        out["pre_install"] = [c for c in out["pre_install"] if not re.search(r"\bconda\b", c)]
    return out, lost


def swebench_specs() -> dict[str, dict[str, EnvSpec]]:
    """`--env-specs swebench`: SWE-bench's MAP_REPO_VERSION_TO_SPECS, translated to pip (see translate_swebench).
    What cannot be translated is recorded in `EnvSpec.ignored` as `lost: …` so callers can name it."""
    try:
        from swebench.harness.constants import MAP_REPO_VERSION_TO_SPECS  # type: ignore[import-not-found]
    except ImportError as exc:
        raise SpecError("--env-specs swebench needs the `swebench` package (pip install swebench); or pass a "
                        "JSON file {repo: {version: spec}}") from exc
    out: dict[str, dict[str, EnvSpec]] = {}
    for repo, versions in MAP_REPO_VERSION_TO_SPECS.items():
        for version, spec in versions.items():
            d, lost = translate_swebench(spec)
            s = EnvSpec.from_dict({k: v for k, v in d.items() if k in KEYS}, f"swebench {repo} {version}")
            out.setdefault(repo, {})[str(version)] = EnvSpec(**{**asdict(s), "ignored": tuple(
                f"lost: {x}" for x in lost)})
    return out


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


def apply_specs(instances: dict[str, Any], specs: dict[str, dict[str, EnvSpec]] | None) -> int:
    """Give each instance without `env` its spec from the map (by repo and version), so the spec travels with
    the instance to whichever executor evaluates it; returns how many got one."""
    n = 0
    for inst in instances.values():
        if not inst.env and specs:
            spec = spec_for(inst, specs)
            if spec is not None:
                inst.env = spec.to_dict()
                n += 1
    return n
