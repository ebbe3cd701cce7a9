"""Leftover sandbox containers: `remove_stale` (a run's own, at its start) and `gc` (`gagar sandbox gc`).

Both go by the `gagar.owner=<host>:<pid>` label `sandbox.container` puts on every container: a container whose
owner process still runs on this machine belongs to a live run and is kept (removing it would end that rollout
mid-run; `gc --force` does it anyway, and such a rollout then ends as `infra_error`).
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

import docker
import docker.errors
import requests

from sandbox.container import LABEL, OWNER_LABEL, RUN_LABEL, SandboxInfraError, _remove, client


def owner_alive(owner: str | None) -> bool:
    """Whether the process named by a container's owner label (`host:pid`) may still be using it."""
    host, _, pid = (owner or "").rpartition(":")
    if not pid.isdigit() or host != socket.gethostname():
        return False  # no label (an older gagar) or another machine's engine client: a leftover
    if int(pid) == os.getpid():
        return True  # this process: another evaluation call of ours owns it (overlap mode, refill)
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale(run_id: str) -> None:
    """Remove this run's containers that are not running and whose owner process is gone: what a killed process
    or a dead Docker engine left behind. Containers of a live owner — another evaluation in this process, or
    another process on this machine — are never touched (a created-not-yet-started one is not stale)."""
    try:
        c = client()
        rows = c.api.containers(all=True, filters={"label": [f"{RUN_LABEL}={run_id}"],
                                                   "status": ["exited", "dead", "created"]})
    except (SandboxInfraError, docker.errors.DockerException, requests.RequestException):
        return
    for row in rows:
        if owner_alive((row.get("Labels") or {}).get(OWNER_LABEL)):
            continue
        try:
            c.api.remove_container(row["Id"], force=True, v=True)
        except (docker.errors.DockerException, requests.RequestException):
            pass


@dataclass
class Collected:
    """What `gc` did: the containers it removed, and those it kept because their owner process still runs."""

    removed: list[str]
    spared: list[str]


def gc(run_id: str | None = None, c: docker.DockerClient | None = None, *, force: bool = False) -> Collected:
    """Remove leftover sandbox containers by label (all runs, or one). A container whose owner process is still
    running on this machine (`gagar.owner`, as `remove_stale` reads it; this process included) is a live run's
    and is kept: removing it would end that rollout mid-run. `force` removes those too (their rollouts then
    end as `infra_error`)."""
    c = c or docker.from_env(timeout=60)
    labels = [f"{LABEL}=1"] + ([f"{RUN_LABEL}={run_id}"] if run_id else [])
    out = Collected([], [])
    for row in c.api.containers(all=True, filters={"label": labels}):
        name = (row.get("Names") or [row["Id"][:12]])[0].lstrip("/")
        if not force and owner_alive((row.get("Labels") or {}).get(OWNER_LABEL)):
            out.spared.append(name)
            continue
        _remove(c, row["Id"])
        out.removed.append(name)
    return out
