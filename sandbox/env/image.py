"""Environment images: a base image plus one repository's environment, built once per `EnvPlan` hash.

The build runs in a container of the base image, as root, with the network on (Docker's bridge, or
`$GAGAR_BUILD_NETWORK`) and the host's CA bundle mounted read-only (TLS-intercepting proxies re-sign PyPI's
certificate): the repo at the plan's commit is copied to /testbed, then `pre_install`, apt packages, a venv
(`/opt/venv`, seeing the base's pytest) with the requirements file and pip packages, Go module downloads, then
`install`; the source is deleted and the container committed as `gagar-env-<repo>:<hash>` with labels naming
the plan. Evaluation later mounts each rollout's tree at /testbed with the network off, as for base images.

A file lock per image (`$GAGAR_LOCK_DIR`, default /var/tmp/gagar-locks) makes concurrent runs build an image
once: the second waits, then finds it. Every build writes a log; a failure raises `EnvBuildError` whose message
names the cause and the log's path.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shlex
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import docker
import docker.errors
from docker.types import Mount

from sandbox.env.images import ImageError, build_image, find_image
from sandbox.env.plan import ENV_FORMAT, GO_MODCACHE, EnvPlan
from sandbox.env.toolchains import ALL_RECIPES
from sandbox.integrity import gitsafe

CA_BUNDLES = ("/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt")
BUILD_CA = "/gagar/build-ca.crt"
VENV = "/opt/venv"
BUILD_LABELS = {"gagar.sandbox": "1", "gagar.run": "env-build"}
# Labels a layered image would inherit from its base, blanked on commit: `gagar.recipe` marks a base image.
INHERITED_LABELS = ("gagar.recipe",)
BUILD_TIMEOUT = float(os.environ.get("GAGAR_ENV_BUILD_TIMEOUT", "1800"))


class EnvBuildError(ImageError):
    """An environment image could not be built; the message says why and where the log is."""


def lock_dir() -> Path:
    return Path(os.environ.get("GAGAR_LOCK_DIR", "/var/tmp/gagar-locks"))


def default_log_dir() -> Path:
    return Path(os.environ.get("GAGAR_ENV_LOG_DIR", Path.home() / ".cache" / "gagar" / "env-builds"))


@contextmanager
def file_lock(name: str) -> Iterator[None]:
    """An exclusive flock, held across processes (and across threads: each call opens its own descriptor)."""
    d = lock_dir()
    d.mkdir(parents=True, exist_ok=True)
    path = d / (re.sub(r"[^A-Za-z0-9._-]+", "_", name) + ".lock")
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def ensure_base(name: str, client: docker.DockerClient, say: Callable[[str], None]) -> str:
    """`name:<recipe tag>`, bootstrapping the base image first if this machine has none (trixie ones are built
    on demand, not by `make setup`)."""
    recipe = ALL_RECIPES[name]
    if find_image(client, recipe) is None:
        with file_lock(f"base-{name}"):
            if find_image(client, recipe) is None:
                say(f"base image {name}: not built yet; bootstrapping it ({recipe.suite}), ≈1 min")
            build_image(recipe, client=client, say=say)
    return f"{name}:{recipe.tag}"


def _q(items: tuple[str, ...]) -> str:
    return " ".join(shlex.quote(x) for x in items)


def _heredoc(path: str, lines: tuple[str, ...]) -> str:
    return f"cat > {path} <<'GAGAR_EOF_7c1d'\n" + "\n".join(lines) + "\nGAGAR_EOF_7c1d"


def build_script(plan: EnvPlan) -> str:
    """The shell script run as root in the build container; each step echoes a `== step` marker so a failure
    can be attributed to its step."""
    s = plan.spec
    lines = [
        "set -euo pipefail",
        "export DEBIAN_FRONTEND=noninteractive PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 "
        "PIP_ROOT_USER_ACTION=ignore PIP_NO_INPUT=1",
        f"if [ -f {BUILD_CA} ]; then export SSL_CERT_FILE={BUILD_CA} PIP_CERT={BUILD_CA} "
        f"REQUESTS_CA_BUNDLE={BUILD_CA} GIT_SSL_CAINFO={BUILD_CA} CURL_CA_BUNDLE={BUILD_CA}; fi",
        "cd /testbed",
    ]
    for cmd in s.pre_install:
        lines += [f"echo {shlex.quote('== pre_install: ' + cmd)}", cmd]
    apt = list(s.apt_packages)
    if apt:
        lines += [f"echo {shlex.quote('== apt: ' + ' '.join(apt))}", "apt-get update -qq",
                  f"apt-get install -y -q --no-install-recommends {_q(tuple(apt))}"]
    if plan.language == "python":
        lines += ["echo '== venv'", f"python3 -m venv --system-site-packages {VENV}",
                  f"export PATH={VENV}/bin:$PATH VIRTUAL_ENV={VENV}",
                  # The sandbox runs tests in a login shell, whose /etc/profile resets PATH: put the venv back.
                  f"echo 'export PATH={VENV}/bin:$PATH VIRTUAL_ENV={VENV}' > /etc/profile.d/00-gagar-venv.sh"]
        if plan.conda:
            # SWE-bench's conda packages: pip where PyPI has them; the others are named in the log and skipped.
            lines += [f"echo {shlex.quote('== conda packages (pip): ' + ' '.join(plan.conda))}",
                      _heredoc("/tmp/gagar-conda.txt", plan.conda),
                      # --ignore-installed: conda makes a fresh env with these packages, so the base's Debian copies
                      # (bullseye's pytest 6, without a `pytest` command) must not stand in for them
                      "python -m pip install --ignore-installed -r /tmp/gagar-conda.txt || while read -r req; do "
                      "python -m pip install --ignore-installed \"$req\" || "
                      "echo \"== conda-only (pip cannot install it): $req\"; done < /tmp/gagar-conda.txt"]
        if plan.requirements_from:
            lines += [f"echo {shlex.quote(f'== packages: {s.packages} ({plan.requirements_from}, as SWE-bench reads it)')}",
                      _heredoc("/tmp/gagar-requirements.txt", plan.requirements),
                      "python -m pip install -r /tmp/gagar-requirements.txt"]
        elif s.packages:
            lines += [f"echo {shlex.quote('== packages: ' + s.packages)}",
                      f"python -m pip install -r {shlex.quote(s.packages)}"]
        if s.pip_packages:
            lines += [f"echo {shlex.quote('== pip_packages: ' + ' '.join(s.pip_packages))}",
                      f"python -m pip install {_q(s.pip_packages)}"]
    if plan.go_download:
        proxy = os.environ.get("GAGAR_GOPROXY") or "https://proxy.golang.org,direct"
        lines += ["echo '== go modules'",
                  f"export GOMODCACHE={GO_MODCACHE} GOFLAGS=-mod=mod GOPROXY={shlex.quote(proxy)} "
                  "GOCACHE=/tmp/gobuild GOPATH=/tmp/go GOTOOLCHAIN=local",
                  "go mod download", "go list -deps -test ./... >/dev/null"]
    for cmd in s.install:
        lines += [f"echo {shlex.quote('== install: ' + cmd)}", cmd]
    if plan.language == "python":
        lines += _venv_launchers()
    lines += ["echo '== cleanup'", "cd /", "find /testbed -mindepth 1 -delete",
              "rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb /root/.cache /tmp/* 2>/dev/null || true",
              f"for d in {VENV} {GO_MODCACHE}; do [ -e $d ] && chmod -R a+rX $d; done; true",
              "echo '== done'"]
    return "\n".join(lines) + "\n"


# Test runners the base image has as Debian scripts (`#!/usr/bin/python3`): that interpreter does not see the
# venv's site-packages, so a command `pytest …` — SWE-bench's own — ran the tests without the environment's
# packages and editable install (`No module named 'flask'` in conftest.py, exit 4), where `python -m pytest` in
# the same container passed. When the venv has no launcher of its own, it gets one bound to its interpreter.
VENV_LAUNCHERS = ("pytest", "py.test")


def _venv_launchers() -> list[str]:
    body = (f"#!{VENV}/bin/python\n# gagar: the base image's pytest, run by the environment's interpreter\n"
            "import sys\nimport pytest\nsys.exit(pytest.main())\n")
    return ["echo '== venv launchers'",
            f"for s in {' '.join(VENV_LAUNCHERS)}; do if [ ! -e {VENV}/bin/$s ] && {VENV}/bin/python -c 'import pytest'"
            f" 2>/dev/null; then printf {shlex.quote(body)} > {VENV}/bin/$s && chmod 755 {VENV}/bin/$s && "
            "echo \"== launcher: $s (the base's pytest, on the venv's python)\"; fi; done"]


_CAUSES = (
    (re.compile(r"No matching distribution found for (\S+)"), "pip cannot find {0} on the package index"),
    (re.compile(r"ERROR: Could not find a version that satisfies the requirement (\S+)"),
     "pip cannot find {0} on the package index"),
    (re.compile(r"E: Unable to locate package (\S+)"), "apt cannot find package {0}"),
    (re.compile(r"Could not open requirements file: .*?'([^']+)'"), "requirements file {0} is missing"),
    (re.compile(r"requires a different Python: (\S+) not in '([^']+)'"),
     "the package needs Python {1}; the image has {0}"),
    (re.compile(r"dial tcp .*|proxy\.golang\.org.*(?:timeout|refused|no such host)"),
     "Go module download failed: the module proxy is unreachable (set GAGAR_GOPROXY, or vendor the modules)"),
    (re.compile(r"(?:Temporary failure in name resolution|Network is unreachable|Failed to establish a new "
                r"connection)"), "no network at build time (try GAGAR_BUILD_NETWORK=host)"),
)


def failure_cause(log_text: str) -> str:
    """A one-line reason for a failed build, from its log: a known pattern, else the failing step."""
    for pat, msg in _CAUSES:
        m = pat.search(log_text)
        if m:
            return msg.format(*m.groups())
    steps = re.findall(r"^== (.+)$", log_text, re.M)
    step = steps[-1] if steps else "setup"
    tail = [ln for ln in log_text.strip().splitlines() if ln.strip() and not ln.startswith("==")][-1:]
    return f"step `{step}` failed" + (f": {tail[0][:200]}" if tail else "")


def _copy_source(container, plan: EnvPlan) -> None:
    """The repo at the plan's commit into /testbed, streamed from `git archive` (nothing else of the clone)."""
    try:
        with gitsafe.stream("archive", "--format=tar", plan.commit, git_dir=gitsafe.git_dir_of(plan.clone),
                            trusted_dir=plan.clone) as tar:
            container.put_archive("/testbed", tar)
    except gitsafe.GitError as exc:
        raise EnvBuildError(f"git archive {plan.commit[:12]} of {plan.clone} failed: {str(exc)[-300:]}") from exc


