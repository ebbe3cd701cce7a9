"""Which toolchain (and so which base image) an instance needs: Python, Go and Java versions per Debian suite.

Debian bookworm gives Python 3.11, Go 1.19 and JDK 17 (the `gagar-python|go|java` images every machine builds
in `make setup`); trixie gives Python 3.13, Go 1.24 and JDK 21 (`gagar-*-trixie`), bullseye Python 3.9
(`gagar-python-bullseye`, the Python most SWE-bench specs pin) — these are built on demand the first time an
instance asks for them: ≈40–75 s each. Python must match exactly (`python: "3.12"` is an error naming what is
offered); Go and Java versions are minimums (the smallest offered toolchain at or above the request wins), since
both keep old code compiling. For Go without a `go` key, `go.mod`'s `go`/`toolchain` lines decide.

`build_failure` tells an environment problem (toolchain too old, a dependency the image does not hold) from a
test failure, so such a run is an `infra_error` naming the cause rather than a silent `unresolved`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sandbox.env.images import JUNIT_JAR, RECIPES, Recipe

GO_IMAGE_ENV = {
    "GOCACHE": "/tmp/gocache", "GOPATH": "/tmp/go", "GOFLAGS": "-mod=mod", "GOPROXY": "off",
    # Never fetch a newer toolchain behind the user's back: a too-new go.mod must fail loudly (infra_error).
    "GOTOOLCHAIN": "local",
}

TRIXIE_RECIPES: dict[str, Recipe] = {
    r.name: r
    for r in (
        Recipe("gagar-python-trixie", ("python3", "python3-pytest", "python-is-python3", "git"),
               check="python --version && python -m pytest --version && git --version", suite="trixie"),
        Recipe("gagar-go-trixie", ("golang-go", "git", "ca-certificates"), check="go version && git --version",
               env=GO_IMAGE_ENV, suite="trixie"),
        Recipe("gagar-java-trixie", ("default-jdk-headless", "junit5", "git"),
               check=f"javac -version && java -version && test -f {JUNIT_JAR} && git --version", suite="trixie"),
    )
}
# Python 3.9: SWE-bench pins it for requests, seaborn, pylint, sphinx, sympy, pytest, astropy and Django 4.1/4.2.
OLD_RECIPES: dict[str, Recipe] = {
    r.name: r
    for r in (
        Recipe("gagar-python-bullseye", ("python3", "python3-pytest", "python-is-python3", "git"),
               check="python --version && python -m pytest --version && git --version", suite="bullseye"),
    )
}
ALL_RECIPES: dict[str, Recipe] = {**RECIPES, **TRIXIE_RECIPES, **OLD_RECIPES}

# version → base image; what the Debian suites ship (checked by each image's `check` at build).
PYTHON_BASES = {"3.9": "gagar-python-bullseye", "3.11": "gagar-python", "3.13": "gagar-python-trixie"}
GO_BASES = {"1.19": "gagar-go", "1.24": "gagar-go-trixie"}
JAVA_BASES = {"17": "gagar-java", "21": "gagar-java-trixie"}
LANG_BASES = {"python": PYTHON_BASES, "go": GO_BASES, "java": JAVA_BASES}
DEFAULT_VERSION = {"python": "3.11", "go": "1.19", "java": "17"}


class ToolchainError(ValueError):
    """No base image offers the toolchain asked for; the message names the versions that are offered."""


def _vkey(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v)[:3])


def offered(language: str) -> str:
    return ", ".join(f"{v} ({ALL_RECIPES[n].suite})" for v, n in LANG_BASES[language].items())


def base_for(language: str, version: str | None) -> tuple[str, str]:
    """(base image name, toolchain version it gives) for `language` at `version` (None: the default)."""
    bases = LANG_BASES[language]
    if version is None:
        v = DEFAULT_VERSION[language]
        return bases[v], v
    version = str(version).strip()
    if not re.fullmatch(r"\d+(\.\d+){0,2}", version):
        raise ToolchainError(f"{language} version {version!r} is not a version number; offered: {offered(language)}")
    if language == "python":
        mm = ".".join(version.split(".")[:2])
        if mm not in bases:
            raise ToolchainError(f"python {version} is not offered by any base image; offered: {offered('python')}")
        return bases[mm], mm
    fits = [v for v in bases if _vkey(v) >= _vkey(version)]
    if not fits:
        raise ToolchainError(f"{language} {version} is newer than any base image offers; offered: {offered(language)}")
    v = min(fits, key=_vkey)
    return bases[v], v


@dataclass(frozen=True)
class GoMod:
    go: str | None
    toolchain: str | None
    requires: tuple[str, ...]

    @property
    def wanted(self) -> str | None:
        """The toolchain to pick: the `toolchain` line when newer than `go` (it is what the authors test
        with), else the `go` line (the minimum)."""
        cands = [v for v in (self.go, self.toolchain) if v]
        return max(cands, key=_vkey) if cands else None


def parse_go_mod(text: str) -> GoMod:
    go = tc = None
    requires: list[str] = []
    in_block = False
    for raw in text.splitlines():
        line = raw.split("//", 1)[0].strip()
        if in_block:
            if line == ")":
                in_block = False
            elif line:
                requires.append(line.split()[0])
            continue
        if m := re.fullmatch(r"go\s+(\d+(?:\.\d+){0,2})", line):
            go = m.group(1)
        elif m := re.fullmatch(r"toolchain\s+go(\d+(?:\.\d+){0,2})\S*", line):
            tc = m.group(1)
        elif line.startswith("require"):
            rest = line[len("require"):].strip()
            if rest == "(":
                in_block = True
            elif rest:
                requires.append(rest.split()[0])
    return GoMod(go, tc, tuple(requires))


# Standard packages newer than Go 1.19 (the oldest toolchain offered): importing one needs a newer Go.
NEW_STD = {"slices": "1.21", "maps": "1.21", "cmp": "1.21", "log/slog": "1.21", "iter": "1.23", "unique": "1.23",
           "math/rand/v2": "1.22", "crypto/ecdh": "1.20", "testing/slogtest": "1.21", "structs": "1.23",
           "weak": "1.24", "crypto/sha3": "1.24", "crypto/hkdf": "1.24", "crypto/pbkdf2": "1.24"}
_GO_TOO_OLD = re.compile(r"go\.mod requires go >= ?(\S+?) \(running go (\S+?)[;)]")
_GO_BAD_VERSION = re.compile(r"invalid go version '(\S+?)': must match format")
_GO_NOT_STD = re.compile(r'([^\s:"]+\.go):\d+:\d+: package (\S+?) is not in (?:GOROOT|std)')
_GO_NO_MODULE = re.compile(r"(?:no required module provides package|missing go\.sum entry for module providing "
                           r"package|cannot find module providing package) ([^\s;:\\\"]+)")
_JAVA_TOO_OLD = re.compile(r"(?:invalid (?:target|source) release:?|release version) (\d+)")


def build_failure(framework: str, output: str, *, tests_ran: bool, patch_paths: list[str] | tuple[str, ...] = (),
                  declared_modules: tuple[str, ...] = ()) -> str | None:
    """The environment problem that kept the suite from running, or None (then the verdict stands).

    Only consulted when no test ran, and only for causes the patch did not bring: a go.mod the patch left
    alone, a new standard package imported from a file the patch did not touch, a module the repo itself
    declares. So a patch cannot turn its own build error into an infra_error (which earns no failing reward).
    """
    if tests_ran:
        return None
    fw = (framework or "").lower()
    touched = set(patch_paths)
    if fw == "go":
        m = _GO_TOO_OLD.search(output)
        if m and "go.mod" not in touched:
            return (f"toolchain too old: go.mod requires go >= {m.group(1)}, the image has go {m.group(2)}; "
                    "set env.go (offered: " + offered("go") + ")")
        m = _GO_BAD_VERSION.search(output)  # Go before 1.21 cannot even read `go 1.21.0`
        if m and "go.mod" not in touched:
            return (f"toolchain too old: go.mod says go {m.group(1)}, which this Go cannot read; set env.go "
                    f"(offered: {offered('go')})")
        for m in _GO_NOT_STD.finditer(output):
            path, pkg = m.group(1), m.group(2)
            if pkg in NEW_STD and not any(path.endswith(t) or t.endswith(path) for t in touched):
                return (f"toolchain too old: {path} imports {pkg}, in the standard library since Go "
                        f"{NEW_STD[pkg]}; set env.go (offered: {offered('go')})")
        for m in _GO_NO_MODULE.finditer(output):
            pkg = m.group(1)
            if any(pkg == mod or pkg.startswith(mod + "/") for mod in declared_modules):
                return (f"missing Go module dependency: {pkg} (declared in go.mod) is not in the image; give the "
                        "instance an env so modules are downloaded at image build, or vendor them")
    elif fw == "junit":
        m = _JAVA_TOO_OLD.search(output)
        if m:
            return f"toolchain too old: the build asks for Java {m.group(1)}; set env.java (offered: {offered('java')})"
    return None


def go_requires(tree) -> tuple[str, ...]:
    """The modules go.mod declares in `tree` (the host's base copy, never a rollout's tree)."""
    from pathlib import Path

    try:
        return parse_go_mod((Path(tree) / "go.mod").read_text(errors="replace")).requires
    except OSError:
        return ()
