"""What a test run may produce, bounded while it runs: output (kept head and tail) and disk writes under the
host mounts (a watchdog). Used by the one-shot test runs and the agent's long-lived container."""

from __future__ import annotations

import subprocess
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

TRUNC_MARK = "\n[gagar: output truncated: {dropped} bytes dropped]\n"
# Where the output *is* the report a verdict is read from (`go test -json`, runners without a report file), it is
# kept whole up to this bound, apart from the capped copy that is logged; past it the run is an infra_error.
STDOUT_REPORT_BYTES = 64 << 20


class OutputCap:
    """Keeps the first `limit` bytes and a short tail; counts what was dropped in between. Streaming, so a
    test printing 100 MB costs a read loop, not 100 MB of memory.

    With `report_limit`, the whole stream is also kept (in memory up to `limit`, then in a temp file) until it
    passes `report_limit`: `report()` returns it, or None once it went over (`report_over`)."""

    def __init__(self, limit: int, report_limit: int = 0) -> None:
        self.limit = limit
        self.tail_limit = min(limit // 4, 64 << 10)
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0
        self.report_limit = report_limit
        self.report_over = False
        self._whole = tempfile.SpooledTemporaryFile(max_size=max(limit, 1 << 20)) if report_limit > 0 else None

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        if self._whole is not None:
            if self.total > self.report_limit:
                self.report_over = True
                self._whole.close()
                self._whole = None
            else:
                self._whole.write(chunk)
        room = self.limit - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk and self.tail_limit:
            self.tail += chunk
            if len(self.tail) > 2 * self.tail_limit:
                del self.tail[: len(self.tail) - self.tail_limit]

    def _kept_tail(self) -> bytes:
        return bytes(self.tail[-self.tail_limit :]) if self.tail_limit else b""

    @property
    def truncated(self) -> bool:
        return self.total > len(self.head) + len(self._kept_tail())

    def report(self) -> str | None:
        """The whole output (kept with `report_limit`), or None: not kept, or over its bound."""
        if self._whole is None:
            return None
        self._whole.seek(0)
        data = self._whole.read()
        self._whole.close()
        self._whole = None
        return data.decode("utf-8", errors="replace")

    def text(self) -> str:
        tail = self._kept_tail()
        dropped = self.total - len(self.head) - len(tail)
        body = bytes(self.head)
        if dropped > 0:
            body += TRUNC_MARK.format(dropped=dropped).encode()
        return (body + tail).decode("utf-8", errors="replace")


def disk_bytes(paths: tuple[Path, ...]) -> int:
    """Disk use under `paths`, each entry counted as at least one 4 KiB block so that a flood of empty files
    (inodes) counts too. GNU find walks trees of any depth (a test can nest directories past PATH_MAX, where
    os.walk recurses out) and never follows symlinks."""
    proc = subprocess.run(["find", *map(str, paths), "-xdev", "-printf", "%b\n"], capture_output=True, text=True)
    return sum(max(int(b) * 512, 4096) for b in proc.stdout.split() if b.isdigit())


class WriteWatch(threading.Thread):
    """Calls `on_trip` (kill or restart the container) once more than `limit` bytes (or files) were added under
    the host mounts. A bind mount has no quota, so without this a test could fill the host's disk (it writes
    ~1 GB/s). Polled twice a second: the overshoot is what the tests write in that time.

    `base` is the size the limit counts from (default: now); it trips only while the tree is bigger than when
    the watch started, so a long-lived container past its cap can still run the command that cleans up."""

    def __init__(self, paths: tuple[Path, ...], limit: int, on_trip: Callable[[], None], interval: float = 0.5, *,
                 base: int | None = None) -> None:
        super().__init__(daemon=True, name="gagar-write-watch")
        self.paths, self.limit, self.on_trip, self.interval = paths, limit, on_trip, interval
        self.tripped = False
        self._halt = threading.Event()
        self._start = disk_bytes(paths) if limit > 0 else 0
        self._base = self._start if base is None else base

    def run(self) -> None:
        while self.limit > 0 and not self._halt.wait(self.interval):
            now = disk_bytes(self.paths)
            if now - self._base > self.limit and now > self._start:
                self.tripped = True
                self.on_trip()
                return

    def stop(self) -> None:
        self._halt.set()
