"""The sdists of `gagar tasks synth --sdist` / `gagar tasks repos` come from the package index as plain files:
never built, so the project's own build code never runs on the host, and checked against the index's sha256
(and the source's pin) before anything reads them. The index is a real HTTP server on 127.0.0.1 that speaks
PEP 691 JSON or PEP 503 HTML, as PyPI does; the sdist's `setup.py` and in-tree build backend write a marker."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from synth import sources as src_mod
from synth.index import FetchError, find_sdist, pip_config

ROOT = Path(__file__).resolve().parents[1]


def _evil_sdist(marker: Path, *, tests: bool = True) -> bytes:
    """An sdist whose build code (a setup.py, and an in-tree PEP 517 backend that needs nothing installed, so
    pip reaches it offline) writes `marker`: anything that prepares its metadata runs it."""
    setup = f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran on the host')\n"
    backend = ("def _run():\n    exec(open('setup.py').read())\n\n"
               "def get_requires_for_build_wheel(config_settings=None):\n    _run()\n    return []\n\n"
               "def prepare_metadata_for_build_wheel(d, config_settings=None):\n    import os\n    _run()\n"
               "    os.makedirs(os.path.join(d, 'evilpkg-1.0.dist-info'))\n"
               "    with open(os.path.join(d, 'evilpkg-1.0.dist-info', 'METADATA'), 'w') as f:\n"
               "        f.write('Metadata-Version: 2.1\\nName: evilpkg\\nVersion: 1.0\\n')\n"
               "    return 'evilpkg-1.0.dist-info'\n\n"
               "def build_wheel(d, config_settings=None, metadata_directory=None):\n    _run()\n    raise SystemExit(1)\n\n"
               "get_requires_for_build_sdist = get_requires_for_build_wheel\n")
    files = {"setup.py": setup, "evil_backend.py": backend,
             "pyproject.toml": "[build-system]\nrequires = []\nbuild-backend = 'evil_backend'\nbackend-path = ['.']\n",
             "PKG-INFO": "Metadata-Version: 2.1\nName: evilpkg\nVersion: 1.0\n",
             "evilpkg/__init__.py": "def f(x):\n    return x + 1\n",
             **({"tests/test_f.py": "from evilpkg import f\n\n\ndef test_f():\n    assert f(1) == 2\n"} if tests else {})}
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"evilpkg-1.0/{name}")
            info.size, info.mtime = len(data), 1700000000
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


class _Index:
    """A PEP 691 / PEP 503 simple index of one project on 127.0.0.1; `advertised` is the sha256 it claims."""

    def __init__(self, sdist: bytes) -> None:
        self.sdist, self.advertised, self.json = sdist, hashlib.sha256(sdist).hexdigest(), True
        self.requests: list[str] = []
        index = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
                index.requests.append(self.path)
                if self.path.rstrip("/") == "/simple/evilpkg":
                    if index.json and "application/vnd.pypi.simple.v1+json" in self.headers.get("Accept", ""):
                        body = json.dumps({"meta": {"api-version": "1.0"}, "name": "evilpkg", "files": [
                            {"filename": "evilpkg-1.0.tar.gz", "url": "../../files/evilpkg-1.0.tar.gz",
                             "hashes": {"sha256": index.advertised}}]}).encode()
                        kind = "application/vnd.pypi.simple.v1+json"
                    else:
                        body = (f'<!DOCTYPE html><html><body><a href="/files/evilpkg-1.0.tar.gz#sha256='
                                f'{index.advertised}">evilpkg-1.0.tar.gz</a></body></html>').encode()
                        kind = "text/html"
                elif self.path == "/files/evilpkg-1.0.tar.gz":
                    body, kind = index.sdist, "application/octet-stream"
                else:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/simple"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[_Index, Path]]:
    marker = tmp_path / "MARKER-build-code-ran"
    idx = _Index(_evil_sdist(marker))
    # pip's own configuration decides the index: only this one (no config files, no extra index).
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_INDEX_URL", idx.url)
    monkeypatch.delenv("PIP_EXTRA_INDEX_URL", raising=False)
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    yield idx, marker
    idx.server.shutdown()


@pytest.mark.parametrize("api", ["json", "html"])
def test_an_sdist_is_fetched_and_unpacked_without_running_its_build_code(index, tmp_path: Path, api: str) -> None:
    idx, marker = index
    idx.json = api == "json"
    assert pip_config().indexes == (idx.url,)
    got = src_mod.prepare(src_mod.Source(sdist="evilpkg==1.0"), tmp_path / "out", {})
    assert not marker.exists(), "the sdist's build code ran on the host"
    assert got.sha256 == hashlib.sha256(idx.sdist).hexdigest()
    assert "setup.py" in got.files and got.test_files == ["tests/test_f.py"] and "evilpkg/__init__.py" in got.sources
    assert "/files/evilpkg-1.0.tar.gz" in idx.requests


def test_a_file_whose_hash_is_not_the_index_s_or_the_pin_is_deleted_before_anything_reads_it(index, tmp_path: Path):
    idx, marker = index
    good = hashlib.sha256(idx.sdist).hexdigest()
    idx.advertised = "0" * 64  # the index (or a proxy) serves another file than it announces
    with pytest.raises(src_mod.SourceError, match="has sha256 .* not the expected"):
        src_mod.prepare(src_mod.Source(sdist="evilpkg==1.0"), tmp_path / "out", {})
    assert not any((tmp_path / "out" / "sdists").iterdir()) and not (tmp_path / "out" / "repos").exists()
    idx.advertised = good
    with pytest.raises(FetchError, match="not the pinned"):  # a pin the index contradicts: never downloaded
        find_sdist("evilpkg", "1.0", pip_config(), pinned="1" * 64)
    assert not marker.exists()
    # A second index serving another file under the same name: refused unless the source pins one.
    other = _Index(idx.sdist + b"\0")
    other.advertised = hashlib.sha256(other.sdist).hexdigest()
    try:
        os.environ["PIP_EXTRA_INDEX_URL"] = other.url
        with pytest.raises(FetchError, match="serve different files"):
            find_sdist("evilpkg", "1.0", pip_config())
        assert find_sdist("evilpkg", "1.0", pip_config(), pinned=good).index == idx.url
    finally:
        os.environ.pop("PIP_EXTRA_INDEX_URL")
        other.server.shutdown()


def test_gagar_tasks_synth_sdist_never_runs_the_build_code(index, tmp_path: Path) -> None:
    """The CLI path: the sdist is downloaded, unpacked and committed (then skipped: it ships no tests, so no
    Docker is needed), and its build code has not run."""
    idx, marker = index
    idx.sdist = _evil_sdist(marker, tests=False)
    idx.advertised = hashlib.sha256(idx.sdist).hexdigest()
    proc = subprocess.run([sys.executable, "-m", "gagar", "tasks", "synth", "--sdist", "evilpkg==1.0", "--out",
                           str(tmp_path / "out"), "--quiet"], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=300)
    assert not marker.exists(), proc.stderr[-2000:]
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert "ships no tests" in manifest["sources"][0]["reason"], manifest["sources"][0]
    [got] = (tmp_path / "out" / "sdists").iterdir()
    assert got.name == "evilpkg-1.0.tar.gz" and hashlib.sha256(got.read_bytes()).hexdigest() == idx.advertised


def test_a_local_file_index_is_read_as_pip_reads_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A `file://` index (a local mirror: one directory per project holding its index.html, links relative to
    it) serves the sdist as an HTTP index does; a project it lacks is 'no sdist', not an error."""
    marker = tmp_path / "MARKER-build-code-ran"
    sdist = _evil_sdist(marker)
    (tmp_path / "files").mkdir()
    (tmp_path / "files" / "evilpkg-1.0.tar.gz").write_bytes(sdist)
    page = tmp_path / "simple" / "evilpkg" / "index.html"
    page.parent.mkdir(parents=True)
    page.write_text(f'<!DOCTYPE html><html><body><a href="../../files/evilpkg-1.0.tar.gz#sha256='
                    f'{hashlib.sha256(sdist).hexdigest()}">evilpkg-1.0.tar.gz</a></body></html>')
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_INDEX_URL", (tmp_path / "simple").as_uri())
    monkeypatch.delenv("PIP_EXTRA_INDEX_URL", raising=False)
    got = src_mod.prepare(src_mod.Source(sdist="evilpkg==1.0"), tmp_path / "out", {})
    assert got.sha256 == hashlib.sha256(sdist).hexdigest() and got.test_files == ["tests/test_f.py"]
    assert not marker.exists()
    with pytest.raises(FetchError, match="no sdist of otherpkg==1.0"):
        find_sdist("otherpkg", "1.0", pip_config())


def test_an_oversized_download_is_cut_off_and_deleted(index, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from synth import index as index_mod

    idx, marker = index
    monkeypatch.setattr(index_mod, "MAX_BYTES", len(idx.sdist) - 1)
    with pytest.raises(src_mod.SourceError, match="larger than"):
        src_mod.prepare(src_mod.Source(sdist="evilpkg==1.0"), tmp_path / "out", {})
    assert not any((tmp_path / "out" / "sdists").iterdir()) and not marker.exists()
