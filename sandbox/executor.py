"""Where a run's predictions are evaluated: in this process (`LocalExecutor`) or over a Ray cluster (`RayExecutor`).

Both run the same group evaluation (`sandbox.run.evaluate_predictions`). With Ray, one sandbox actor per node
(pinned to it, sized `min(max_workers, the node's CPUs)`) runs it on that node's Docker engine; whole groups are
placed on one node, so each group's repo is prepared once; every result streams back to this process, which
alone writes the run's `results.jsonl` (atomic lines, resumable) and `report.json`. A worker lost mid-run turns
its unfinished predictions into `infra_error`, which a re-run retries. Ray is an optional extra (`gagar[ray]`).
"""

from __future__ import annotations

import os
import queue
import shutil
import tempfile
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

from sandbox.config import SandboxConfig
from sandbox.records import EvalResult, Instance, Prediction

EXECUTORS = ("local", "ray")
CALLS_PER_WORKER = 16  # evaluate() calls one actor serves at once (+1 for cancel); each runs its own workers
DOCKER_RESOURCE = "docker"  # a node started with --resources '{"docker": 1}' takes sandbox work; see docs/scaling.md


class RayUnavailable(RuntimeError):
    """`--executor ray` without Ray installed, or a cluster that cannot be reached or has no usable node."""


class Executor(Protocol):
    def evaluate(self, instances: Mapping[str, Instance], predictions: list[Prediction], config: SandboxConfig, *,
                 run_dir: Path | str | None = None, redo: bool = False, progress: bool = False,
                 extra_report: dict | None = None) -> list[EvalResult]: ...

    def close(self) -> None: ...


class LocalExecutor:
    """This machine's Docker engine, `config.max_workers` rollouts at once."""

    def evaluate(self, instances: Mapping[str, Instance] | Iterable[Instance], predictions: list[Prediction],
                 config: SandboxConfig, **kw: Any) -> list[EvalResult]:
        from sandbox.run import evaluate_predictions

        return evaluate_predictions(instances, predictions, config, **kw)

    def close(self) -> None:
        pass

    def __enter__(self) -> LocalExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def make_executor(kind: str = "local", address: str | None = None) -> LocalExecutor | RayExecutor:
    """The executor named `kind` (`local` | `ray`); `address` is the Ray cluster's (none: a local Ray for the run)."""
    if kind == "local":
        if address:
            raise ValueError("a Ray address needs the ray executor (--executor ray)")
        return LocalExecutor()
    if kind == "ray":
        import_ray()  # fail now, with the install hint, not at the first evaluation
        return RayExecutor(address)
    raise ValueError(f"unknown executor {kind!r}; use one of {', '.join(EXECUTORS)}")


def import_ray():
    try:
        import ray
    except ImportError as exc:
        raise RayUnavailable("the ray executor needs Ray, which is not installed: pip install 'gagar[ray]' "
                             "(or use --executor local)") from exc
    return ray


def split_groups(predictions: list[Prediction], capacities: list[int]) -> list[list[Prediction]]:
    """Whole groups (an instance's predictions) per worker, largest group first onto the worker with the least
    work per unit of capacity; first-seen order is kept within each share, so a group's rollouts stay together."""
    groups: dict[str, list[Prediction]] = {}
    for p in predictions:
        groups.setdefault(p.instance_id, []).append(p)
    load = [0] * len(capacities)
    owner: dict[str, int] = {}
    for iid in sorted(groups, key=lambda i: -len(groups[i])):
        k = min(range(len(capacities)), key=lambda j: ((load[j] + len(groups[iid])) / capacities[j], j))
        owner[iid] = k
        load[k] += len(groups[iid])
    shares: list[list[Prediction]] = [[] for _ in capacities]
    for iid, ps in groups.items():
        shares[owner[iid]].extend(ps)
    return shares


