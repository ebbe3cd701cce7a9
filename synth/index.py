"""An sdist fetched from the package index as a plain file: never built, never run, its sha256 checked first.

`pip download` of an sdist prepares its metadata, which runs the project's `setup.py` or PEP 517 backend on
the host (a documented pip behaviour), before any hash could be checked: any package named to `gagar tasks
synth` — or a compromised release of a pinned one — would execute outside the sandbox. Here the archive is
only downloaded: the index's project page (PEP 691 JSON, or PEP 503 HTML; read by pypi-simple) names each file
with its URL and sha256; the file is streamed into a temporary file while it is hashed (pypi-simple's checked
download, which deletes a file whose digest differs), and only a file whose hash matches the index's (and the
source's pin, when it has one) is renamed into place, where `synth.sources.unpack` reads it.

The indexes are pip's own: `index-url` and `extra-index-url` as `pip config list` reports them (environment
variables such as `PIP_INDEX_URL` included, in pip's precedence: environment, then `[download]`, then
`[global]`), `https://pypi.org/simple` when none is set; `cert` is the CA bundle for HTTPS. `file://` indexes
(a local mirror, through requests-file) are read as pip reads them. Two indexes that serve different files
under one name for the same version are refused unless the source pins the sha256 (a dependency-confusion
guard).
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

import requests
from packaging.utils import InvalidSdistFilename, canonicalize_name, parse_sdist_filename
from packaging.version import InvalidVersion, Version
from pypi_simple import (
    ACCEPT_ANY,
    DigestMismatchError,
    DistributionPackage,
    ProjectPage,
    PyPISimple,
    UnsupportedContentTypeError,
    UnsupportedRepoVersionError,
)
from requests_file import FileAdapter

DEFAULT_INDEX = "https://pypi.org/simple"
MAX_BYTES = 256 << 20  # an sdist larger than this is not a project to mutate (and must not fill the disk)
_SECTIONS = (":env:", "download", "global")  # pip's precedence for `pip download`: later sections lose


class FetchError(Exception):
    """No usable sdist on the indexes, or a download that is refused; the message says why in a user's words."""


@dataclass(frozen=True)
class IndexConfig:
    indexes: tuple[str, ...]
    cert: str | bool = True
    timeout: float = 60.0


@dataclass(frozen=True)
class SdistFile:
    """A file of a project page, and the index that listed it."""

    pkg: DistributionPackage
    index: str

    @property
    def filename(self) -> str:
        return self.pkg.filename

    @property
    def sha256(self) -> str | None:
        return self.pkg.digests.get("sha256")


def pip_config(env: dict[str, str] | None = None) -> IndexConfig:
    """The index URLs, CA bundle and timeout pip would use for `pip download` (see the module docstring)."""
    proc = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True,
                          timeout=120, env=env if env is not None else os.environ.copy())
    values: dict[str, dict[str, str]] = {}
    for line in proc.stdout.splitlines():
        m = re.fullmatch(r"([^=.]*|:env:)\.([\w-]+)=(.*)", line.strip())
        if not m:
            continue
        try:
            value = ast.literal_eval(m.group(3))
        except (ValueError, SyntaxError):
            value = m.group(3)
        values.setdefault(m.group(1), {})[m.group(2)] = str(value)

    def get(*keys: str) -> str | None:
        for section in _SECTIONS:
            for key in keys:
                if key in values.get(section, {}):
                    return values[section][key]
        return None

    main = (get("index-url") or DEFAULT_INDEX).split()
    extra = (get("extra-index-url") or "").split()
    cert = get("cert")
    try:
        timeout = float(get("timeout", "default-timeout") or 60)
    except ValueError:
        timeout = 60.0
    return IndexConfig(tuple(dict.fromkeys(main[:1] + extra)), cert or True, timeout)


def _client(index: str, cfg: IndexConfig) -> PyPISimple:
    session = requests.Session()
    session.verify = cfg.cert
    session.mount("file://", FileAdapter())  # a local mirror, read as pip reads it
    return PyPISimple(index, session=session)


def _files(index: str, project: str, cfg: IndexConfig) -> list[SdistFile]:
    """The files on `index`'s project page (pypi-simple parses PEP 691 JSON and PEP 503 HTML alike)."""
    client = _client(index, cfg)
    url = client.get_project_url(project)
    if url.startswith("file:"):
        url += "index.html"  # a directory of a local index: its page, as pip reads it
    try:
        r = client.s.get(url, headers={"Accept": ACCEPT_ANY}, timeout=cfg.timeout)
        if r.status_code == 404:
            return []
        if r.status_code != 200:
            raise FetchError(f"the package index answered {r.status_code} for {url}")
        page = ProjectPage.from_response(r, project)
    except requests.RequestException as exc:
        raise FetchError(f"cannot reach the package index {url} ({type(exc).__name__}: {exc})") from exc
    except (UnsupportedContentTypeError, UnsupportedRepoVersionError, ValueError) as exc:
        raise FetchError(f"the package index page {url} is not a simple-API project page ({exc})") from exc
    return [SdistFile(p, index) for p in page.packages]