def _commit_changes(plan: EnvPlan, base_ref: str, client: docker.DockerClient) -> list[str]:
    env = dict(e.split("=", 1) for e in client.images.get(base_ref).attrs["Config"].get("Env") or [])
    if plan.language == "python":
        env["PATH"] = f"{VENV}/bin:" + env.get("PATH", "/usr/bin:/bin")
        env["VIRTUAL_ENV"] = VENV
    if plan.go_download:
        env["GOMODCACHE"] = GO_MODCACHE
    labels = {"gagar.env": plan.hash, "gagar.env.repo": plan.repo, "gagar.env.commit": plan.commit,
              "gagar.env.base": base_ref, "gagar.env.toolchain": f"{plan.language} {plan.toolchain}",
              "gagar.image": plan.name}
    # Values quoted as JSON strings: a label like "python 3.11" is otherwise read as two key=value pairs.
    return ([f"ENV {k}={json.dumps(v)}" for k, v in env.items()]
            + [f"LABEL {k}={json.dumps(v)}" for k, v in labels.items()] + ["WORKDIR /testbed", 'CMD ["/bin/bash"]'])


def find_env_image(client: docker.DockerClient, plan: EnvPlan):
    found = client.images.list(filters={"label": f"gagar.env={plan.hash}"})
    return found[0] if found else None


