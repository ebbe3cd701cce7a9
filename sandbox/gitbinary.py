"""Git binary patches: what a `GIT binary patch` section makes git write, read without inflating anything.

A section is a forward hunk (`literal N` or `delta N`, base85 lines, a blank line) and an optional reverse hunk
of the same shape. git inflates every hunk to its declared size N, and applying a forward delta writes the
target size the delta's own header declares: `BinarySection.size` adds them up, so `sandbox.patchcheck` can cap
what a patch of a kilobyte would write on the host (`max_expand_bytes`) before any applier runs.
"""

from __future__ import annotations

import base64
import re
import zlib


class MalformedBinary(ValueError):
    """A binary section git would not read; the message names the line (the validator rejects the patch)."""


def _show(line: str) -> str:
    return repr(line[:60].encode("utf-8", "surrogateescape").decode("utf-8", "replace"))


_BIN_HUNK = re.compile(r"^(literal|delta) (\d+)\s*$")
_B85_LINE = re.compile(r"^[A-Za-z][0-9A-Za-z!#$%&()*+\-;<=>?@^_`{|}~]+\s*$")


def _b85_line(line: str) -> bytes:
    """One line of a git binary hunk: a length character (A-Z: 1-26, a-z: 27-52), then base85."""
    n = ord(line[0]) - (ord("A") - 1 if line[0] <= "Z" else ord("a") - 27)
    return base64.b85decode(line[1:].rstrip())[:n]


def _delta_result_size(data: bytes) -> int:
    """The target size a git delta declares in its header (two little-endian base-128 varints: source size,
    then target size), read from the first bytes of the deflated delta."""
    head = zlib.decompressobj().decompress(data, 32)
    sizes, shift, val = [], 0, 0
    for byte in head:
        val |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            sizes.append(val)
            if len(sizes) == 2:
                return sizes[1]
            shift = val = 0
    raise ValueError("truncated delta header")


class BinarySection:
    """A `GIT binary patch` section being read: a forward hunk (`literal N` / `delta N` + base85 lines + a
    blank line) and an optional reverse hunk of the same shape. `size` is what git inflates for it."""

    def __init__(self, start: int) -> None:
        self.start, self.hunks, self.header, self.data, self.size = start, 0, None, b"", 0

    def feed(self, no: int, line: str) -> bool:
        """Take one line; False when the section has ended before it (the line is not part of it)."""
        if self.header is None:
            m = _BIN_HUNK.match(line)
            if not m:
                if self.hunks:
                    return False
                raise MalformedBinary(f"line {no}: malformed binary patch (started at line {self.start}): expected "
                                      f"'literal N' or 'delta N', got {_show(line)}")
            self.header, self.hunks = (m.group(1), int(m.group(2))), self.hunks + 1
            return True
        if line.strip():
            if not _B85_LINE.match(line):
                raise MalformedBinary(f"line {no}: malformed binary patch (started at line {self.start}): "
                                      f"{_show(line)} is not a base85 data line")
            if self.header[0] == "delta" and self.hunks == 1 and len(self.data) < 64:
                self.data += _b85_line(line)
            return True
        kind, declared = self.header
        self.size += declared  # git inflates every hunk to its declared size
        if kind == "delta" and self.hunks == 1:
            try:
                self.size += _delta_result_size(self.data)  # what applying the forward delta writes
            except (ValueError, zlib.error):
                raise MalformedBinary(f"line {no}: malformed binary delta (started at line {self.start})") from None
        self.header, self.data = None, b""
        return True