def find_sdist(name: str, version: str, cfg: IndexConfig, pinned: str | None = None) -> SdistFile:
    """The sdist of `name==version` on the configured indexes (pinned: the one with that sha256)."""
    want = Version(version)
    found: list[SdistFile] = []
    for index in cfg.indexes:
        for f in _files(index, name, cfg):
            try:
                fname, fversion = parse_sdist_filename(f.filename)
            except (InvalidSdistFilename, InvalidVersion):
                continue
            if fname == canonicalize_name(name) and fversion == want:
                found.append(f)
    where = ", ".join(cfg.indexes)
    if not found:
        raise FetchError(f"no sdist of {name}=={version} on the package index ({where}): no such project or "
                         "version, or it ships wheels only")
    if pinned:
        match = [f for f in found if (f.sha256 or "").lower() == pinned.lower()]
        unhashed = [f for f in found if not f.sha256]
        if match or unhashed:
            return (match or unhashed)[0]  # an unhashed file is checked against the pin while it downloads
        raise FetchError(f"the package index serves {found[0].filename} with sha256 {found[0].sha256}, not the "
                         f"pinned {pinned}: refusing to build tasks from another file")
    hashed = [f for f in found if f.sha256]
    if not hashed:
        raise FetchError(f"the package index ({where}) gives no sha256 for {found[0].filename}: pin it with the "
                         "source's `sha256` to have it checked")
    best = sorted(hashed, key=lambda f: not f.filename.endswith(".tar.gz"))[0]
    if len({f.sha256.lower() for f in hashed if f.filename == best.filename}) > 1:  # type: ignore[union-attr]
        raise FetchError(f"the package indexes ({where}) serve different files as {best.filename}; pin the one "
                         "you mean with the source's `sha256`")
    return best


class _Cap:
    """pypi-simple's progress hook, used as a size cap: raising in it deletes the partial download."""

    def __init__(self, filename: str, total: int | None) -> None:
        self.filename, self.size = filename, 0
        self.update(total or 0)

    def __enter__(self) -> _Cap:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def update(self, increment: int) -> None:
        self.size += increment
        if self.size > MAX_BYTES:
            raise FetchError(f"{self.filename} is larger than {MAX_BYTES >> 20} MiB: not downloaded")


def download(f: SdistFile, dest: Path, cfg: IndexConfig, pinned: str | None = None) -> tuple[Path, str]:
    """`f` into `dest`, hashed while it streams into a temporary file there (pypi-simple's checked download):
    only a file whose sha256 is the index's and the pin is renamed to its name; anything else is deleted
    before anything reads it."""
    want = {h.lower() for h in (f.sha256, pinned) if h}
    if len(want) != 1:
        raise FetchError(f"no sha256 to check {f.filename} against" if not want else
                         f"{f.filename}: the index's sha256 {f.sha256} is not the pinned {pinned}")
    [sha] = want
    safe = Path(f.filename).name
    if safe != f.filename or not re.fullmatch(r"[\w.+!-]+", safe):
        raise FetchError(f"the package index names a file {f.filename!r}: not a plain file name")
    dest.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{safe}.", suffix=".part", dir=dest)
    os.close(fd)
    pkg = replace(f.pkg, digests={**f.pkg.digests, "sha256": sha})
    try:
        _client(f.index, cfg).download_package(pkg, tmp, progress=lambda total: _Cap(safe, total),
                                               timeout=cfg.timeout)
        target = dest / safe
        os.chmod(tmp, 0o644)  # the sdists folder is shared like the repositories
        os.replace(tmp, target)
        return target, sha
    except DigestMismatchError as exc:
        raise FetchError(f"{f.filename} from {f.index} has {exc.algorithm} {exc.actual_digest}, not the expected "
                         f"{exc.expected_digest}: the download is deleted, nothing was unpacked") from exc
    except requests.HTTPError as exc:
        raise FetchError(f"the package index answered {exc.response.status_code} for {pkg.url}") from exc
    except requests.RequestException as exc:
        raise FetchError(f"the download of {pkg.url} failed ({type(exc).__name__}: {exc})") from exc
    finally:
        Path(tmp).unlink(missing_ok=True)