def build_env_image(plan: EnvPlan, *, client: docker.DockerClient, log_dir: Path | None = None,
                    say: Callable[[str], None] = print) -> tuple[str, bool]:
    """Build (or find) the plan's image; returns (ref, built?). Raises EnvBuildError naming cause and log."""
    if find_env_image(client, plan) is not None:
        return plan.ref, False
    log_dir = Path(log_dir or default_log_dir())
    log_dir.mkdir(parents=True, exist_ok=True)
    base_ref = ensure_prepared(plan, client, log_dir, say)
    with file_lock(f"env-{plan.hash[:16]}"):
        if find_env_image(client, plan) is not None:  # another run built it while we waited
            say(f"env image {plan.ref}: built meanwhile by another run")
            return plan.ref, False
        log_path = log_dir / f"{plan.name}-{plan.hash[:12]}.log"
        say(f"env image {plan.ref}: building {plan.describe()}; log {log_path}")
        t0 = time.monotonic()
        _run_build(plan, base_ref, client, log_path)
        img = client.images.get(plan.ref)
        say(f"env image {plan.ref}: built in {time.monotonic() - t0:.0f} s, {img.attrs.get('Size', 0) / 1e6:.0f} MB")
        skipped = re.findall(r"^== conda-only \(pip cannot install it\): (.+)$", log_path.read_text(errors="replace"),
                             re.M)
        if skipped:
            say(f"env image {plan.ref}: conda-only packages left out (pip cannot install them): {', '.join(skipped)}")
        return plan.ref, True


