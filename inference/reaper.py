"""A watchdog that ends a process's helper processes when the process itself dies without cleaning up.

An in-process vLLM engine runs in child processes (its engine core and worker) that outlive their owner when the
owner is killed outright (SIGKILL, the kernel's out-of-memory killer): orphans holding gigabytes. `guard(procs)`
starts a tiny watchdog in its own session (a terminal's Ctrl-C does not reach it) that polls its parent once a
second; when the parent is gone it kills each guarded process with all its descendants. psutil's `Process`
remembers each process's start time, so a pid the kernel reused meanwhile is never killed. `stop()` ends the
watchdog when the owner shuts the processes down itself.
"""

from __future__ import annotations

import subprocess
import sys

import psutil

_WATCH = r"""
import os, signal, sys, time
import psutil
signal.signal(signal.SIGINT, signal.SIG_IGN)
parent, pids = int(sys.argv[1]), [int(p) for p in sys.argv[2:]]
procs = []
for pid in pids:
    try:
        procs.append(psutil.Process(pid))
    except psutil.Error:
        pass
while os.getppid() == parent:
    time.sleep(1.0)
victims = []
for p in procs:
    try:
        victims += [p, *p.children(recursive=True)]
    except psutil.Error:
        pass
for p in victims:
    try:
        p.kill()
    except psutil.Error:
        pass
"""


class Reaper:
    """The running watchdog of `guard`."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def guard(pids: list[int]) -> Reaper:
    """Watch this process; should it die without calling `Reaper.stop`, kill `pids` and their descendants."""
    proc = subprocess.Popen([sys.executable, "-c", _WATCH, str(psutil.Process().pid), *map(str, pids)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True, close_fds=True)
    return Reaper(proc)