class SandboxWorker:
    """The Ray actor on one node: evaluates its share with this node's Docker engine and yields each result as
    soon as it is recorded (a Ray streaming generator). Logs stay on the node, under `log_root`."""

    def __init__(self) -> None:
        self._stops: set[threading.Event] = set()  # one per call: verl's reward calls arrive concurrently

    def info(self) -> dict:
        import socket

        return {"pid": os.getpid(), "host": socket.gethostname()}

    def evaluate(self, instances: dict[str, Instance], predictions: list[Prediction], config: SandboxConfig,
                 log_root: str | None):
        from sandbox.run import evaluate_predictions

        out: queue.Queue = queue.Queue()
        end = object()
        stop = threading.Event()
        self._stops.add(stop)

        def run() -> None:
            try:
                # redo: the driver alone decides what is left to do; the node's own results file only holds logs.
                evaluate_predictions(instances, predictions, config, run_dir=log_root, redo=True,
                                     on_result=out.put, stop=stop)
                out.put(end)
            except BaseException as exc:  # noqa: BLE001 - handed to the driver as the stream's error
                out.put(exc)

        threading.Thread(target=run, name="gagar-ray-eval", daemon=True).start()
        try:
            while (item := out.get()) is not end:
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            self._stops.discard(stop)

    def cancel(self) -> None:
        """Stop at once: the run stops taking predictions and the containers in flight are removed."""
        from sandbox import container as ctr

        for stop in list(self._stops):
            stop.set()
        ctr.remove_live()


def _cleanup_node(run_id: str) -> int:
    """After a worker died: remove the run's containers on its node (one run id belongs to one run, and one
    worker per node, so these are all the dead worker's) and workspaces whose owner process is gone."""
    from sandbox.cleanup import gc
    from sandbox.workspace import remove_tree, stale_workspaces

    removed = gc(run_id).removed  # the dead worker's containers: their owner process is gone
    for d in stale_workspaces():
        remove_tree(d)
    return len(removed)