def _run_build(plan: EnvPlan, base_ref: str, client: docker.DockerClient, log_path: Path) -> None:
    _build_layer(client, base_ref, build_script(plan), log_path=log_path, header=f"{plan.ref}: {plan.describe()}",
                 repository=plan.name, tag=plan.hash[:12], changes=_commit_changes(plan, base_ref, client),
                 what=f"env image for {plan.repo}@{plan.commit[:10]}", source=plan)


def _build_layer(client: docker.DockerClient, base_ref: str, script: str, *, log_path: Path, header: str,
                 repository: str, tag: str, changes: list[str], what: str, source: EnvPlan | None = None) -> None:
    """Run `script` as root in a container of `base_ref` (network on, host CA mounted), then commit it."""
    ca = next((p for p in [os.environ.get("GAGAR_BUILD_CA", ""), *CA_BUNDLES] if p and Path(p).is_file()), None)
    # A bind mount in HostConfig only (`volumes=` would also declare a VOLUME that the commit keeps).
    mounts = [Mount(BUILD_CA, ca, type="bind", read_only=True)] if ca else []
    network = os.environ.get("GAGAR_BUILD_NETWORK", "bridge")
    try:
        c = _start_build(client, base_ref, script, network, mounts, source)
        if c is None and network == "bridge":
            # Engines started without a bridge (`--bridge=none`, dockerd inside a container, a deleted docker0)
            # cannot attach one; the host's network is the only way out there. Said in the log.
            network = "host"
            c = _start_build(client, base_ref, script, network, mounts, source)
    except docker.errors.DockerException as exc:
        raise EnvBuildError(f"{what}: cannot create the build container: {exc}") from exc
    if c is None:
        raise EnvBuildError(f"{what}: cannot start a build container on network {network!r} "
                            "(set GAGAR_BUILD_NETWORK)")
    killer = threading.Timer(BUILD_TIMEOUT, _kill, args=(c,))
    try:
        killer.start()
        with open(log_path, "wb") as lf:
            lf.write(f"# {header}\n# base {base_ref}, network {network}"
                     f"{' (no bridge on this engine)' if network == 'host' and 'GAGAR_BUILD_NETWORK' not in os.environ else ''}\n".encode())
            for chunk in c.logs(stream=True, follow=True):
                lf.write(chunk)
        rc = c.wait(timeout=60).get("StatusCode")
        if rc != 0:
            cause = (f"timed out after {BUILD_TIMEOUT:.0f} s (GAGAR_ENV_BUILD_TIMEOUT)" if killer.finished.is_set()
                     else failure_cause(log_path.read_text(errors="replace")))
            raise EnvBuildError(f"{what} failed to build: {cause} (log: {log_path})")
        # The build container's own labels would be inherited by every container of the image (and make
        # `gagar sandbox gc` treat a user's container as ours): blank them.
        c.commit(repository=repository, tag=tag, changes=changes + [f'LABEL {k}=""' for k in (*BUILD_LABELS, *INHERITED_LABELS)])
    except (docker.errors.DockerException, OSError) as exc:
        raise EnvBuildError(f"{what}: {exc} (log: {log_path})") from exc
    finally:
        killer.cancel()
        try:
            c.remove(force=True)
        except docker.errors.DockerException:
            pass


def _start_build(client: docker.DockerClient, base_ref: str, script: str, network: str, mounts: list,
                 source: EnvPlan | None):
    """A started build container with the source copied in, or None when the network cannot be attached."""
    c = client.containers.create(base_ref, ["bash", "-c", script], user="0", working_dir="/testbed",
                                 network_mode=network, mounts=mounts, labels=dict(BUILD_LABELS))
    try:
        if source is not None:
            _copy_source(c, source)
        c.start()
        return c
    except docker.errors.APIError as exc:
        c.remove(force=True)
        if "network" in str(exc) or "bridge" in str(exc) or "endpoint" in str(exc):
            return None
        raise EnvBuildError(f"cannot start a build container from {base_ref}: {exc}") from exc
    except BaseException:
        c.remove(force=True)
        raise


