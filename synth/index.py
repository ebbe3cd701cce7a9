"""An sdist fetched from the package index as a plain file: never built, never run, its sha256 checked first.

`pip download` of an sdist prepares its metadata, which runs the project's `setup.py` or PEP 517 backend on
the host (a documented pip behaviour), before any hash could be checked: any package named to `gagar tasks
synth` — or a compromised release of a pinned one — would execute outside the sandbox. Here the archive is
only downloaded: the index's project page (PEP 691 JSON, or PEP 503 HTML) names each file with its URL and
sha256; the file is streamed into a temporary file while it is hashed, and only a file whose hash matches the
index's (and the source's pin, when it has one) is renamed into place, where `synth.sources.unpack` reads it.

The indexes are pip's own: `index-url` and `extra-index-url` as `pip config list` reports them (environment
variables such as `PIP_INDEX_URL` included, in pip's precedence: environment, then `[download]`, then
`[global]`), `https://pypi.org/simple` when none is set; `cert` is the CA bundle for HTTPS. `file://` indexes
(a local mirror) are read as pip reads them. Two indexes that serve different files under one name for the
same version are refused unless the source pins the sha256 (a dependency-confusion guard).
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urldefrag, urljoin, urlparse
from urllib.request import url2pathname

import requests
from packaging.utils import InvalidSdistFilename, canonicalize_name, parse_sdist_filename
from packaging.version import InvalidVersion, Version

DEFAULT_INDEX = "https://pypi.org/simple"
ACCEPT = "application/vnd.pypi.simple.v1+json, application/vnd.pypi.simple.v1+html;q=0.2, text/html;q=0.01"
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
    filename: str
    url: str
    sha256: str | None
    index: str


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


class _Links(HTMLParser):
    """PEP 503: each `<a href="URL#sha256=…">filename</a>` of a project page."""

    def __init__(self) -> None:
        super().__init__()
        self.links: list[tuple[str, str]] = []
        self._href: str | None = None
        self._text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self._href, self._text = dict(attrs).get("href"), []

    def handle_data(self, data: str) -> None:
        if self._href is not None:
            self._text.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "a" and self._href is not None:
            self.links.append((self._href, "".join(self._text).strip()))
            self._href = None


def _read_page(url: str, cfg: IndexConfig) -> tuple[str, str] | None:
    """(content type, text) of an index's project page; None when the index does not have the project."""
    if url.startswith("file:"):
        path = Path(url2pathname(urlparse(url).path))
        page = path / "index.html" if path.is_dir() else path
        if not page.is_file():
            return None
        return "text/html", page.read_text(encoding="utf-8", errors="replace")
    try:
        r = requests.get(url, headers={"Accept": ACCEPT}, timeout=cfg.timeout, verify=cfg.cert)
    except requests.RequestException as exc:
        raise FetchError(f"cannot reach the package index {url} ({type(exc).__name__}: {exc})") from exc
    if r.status_code == 404:
        return None
    if r.status_code != 200:
        raise FetchError(f"the package index answered {r.status_code} for {url}")
    return r.headers.get("Content-Type", "text/html").split(";")[0].strip(), r.text


def _files(index: str, project: str, cfg: IndexConfig) -> list[SdistFile]:
    page_url = f"{index.rstrip('/')}/{canonicalize_name(project)}/"
    got = _read_page(page_url, cfg)
    if got is None:
        return []
    kind, text = got
    out = []
    if kind == "application/vnd.pypi.simple.v1+json":
        try:
            rows = json.loads(text).get("files", [])
        except (ValueError, AttributeError) as exc:
            raise FetchError(f"the package index page {page_url} is not valid PEP 691 JSON ({exc})") from exc
        for row in rows:
            if isinstance(row, dict) and isinstance(row.get("url"), str) and isinstance(row.get("filename"), str):
                hashes = row.get("hashes") if isinstance(row.get("hashes"), dict) else {}
                out.append(SdistFile(row["filename"], urljoin(page_url, row["url"]), hashes.get("sha256"), index))
        return out
    parser = _Links()
    parser.feed(text)
    for href, label in parser.links:
        url, frag = urldefrag(urljoin(page_url, href))
        digest = dict(p.split("=", 1) for p in frag.split("&") if "=" in p).get("sha256")
        name = label or unquote(urlparse(url).path.rsplit("/", 1)[-1])
        out.append(SdistFile(name, url, digest, index))
    return out


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


def download(f: SdistFile, dest: Path, cfg: IndexConfig, pinned: str | None = None) -> tuple[Path, str]:
    """`f` into `dest`, hashed while it streams into a temporary file there: only a file whose sha256 is the
    index's (and the pin) is renamed to its name; anything else is deleted before anything reads it."""
    want = [h.lower() for h in (f.sha256, pinned) if h]
    if not want:
        raise FetchError(f"no sha256 to check {f.filename} against")
    safe = Path(f.filename).name
    if safe != f.filename or not re.fullmatch(r"[\w.+!-]+", safe):
        raise FetchError(f"the package index names a file {f.filename!r}: not a plain file name")
    dest.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    size = 0
    fd, tmp = tempfile.mkstemp(prefix=f".{safe}.", suffix=".part", dir=dest)
    try:
        with os.fdopen(fd, "wb") as out:
            for chunk in _stream(f.url, cfg):
                size += len(chunk)
                if size > MAX_BYTES:
                    raise FetchError(f"{f.filename} is larger than {MAX_BYTES >> 20} MiB: not downloaded")
                digest.update(chunk)
                out.write(chunk)
        got = digest.hexdigest()
        if any(got != h for h in want):
            raise FetchError(f"{f.filename} from {f.index} has sha256 {got}, not the expected "
                             f"{' / '.join(dict.fromkeys(want))}: the download is deleted, nothing was unpacked")
        target = dest / safe
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; the sdists folder is shared like the repositories
        os.replace(tmp, target)
        return target, got
    finally:
        Path(tmp).unlink(missing_ok=True)


def _stream(url: str, cfg: IndexConfig):
    if url.startswith("file:"):
        try:
            with open(url2pathname(urlparse(url).path), "rb") as fh:
                yield from iter(lambda: fh.read(1 << 16), b"")
        except OSError as exc:
            raise FetchError(f"cannot read {url}: {exc.strerror or exc}") from exc
        return
    try:
        with requests.get(url, stream=True, timeout=cfg.timeout, verify=cfg.cert) as r:
            if r.status_code != 200:
                raise FetchError(f"the package index answered {r.status_code} for {url}")
            yield from r.iter_content(1 << 16)
    except requests.RequestException as exc:
        raise FetchError(f"the download of {url} failed ({type(exc).__name__}: {exc})") from exc
