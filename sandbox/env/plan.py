"""Which image each instance runs in, once environments exist: `plan_instance` turns an instance (+ spec map) into
an `EnvTarget` — a plain base image, or an environment image to build (`EnvPlan`) — plus the test-time
environment variables that go with it.

An `EnvPlan` is content-addressed: its hash covers the base image's recipe hash, the repo, the commit the
environment is built from, the toolchain and every spec key, and the build procedure's format. Instances (and
all their rollouts) with equal plans share one image.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandbox.env.images import select_image
from sandbox.env.spec import EnvSpec, SpecError, spec_for
from sandbox.env.toolchains import ALL_RECIPES, GoMod, ToolchainError, base_for, parse_go_mod
from sandbox.integrity import gitsafe

ENV_FORMAT = 3  # bumped when the build procedure changes, so old environment images stop matching
# 3: the venv gets `pytest`/`py.test` launchers on its own interpreter when it has none (sandbox/env/image.py)
FRAMEWORK_LANGUAGE = {"pytest": "python", "unittest": "python", "django": "python", "sympy": "python", "go": "go",
                      "junit": "java"}
GO_MODCACHE = "/opt/gomodcache"


class EnvInputError(ValueError):
    """The instance's environment cannot be planned: bad spec, unknown commit, missing requirements file,
    a toolchain no base offers. `gagar image build` exits 2 on it; `gagar eval` gives infra_error."""


def _file_at(clone: Path, commit: str, path: str) -> bytes | None:
    res = gitsafe.run("show", f"{commit}:{path}", git_dir=gitsafe.git_dir_of(clone), trusted_dir=clone, binary=True)
    return res.out if res.ok else None  # type: ignore[return-value]


@dataclass(frozen=True)
class EnvPlan:
    repo: str
    clone: Path
    commit: str
    language: str
    base: str  # base image name (a recipe in toolchains.ALL_RECIPES)
    toolchain: str
    spec: EnvSpec
    go_download: bool = False  # download go.mod's modules at build (no vendor/ at the commit)
    # SWE-bench's `requirements.txt` / `environment.yml`, read from the repo at `commit` (sandbox.env.swebench):
    # pip requirement lines that must install, and conda packages installed with pip where PyPI has them.
    requirements: tuple[str, ...] = ()
    conda: tuple[str, ...] = ()
    requirements_from: str | None = None

    @property
    def hash(self) -> str:
        doc = {"format": ENV_FORMAT, "base": ALL_RECIPES[self.base].hash, "repo": self.repo, "commit": self.commit,
               "language": self.language, "toolchain": self.toolchain, "spec": self.spec.to_dict(),
               "go_download": self.go_download}
        if self.requirements or self.conda:  # only then: older plans keep their hashes (and their images)
            doc["resolved"] = {"requirements": list(self.requirements), "conda": list(self.conda),
                               "conda_install": "pip --ignore-installed"}
        return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()

    @property
    def name(self) -> str:
        slug = re.sub(r"[^a-z0-9]+", "-", self.repo.lower().replace("/", "__").replace("__", "--")).strip("-")
        return f"gagar-env-{slug}"[:100]

    @property
    def ref(self) -> str:
        return f"{self.name}:{self.hash[:12]}"

    def describe(self) -> str:
        s = self.spec
        bits = [f"{self.language} {self.toolchain}"]
        if s.apt_packages:
            bits.append(f"{len(s.apt_packages)} apt")
        if self.requirements_from:
            bits.append(f"{len(self.requirements)} from {self.requirements_from}")
        elif s.packages:
            bits.append(f"-r {s.packages}")
        if self.conda:
            bits.append(f"{len(self.conda)} conda→pip")
        if s.pip_packages:
            bits.append(f"{len(s.pip_packages)} pip")
        if self.go_download:
            bits.append("go modules")
        if s.install:
            bits.append("install")
        return f"{self.repo}@{self.commit[:10]} ({', '.join(bits)})"


@dataclass
class EnvTarget:
    """Where an instance runs: `image` (a base or an env image ref), `plan` when that image is an env image to
    build, `base` when a base image may need building first, and extra test-time environment variables."""

    image: str
    plan: EnvPlan | None = None
    base: str | None = None
    test_env: dict[str, str] = field(default_factory=dict)


def _language(instance: Any, spec: EnvSpec | None) -> str | None:
    if instance.language and instance.language.lower() in ("python", "go", "java"):
        return instance.language.lower()
    fw = FRAMEWORK_LANGUAGE.get((instance.test_framework or "").lower())
    return fw or (spec.language if spec else None)


def plan_instance(instance: Any, repos_dir: Path | None, specs: dict[str, dict[str, EnvSpec]] | None = None,
                  override: str | None = None) -> EnvTarget:
    """Decide the image for one instance (see the module docstring). Raises EnvInputError on bad input."""
    if override or instance.image:
        return EnvTarget(select_image(instance.image, instance.language, instance.test_framework, override))
    try:
        spec = spec_for(instance, specs)
    except SpecError as exc:
        raise EnvInputError(str(exc)) from exc
    lang = _language(instance, spec)
    if spec is None and lang != "go":
        return EnvTarget(select_image(None, instance.language, instance.test_framework))
    if lang is None:
        raise EnvInputError(f"instance {instance.instance_id}: cannot tell its language; set `language`")
    clone = Path(repos_dir or ".") / instance.repo.replace("/", "__")
    commit = getattr(instance, "environment_setup_commit", None) or instance.base_commit
    usable = clone.is_dir() and gitsafe.run("cat-file", "-e", f"{commit}^{{commit}}",
                                            git_dir=gitsafe.git_dir_of(clone), trusted_dir=clone).ok
    if not usable and spec is None:  # Go without a spec: the default toolchain; the workspace reports the clone
        return EnvTarget(select_image(None, instance.language, instance.test_framework))
    if not clone.is_dir():
        raise EnvInputError(f"instance {instance.instance_id}: no clone at {clone}")
    if not usable:
        raise EnvInputError(f"instance {instance.instance_id}: commit {commit} is not in {clone}")
    spec = spec or EnvSpec()
    gomod: GoMod | None = None
    want = {"python": spec.python, "go": spec.go, "java": spec.java}[lang]
    if lang == "go":
        raw = _file_at(clone, commit, "go.mod")
        gomod = parse_go_mod(raw.decode(errors="replace")) if raw is not None else None
        if want is None and gomod is not None:
            want = gomod.wanted
    try:
        base, version = base_for(lang, want)
    except ToolchainError as exc:
        where = "go.mod" if lang == "go" and not spec.go else f"env.{lang}"
        raise EnvInputError(f"instance {instance.instance_id}: {exc} (asked by {where})") from exc
    reqs, conda, reqs_from = _resolve_packages(instance, spec, clone, commit)
    vendored = lang == "go" and _file_at(clone, commit, "vendor/modules.txt") is not None
    go_download = bool(gomod and gomod.requires and not vendored)
    test_env = {"GOFLAGS": "-mod=vendor"} if vendored else {}
    installs = (spec.apt_packages or spec.packages or spec.conda_packages or spec.pip_packages or spec.pre_install
                or spec.install)
    if not installs and not go_download:
        return EnvTarget(f"{base}:latest", base=base, test_env=test_env)  # toolchain choice only: no env layer
    plan = EnvPlan(instance.repo, clone, commit, lang, base, version, spec, go_download, reqs, conda, reqs_from)
    return EnvTarget(plan.ref, plan=plan, base=base, test_env=test_env)


def _resolve_packages(instance: Any, spec: EnvSpec, clone: Path, commit: str
                      ) -> tuple[tuple[str, ...], tuple[str, ...], str | None]:
    """(pip requirement lines, conda packages, the file they came from) for the spec's `packages`: SWE-bench's
    `requirements.txt` and `environment.yml` are found and read where SWE-bench looks (sandbox.env.swebench);
    any other value is a requirements file that must exist at the commit (pip reads it at build)."""
    from sandbox.env.swebench import environment_yml, requirements

    def read(path: str) -> str | None:
        raw = _file_at(clone, commit, path)
        return raw.decode(errors="replace") if raw is not None else None

    where = f"instance {instance.instance_id}: `packages`"
    try:
        if spec.packages == "requirements.txt":
            path, lines = requirements(instance.repo, read)
            return tuple(lines), spec.conda_packages, path
        if spec.packages == "environment.yml":
            path, conda, pip = environment_yml(instance.repo, read)
            return tuple(pip), (*spec.conda_packages, *conda), path
    except ValueError as exc:
        raise EnvInputError(f"{where} {spec.packages!r}: {exc} in {instance.repo} at {commit[:12]}") from exc
    if spec.packages and read(spec.packages) is None:
        raise EnvInputError(f"{where} file {spec.packages!r} does not exist in {instance.repo} at {commit[:12]}")
    return (), spec.conda_packages, None