def _kill(c) -> None:
    try:
        c.kill()
    except docker.errors.DockerException:
        pass


# Packages every environment of a language needs (python: venv), installed once per base into a cached layer.
PREP_PACKAGES = {"python": ("python3-venv",)}


def ensure_prepared(plan: EnvPlan, client: docker.DockerClient, log_dir: Path,
                    say: Callable[[str], None]) -> str:
    """The image env builds start from: the base, plus PREP_PACKAGES for the language (cached, shared)."""
    base_ref = ensure_base(plan.base, client, say)
    pkgs = PREP_PACKAGES.get(plan.language)
    if not pkgs:
        return base_ref
    h = hashlib.sha256(json.dumps([ENV_FORMAT, ALL_RECIPES[plan.base].hash, pkgs]).encode()).hexdigest()
    name, ref = f"{plan.base}-envbase", f"{plan.base}-envbase:{h[:12]}"
    if client.images.list(filters={"label": f"gagar.envbase={h}"}):
        return ref
    with file_lock(f"envbase-{h[:16]}"):
        if not client.images.list(filters={"label": f"gagar.envbase={h}"}):
            log_path = log_dir / f"{name}-{h[:12]}.log"
            say(f"env base {ref}: adding {' '.join(pkgs)} to {base_ref}; log {log_path}")
            env = client.images.get(base_ref).attrs["Config"].get("Env") or []
            script = ("set -eu; export DEBIAN_FRONTEND=noninteractive; apt-get update -qq; "
                      f"apt-get install -y -q --no-install-recommends {_q(pkgs)}; "
                      "rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb")
            changes = ([f"ENV {e.split('=', 1)[0]}={json.dumps(e.split('=', 1)[1])}" for e in env]
                       + [f"LABEL gagar.envbase={h}", f"LABEL gagar.image={name}", "WORKDIR /testbed",
                          'CMD ["/bin/bash"]'])
            _build_layer(client, base_ref, script, log_path=log_path, header=ref, repository=name, tag=h[:12],
                         changes=changes, what=f"env base {ref}")
    return ref


def prepare_images(instances: list, *, repos_dir: Path | None, specs: dict | None = None, override: str | None = None,
                   max_workers: int = 1, log_dir: Path | None = None, say: Callable[[str], None] = print,
                   client: docker.DockerClient | None = None) -> tuple[dict[str, str], dict[str, str],
                                                                         dict[str, dict[str, str]]]:
    """For a run: each instance's image (built here when missing: each distinct plan once, `max_workers` at a
    time), errors by instance id (input problems and build failures, for infra_error), test-time env by id."""
    from concurrent.futures import ThreadPoolExecutor

    from sandbox.env.plan import EnvInputError, plan_instance

    images: dict[str, str] = {}
    errors: dict[str, str] = {}
    extra_env: dict[str, dict[str, str]] = {}
    targets = {}
    for inst in instances:
        try:
            targets[inst.instance_id] = t = plan_instance(inst, repos_dir, specs, override)
        except (EnvInputError, ImageError) as exc:
            errors[inst.instance_id] = str(exc)
            continue
        images[inst.instance_id] = t.image
        extra_env[inst.instance_id] = t.test_env
    plans = {t.plan.hash: t.plan for t in targets.values() if t.plan is not None}
    bases = {t.base for t in targets.values() if t.base and t.plan is None}
    if not plans and not bases:
        return images, errors, extra_env
    if client is None:
        from sandbox import container as ctr

        client = ctr.client(http_timeout=max(900, int(BUILD_TIMEOUT)))
    failed: dict[str, str] = {}

    def one_base(name: str) -> None:
        try:
            ensure_base(name, client, say)
        except ImageError as exc:
            failed[f"base:{name}"] = f"base image {name} could not be built: {exc}"

    def one_plan(plan: EnvPlan) -> None:
        try:
            build_env_image(plan, client=client, log_dir=log_dir, say=say)
        except ImageError as exc:
            failed[plan.hash] = str(exc)

    with ThreadPoolExecutor(max(1, max_workers), thread_name_prefix="gagar-envbuild") as pool:
        list(pool.map(one_base, sorted(bases)))
        list(pool.map(one_plan, plans.values()))
    for iid, t in targets.items():
        key = t.plan.hash if t.plan is not None else f"base:{t.base}"
        if key in failed:
            errors[iid] = failed[key]
            images.pop(iid, None)
    return images, errors, extra_env
