"""Sandbox base images, built offline: debootstrap a Debian root, add the sandbox user, `docker import` it.

No registry is needed (or reachable on the machines this targets): each image is a minbase Debian root with a
handful of packages from the Debian mirror apt already uses. An image is tagged `:latest` and
`:<recipe hash>` and labelled `gagar.recipe=<hash>`; a build is skipped when an image with that hash exists,
so `gagar image build --all` is cheap to re-run and a changed recipe gets a fresh image.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import docker
import docker.errors

log = logging.getLogger(__name__)

# Bumped whenever the build procedure (not a package list) changes, so old images stop matching.
BUILD_FORMAT = 2
SANDBOX_UID = 1000
DEFAULT_MIRROR = "http://deb.debian.org/debian"
SUITE = "bookworm"
JUNIT_JAR = "/usr/share/java/junit-platform-console-standalone.jar"
BASE_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "HOME": "/tmp",
    "PYTHONDONTWRITEBYTECODE": "1",
}


@dataclass(frozen=True)
class Recipe:
    name: str
    packages: tuple[str, ...]
    # Shell command run inside the finished image (as the sandbox user) to prove it works.
    check: str
    env: dict[str, str] = field(default_factory=dict)
    suite: str = SUITE

    @property
    def hash(self) -> str:
        spec = {
            "format": BUILD_FORMAT,
            "name": self.name,
            "suite": self.suite,
            "packages": sorted(self.packages),
            "env": {**BASE_ENV, **self.env},
            "uid": SANDBOX_UID,
        }
        return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()

    @property
    def tag(self) -> str:
        return self.hash[:12]


RECIPES: dict[str, Recipe] = {
    r.name: r
    for r in (
        Recipe(
            "gagar-python",
            ("python3", "python3-pytest", "python-is-python3", "git"),
            check="python --version && python -m pytest --version && git --version",
        ),
        Recipe(
            "gagar-go",
            ("golang-go", "git", "ca-certificates"),
            check="go version && git --version",
            env={"GOCACHE": "/tmp/gocache", "GOPATH": "/tmp/go", "GOFLAGS": "-mod=mod", "GOPROXY": "off"},
        ),
        Recipe(
            "gagar-java",
            ("default-jdk-headless", "junit5", "git"),
            check=f"javac -version && java -version && test -f {JUNIT_JAR} && git --version",
        ),
    )
}

# Which image a task gets when it names none: by language, else by test framework.
LANGUAGE_IMAGES = {"python": "gagar-python", "go": "gagar-go", "java": "gagar-java"}
FRAMEWORK_IMAGES = {"pytest": "gagar-python", "unittest": "gagar-python", "django": "gagar-python", "sympy": "gagar-python",
                    "go": "gagar-go", "junit": "gagar-java"}


class ImageError(RuntimeError):
    """An image could not be built or found; the message says what to do."""


def select_image(image: str | None, language: str | None, framework: str | None, override: str | None = None) -> str:
    """The image an instance runs in: `--image` beats `Instance.image` beats language beats test framework."""
    if override:
        return override
    if image:
        return image
    if language and language.lower() in LANGUAGE_IMAGES:
        return LANGUAGE_IMAGES[language.lower()] + ":latest"
    if framework and framework.lower() in FRAMEWORK_IMAGES:
        return FRAMEWORK_IMAGES[framework.lower()] + ":latest"
    raise ImageError(
        f"no sandbox image for language={language!r} test_framework={framework!r}; "
        "set `image` on the instance or pass --image"
    )


def debian_mirror(sources_dir: Path = Path("/etc/apt")) -> str:
    """The Debian archive apt already uses (deb822 `.sources` or one-line `.list`), so builds work offline-ish
    machines that only reach a local mirror. `GAGAR_DEBIAN_MIRROR` overrides it."""
    env = os.environ.get("GAGAR_DEBIAN_MIRROR")
    if env:
        return env
    files = [sources_dir / "sources.list"]
    d = sources_dir / "sources.list.d"
    if d.is_dir():
        files += sorted(d.iterdir())
    for f in files:
        try:
            text = f.read_text()
        except OSError:
            continue
        if f.suffix == ".sources":
            for stanza in re.split(r"\n\s*\n", text):
                fields = dict(
                    (m.group(1).lower(), m.group(2).strip())
                    for m in re.finditer(r"^(\w[\w-]*):\s*(.*)$", stanza, re.M)
                )
                suites = fields.get("suites", "").split()
                if any(s == SUITE for s in suites):
                    for uri in fields.get("uris", "").split():
                        if uri.rstrip("/").endswith("/debian"):
                            return uri.rstrip("/")
        else:
            for line in text.splitlines():
                parts = re.sub(r"\[[^\]]*\]", "", line.split("#", 1)[0]).split()
                if len(parts) >= 3 and parts[0] == "deb" and parts[2] == SUITE and parts[1].rstrip("/").endswith("/debian"):
                    return parts[1].rstrip("/")
    return DEFAULT_MIRROR


def _client(timeout: int = 900) -> docker.DockerClient:
    try:
        client = docker.from_env(timeout=timeout)
        client.ping()
    except docker.errors.DockerException as exc:
        raise ImageError(f"cannot reach the Docker engine ({exc}); run `make docker` or start dockerd") from exc
    return client


def find_image(client: docker.DockerClient, recipe: Recipe) -> docker.models.images.Image | None:
    # Both labels: an image layered on this one (an environment image) inherits its labels, and must never be
    # taken for the base (and retagged `:latest`).
    found = client.images.list(filters={"label": [f"gagar.recipe={recipe.hash}", f"gagar.image={recipe.name}"]})
    return found[0] if found else None


def image_exists(client: docker.DockerClient, name: str) -> bool:
    try:
        client.images.get(name)
        return True
    except docker.errors.ImageNotFound:
        return False


def _mounts_under(root: Path) -> list[str]:
    prefix = str(root.resolve())
    out = []
    with open("/proc/mounts") as f:
        for line in f:
            mnt = line.split()[1].replace("\\040", " ")
            if mnt == prefix or mnt.startswith(prefix + "/"):
                out.append(mnt)
    return sorted(out, key=len, reverse=True)


def _remove_root(root: Path) -> None:
    """debootstrap mounts /proc and /sys inside the root; a failed run can leave them mounted, and deleting
    through a mounted /sys would be a disaster, so unmount first and refuse to delete if anything stays."""
    for mnt in _mounts_under(root):
        subprocess.run(["umount", "-l", mnt], check=False)
    if _mounts_under(root):
        raise ImageError(f"{root} still has mounts under it; not deleting it (clean up by hand)")
    shutil.rmtree(root, ignore_errors=True)


def _add_sandbox_user(root: Path) -> None:
    """A fixed uid 1000 `sandbox` user, so the run user has a name and the image needs no chroot tools."""
    etc = root / "etc"
    with open(etc / "passwd", "a") as f:
        f.write(f"sandbox:x:{SANDBOX_UID}:{SANDBOX_UID}:gagar sandbox:/home/sandbox:/bin/bash\n")
    with open(etc / "group", "a") as f:
        f.write(f"sandbox:x:{SANDBOX_UID}:\n")
    if (etc / "shadow").exists():
        with open(etc / "shadow", "a") as f:
            f.write("sandbox:!:19000:0:99999:7:::\n")
    home = root / "home" / "sandbox"
    home.mkdir(parents=True, exist_ok=True)
    os.chown(home, SANDBOX_UID, SANDBOX_UID)
    # Mount points the runner binds into; present in the image because the root fs is mounted read-only.
    for d in ("testbed", "gagar/report"):
        p = root / d
        p.mkdir(parents=True, exist_ok=True)
        os.chown(p, SANDBOX_UID, SANDBOX_UID)


def _slim(root: Path) -> None:
    for pattern in ("var/cache/apt/archives/*.deb", "var/lib/apt/lists/*", "usr/share/doc/*", "usr/share/man/*"):
        for p in root.glob(pattern):
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)


def _import(client: docker.DockerClient, root: Path, recipe: Recipe) -> str:
    env = {**BASE_ENV, **recipe.env}
    changes = [f"ENV {k}={v}" for k, v in env.items()]
    changes += [
        f"LABEL gagar.recipe={recipe.hash}",
        f"LABEL gagar.image={recipe.name}",
        "WORKDIR /testbed",
        'CMD ["/bin/bash"]',
    ]
    # Stream the tar straight into the engine: an 800 MB image never sits in memory or on disk twice.
    tar = subprocess.Popen(
        ["tar", "-C", str(root), "--numeric-owner", "--exclude=./proc/*", "--exclude=./sys/*",
         "--exclude=./dev/*", "-c", "."],
        stdout=subprocess.PIPE,
    )
    try:
        out = client.api.import_image_from_stream(tar.stdout, repository=recipe.name, tag=recipe.tag, changes=changes)
    finally:
        tar.stdout.close()
        rc = tar.wait()
    if rc != 0:
        raise ImageError(f"{recipe.name}: tar of the root failed (exit {rc})")
    status = [json.loads(line) for line in str(out).splitlines() if line.strip().startswith("{")]
    image_id = next((s.get("status") for s in reversed(status) if str(s.get("status", "")).startswith("sha256:")), None)
    if any("error" in s for s in status):
        raise ImageError(f"{recipe.name}: docker import failed: {status}")
    image = client.images.get(f"{recipe.name}:{recipe.tag}")
    image.tag(recipe.name, "latest")
    return image_id or image.id


def _check(client: docker.DockerClient, image: str, recipe: Recipe) -> None:
    try:
        out = client.containers.run(
            image, ["bash", "-c", recipe.check], user=str(SANDBOX_UID), network_mode="none", remove=True,
            labels={"gagar.sandbox": "1", "gagar.run": "image-check"}, stderr=True,
        )
        log.info("%s check: %s", recipe.name, out.decode(errors="replace").strip().replace("\n", " | "))
    except docker.errors.ContainerError as exc:
        raise ImageError(f"{recipe.name}: the built image fails its check `{recipe.check}`: {exc.stderr!r}") from exc


def build_image(
    recipe: Recipe,
    *,
    force: bool = False,
    mirror: str | None = None,
    client: docker.DockerClient | None = None,
    say: Callable[[str], None] = print,
) -> tuple[str, bool]:
    """Build one image; returns (`name:hash-tag`, built?) — built is False when an up-to-date image existed."""
    client = client or _client()
    ref = f"{recipe.name}:{recipe.tag}"
    existing = find_image(client, recipe)
    if existing is not None and not force:
        if f"{recipe.name}:latest" not in existing.tags:
            existing.tag(recipe.name, "latest")
        say(f"{recipe.name}: up to date ({ref})")
        return ref, False
    if os.geteuid() != 0:
        raise ImageError("building images needs root (debootstrap); run `sudo gagar image build --all`")
    if shutil.which("debootstrap") is None:
        raise ImageError("debootstrap is not installed; `apt-get install debootstrap` (or `make docker`)")
    mirror = mirror or debian_mirror()
    work = Path(tempfile.mkdtemp(prefix=f"{recipe.name}-build-", dir=os.environ.get("GAGAR_BUILD_DIR", "/var/tmp")))
    root = work / "root"
    logfile = work / "debootstrap.log"
    try:
        say(f"{recipe.name}: debootstrap {recipe.suite} from {mirror} (+{','.join(recipe.packages)})")
        with open(logfile, "wb") as lf:
            rc = subprocess.run(
                ["debootstrap", "--variant=minbase", f"--include={','.join(recipe.packages)}",
                 recipe.suite, str(root), mirror],
                stdout=lf, stderr=subprocess.STDOUT,
            ).returncode
        if rc != 0:
            tail = logfile.read_text(errors="replace").splitlines()[-15:]
            raise ImageError(f"{recipe.name}: debootstrap failed (exit {rc}):\n" + "\n".join(tail))
        _add_sandbox_user(root)
        _slim(root)
        say(f"{recipe.name}: importing into Docker as {ref}")
        _import(client, root, recipe)
    finally:
        _remove_root(root)
        shutil.rmtree(work, ignore_errors=True)
    _check(client, ref, recipe)
    say(f"{recipe.name}: built {ref} (+ :latest)")
    return ref, True


def list_images(client: docker.DockerClient | None = None) -> list[dict]:
    """One row per recipe: whether its current hash is built, and the image's size and tags."""
    client = client or _client()
    rows = []
    for recipe in RECIPES.values():
        img = find_image(client, recipe)
        latest = None
        try:
            latest = client.images.get(f"{recipe.name}:latest")
        except docker.errors.ImageNotFound:
            pass
        rows.append({
            "name": recipe.name,
            "recipe": recipe.tag,
            "status": "built" if img else ("stale" if latest else "missing"),
            "tags": sorted((img or latest).tags) if (img or latest) else [],
            "size_mb": round((img or latest).attrs.get("Size", 0) / 1e6) if (img or latest) else None,
            "created": (img or latest).attrs.get("Created", "")[:19] if (img or latest) else "",
        })
    return rows
