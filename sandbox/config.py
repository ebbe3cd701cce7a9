"""Sandbox settings: the limits every container runs under, on by default."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*$", re.I)


def parse_size(text: str | int) -> int:
    """`2g`, `512m`, `1.5GiB`, `1048576` → bytes (Docker's units: powers of 1024)."""
    if isinstance(text, int):
        return text
    m = _SIZE.match(str(text))
    if not m:
        raise ValueError(f"not a size: {text!r} (use e.g. 512m, 2g)")
    mult = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}[m.group(2).lower()]
    return int(float(m.group(1)) * mult)


@dataclass
class SandboxConfig:
    repos_dir: Path | str | None = None
    image: str | None = None  # overrides every instance's image
    memory: str = "2g"
    cpus: float = 1.0
    pids_limit: int = 256
    timeout: float = 600.0
    max_workers: int = 1
    output_limit_bytes: int = 1 << 20
    # Bytes the tests may add to the host-mounted work tree + report dir; past it the container is killed
    # (a bind mount has no quota: unchecked, a test could fill the host's disk).
    max_write_bytes: int = 2 << 30
    max_patch_bytes: int = 1 << 20
    # Bytes a patch's git binary hunks may inflate to when applied on the host (a 1 MiB hunk can declare GiBs).
    max_apply_bytes: int = 64 << 20
    network: str = "none"
    tmpfs_size: str = "512m"
    user: str = "1000:1000"
    run_id: str = "adhoc"
    # The OCI runtime dockerd starts containers with (None: the engine's default, runc). `crun` starts them
    # faster where scripts/ensure_docker.sh could register it; every limit above applies the same way.
    runtime: str | None = None

    def __post_init__(self) -> None:
        if self.repos_dir is not None:
            self.repos_dir = Path(self.repos_dir)
        parse_size(self.memory)
        parse_size(self.tmpfs_size)
        if self.cpus <= 0:
            raise ValueError("cpus must be > 0")
        if self.timeout <= 0:
            raise ValueError("timeout must be > 0")
        if self.max_workers < 1:
            raise ValueError("max_workers must be >= 1")
        if self.pids_limit < 16:
            raise ValueError("pids_limit must be >= 16 (a shell plus a test runner need a few)")

    @property
    def memory_bytes(self) -> int:
        return parse_size(self.memory)

    def host_config_kwargs(self) -> dict:
        """The `containers.create` keyword arguments that enforce the limits."""
        mem = self.memory_bytes
        return {
            "network_mode": self.network,
            "mem_limit": mem,
            "memswap_limit": mem,  # no swap on top: past the limit means OOM, not a slow crawl
            "nano_cpus": int(self.cpus * 1e9),
            "pids_limit": self.pids_limit,
            "user": self.user,
            "cap_drop": ["ALL"],
            "security_opt": ["no-new-privileges"],
            "read_only": True,
            "tmpfs": {"/tmp": f"rw,exec,nosuid,nodev,size={self.tmpfs_size},mode=1777"},
            "ipc_mode": "private",
            **({"runtime": self.runtime} if self.runtime else {}),
        }