class RayExecutor:
    """Evaluations spread over a Ray cluster, one sandbox actor per node. With no `address`, a private local
    Ray (this machine's CPUs, no dashboard) is started on first use and shut down by `close()`; inside a
    process already connected to Ray (a verl job), that connection is used and left open."""

    def __init__(self, address: str | None = None, *, num_cpus: int | None = None) -> None:
        self.address = address
        self.num_cpus = num_cpus
        self._ray = None
        self._owned = False
        self._temp: str | None = None
        self._actors: dict[int, list[tuple[Any, int, dict]]] = {}
        self._stale = False
        self._lock = threading.Lock()  # evaluate() may be called from several threads (verl's reward loop)

    # -- cluster ------------------------------------------------------------------------------------------
    def _connect(self):
        if self._ray is not None:
            return self._ray
        ray = import_ray()
        if not ray.is_initialized():
            kw: dict[str, Any] = {"logging_level": "WARNING", "log_to_driver": False}
            try:
                if self.address:
                    ray.init(address=self.address, **kw)
                else:
                    # "local": never join another cluster found on this machine; a private temp dir so that
                    # nothing of this session outlives close().
                    self._temp = tempfile.mkdtemp(prefix="gagar-ray-", dir="/tmp" if os.path.isdir("/tmp") else None)
                    ray.init(address="local", num_cpus=self.num_cpus or os.cpu_count() or 1,
                             include_dashboard=False, _temp_dir=self._temp, **kw)
            except (ConnectionError, RuntimeError, ValueError) as exc:
                self._drop_temp()
                raise RayUnavailable(f"cannot start or reach Ray at {self.address or 'a local instance'}: {exc}") \
                    from exc
            self._owned = True
        self._ray = ray
        return ray

    def _workers(self, max_workers: int) -> list[tuple[Any, int, dict]]:
        """One actor per alive node with CPUs (only nodes offering the `docker` resource, when any does)."""
        if max_workers in self._actors and not self._stale:
            return self._actors[max_workers]
        self._stale = False
        ray = self._ray
        self._kill_actors()  # a set of another size would hold the CPUs the new one needs
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        nodes = [n for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("CPU", 0) >= 1]
        if any(DOCKER_RESOURCE in n["Resources"] for n in nodes):
            nodes = [n for n in nodes if DOCKER_RESOURCE in n["Resources"]]
        if not nodes:
            raise RayUnavailable("the Ray cluster has no alive node with a CPU to run sandboxes on")
        actor_cls = ray.remote(SandboxWorker)
        workers = []
        for n in nodes:
            cap = max(1, min(max_workers, int(n["Resources"]["CPU"])))
            handle = actor_cls.options(
                num_cpus=cap, max_concurrency=CALLS_PER_WORKER + 1, max_restarts=0,
                scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote()
            workers.append((handle, cap, {"node_id": n["NodeID"], "ip": n.get("NodeManagerAddress", "?")}))
        try:
            infos = ray.get([w[0].info.remote() for w in workers], timeout=300)
        except Exception as exc:  # noqa: BLE001 - an actor that cannot be placed or started
            for w in workers:
                ray.kill(w[0])
            raise RayUnavailable(f"could not start the sandbox actors on {len(workers)} node(s): {exc}") from exc
        for w, info in zip(workers, infos, strict=True):
            w[2].update(info)
        self._actors[max_workers] = workers
        return workers

    def close(self) -> None:
        """Stop the actors; shut down the Ray this executor started (or its connection to a cluster)."""
        if self._ray is None:
            return
        self._kill_actors()
        ray, self._ray = self._ray, None
        if self._owned and ray.is_initialized():
            ray.shutdown()
        self._owned = False
        self._drop_temp()

    def _kill_actors(self) -> None:
        for workers in self._actors.values():
            for handle, _, _ in workers:
                try:
                    self._ray.kill(handle)
                except Exception:  # noqa: BLE001 - already gone
                    pass
        self._actors.clear()

    def _drop_temp(self) -> None:
        if self._temp is not None:
            shutil.rmtree(self._temp, ignore_errors=True)
            self._temp = None

    def __enter__(self) -> RayExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- a run ----------------------------------------------------------------------------------------------
    def evaluate(self, instances: Mapping[str, Instance] | Iterable[Instance], predictions: list[Prediction],
                 config: SandboxConfig, **kw: Any) -> list[EvalResult]:
        if not isinstance(instances, Mapping):
            instances = {i.instance_id: i for i in instances}
        with self._lock:
            ray = self._connect()
            workers = self._workers(config.max_workers) if predictions else []
        return _drive(ray, workers, self._forget, instances, predictions, config, **kw)

    def _forget(self, handle: Any) -> None:
        """A dead actor: the next evaluation starts a fresh set (the dead one's node may be back, or gone);
        the others finish the run in progress first."""
        if any(w[0] is handle for workers in self._actors.values() for w in workers):
            self._stale = True


def _drive(ray: Any, workers: list[tuple], forget, instances: Mapping[str, Instance], predictions: list[Prediction],
           config: SandboxConfig, *, run_dir: Path | str | None = None, redo: bool = False, progress: bool = False,
           extra_report: dict | None = None) -> list[EvalResult]:
    """The driver side of a Ray run: resume, place whole groups on workers, record what streams back."""
    from sandbox.jsonl import atomic_write_text
    from sandbox.report import build_report, start_run
    from sandbox.run import _config_dict, _json, _Progress, _say, _signals_raise

    t_start = time.monotonic()
    run_dir = Path(run_dir).resolve() if run_dir is not None else None
    start = start_run(instances, predictions, image=config.image, run_dir=run_dir, redo=redo, say=_say)
    known, unknown, keys, vkeys, writer, done = (start.known, start.unknown, start.keys, start.verdict_keys,
                                                 start.writer, start.done)
    todo = [p for p in known if (p.instance_id, p.rollout_id) not in done]
    results: dict[tuple[str, str], EvalResult] = dict(done)
    bar = _Progress(len(keys), sum(r.resolved for k, r in done.items() if k in set(keys)),
                    len([k for k in keys if k in done]), enabled=progress)

    def record(r: EvalResult) -> None:
        r.verdict_key = vkeys.get(r.key)
        results[r.key] = r
        if writer is not None:
            writer.write(r)
        bar.advance(r.resolved)

    def write_report() -> None:
        if run_dir is not None:
            rep = build_report(run_id=config.run_id, total_instances=len(instances), submitted=keys,
                               results=results, unknown_instance_ids=unknown,
                               skipped_lines=(extra_report or {}).get("skipped", []),
                               duration_s=time.monotonic() - t_start,
                               config={**_config_dict(config), "executor": "ray"})
            atomic_write_text(run_dir / "report.json", _json(rep))

    stop = threading.Event()
    with bar, _signals_raise(stop):
        shares = split_groups(todo, [w[1] for w in workers]) if todo else []
        events: queue.Queue = queue.Queue()
        active = [(w, share) for w, share in zip(workers, shares, strict=True) if share]
        for w, share in active:
            threading.Thread(target=_pump, args=(ray, w, share, instances, config, run_dir, events),
                             daemon=True, name="gagar-ray-pump").start()
        try:
            _collect(ray, events, len(active), record, forget, config.run_id)
        except BaseException:
            stop.set()
            _cancel(ray, [w for w, _ in active])
            write_report()
            raise
    write_report()
    return [results[k] for k in keys if k in results]


def _pump(ray: Any, worker: tuple, share: list[Prediction], instances: Mapping[str, Instance],
          config: SandboxConfig, run_dir: Path | None, events: queue.Queue) -> None:
    """Feed one worker's stream into `events`; the last event says how the stream ended."""
    handle, _, meta = worker
    sub = {p.instance_id: instances[p.instance_id] for p in share}
    log_root = str(run_dir / "nodes" / meta.get("ip", "node")) if run_dir is not None else None
    got: set[tuple[str, str]] = set()
    try:
        for ref in handle.evaluate.remote(sub, share, config, log_root):
            r = ray.get(ref)
            got.add(r.key)
            events.put(r)
        events.put(("end", worker, None, []))
    except Exception as exc:  # noqa: BLE001 - the worker or its node died, or its run failed
        events.put(("end", worker, exc, [p for p in share if (p.instance_id, p.rollout_id) not in got]))


def _collect(ray: Any, events: queue.Queue, n_streams: int, record, forget, run_id: str) -> None:
    ended = 0
    while ended < n_streams:
        try:
            ev = events.get(timeout=0.5)  # a timeout, so Ctrl-C gets through
        except queue.Empty:
            continue
        if isinstance(ev, EvalResult):
            record(ev)
            continue
        ended += 1
        _, (handle, _, meta), exc, unfinished = ev
        if exc is None:
            continue
        where = f"the Ray sandbox worker on node {meta.get('ip', '?')} (pid {meta.get('pid', '?')})"
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        msg = (f"{where} was lost mid-run ({type(exc).__name__}: {first}); re-run the same command to finish "
               "this prediction")
        for p in unfinished:
            record(EvalResult(instance_id=p.instance_id, model_name_or_path=p.model_name_or_path,
                              rollout_id=p.rollout_id, status="infra_error", error=msg))
        forget(handle)
        _cleanup_after(ray, meta, run_id)


def _cleanup_after(ray: Any, meta: dict, run_id: str) -> None:
    """Remove what a dead worker left on its node, if the node is still there (best effort, bounded)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    task = ray.remote(_cleanup_node).options(
        num_cpus=0, max_retries=0,
        scheduling_strategy=NodeAffinitySchedulingStrategy(meta["node_id"], soft=False))
    try:
        ray.get(task.remote(run_id), timeout=120)
    except Exception:  # noqa: BLE001 - the node is gone: nothing left there to clean
        pass


def _cancel(ray: Any, workers: list[tuple]) -> None:
    try:
        ray.get([w[0].cancel.remote() for w in workers], timeout=60)
    except Exception:  # noqa: BLE001 - a worker that cannot answer is killed by close()
        pass
