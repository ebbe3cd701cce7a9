"""The evaluation driver: group predictions by instance, prepare each repo once, evaluate every rollout in a
fresh limited container, grade, and write results as soon as they are known.

Parallelism is per rollout (a thread pool of `max_workers`), with predictions queued group by group so the
base copy of a group is shared while its rollouts run and removed when its last one finishes.
"""

from __future__ import annotations

import functools
import logging
import re
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

import docker.errors
import requests

from sandbox import container as ctr
from sandbox.cleanup import remove_stale
from sandbox.config import SandboxConfig
from sandbox.env.image import prepare_images
from sandbox.env.images import ImageError
from sandbox.env.toolchains import build_failure, go_requires
from sandbox.group import RolloutGroup, Slot, discard_slot
from sandbox.integrity import checks as integrity
from sandbox.integrity.prerun import PreRun, settle_xfails
from sandbox.jsonl import atomic_write_text
from sandbox.records import EvalResult, Instance, Prediction, TestsStatus
from sandbox.report import build_report, collect_reports, log_dir_for, start_run
from sandbox.workspace import (
    WorkspaceError,
    hand_over,
    janitor,
    remove_tree,
    stale_workspaces,
    sweep_workspaces,
)

log = logging.getLogger(__name__)

GO_ENV = {"GOCACHE": "/tmp/gocache", "GOPATH": "/tmp/go", "GOFLAGS": "-mod=mod", "GOPROXY": "off"}


class _Interrupted(Exception):
    """The run is stopping (Ctrl-C / SIGTERM): the prediction in flight is not recorded, so resume redoes it."""


def _test_env(instance: Instance) -> dict[str, str]:
    """Framework settings; the report settings (PYTEST_ADDOPTS, GAGAR_REPORT_DIR) come from each rollout's
    `ReportChannel`, because their paths are secret per rollout."""
    return dict(GO_ENV) if (instance.test_framework or "").lower() == "go" else {}


@functools.lru_cache(maxsize=64)
def _image_pythonpath(image: str) -> str | None:
    """The image's own PYTHONPATH, kept behind the guard plugin's dir (the container env replaces it)."""
    try:
        env = ctr.client().api.inspect_image(image)["Config"].get("Env") or []
    except (docker.errors.DockerException, ctr.SandboxInfraError, requests.RequestException, KeyError):
        return None
    return next((e.split("=", 1)[1] for e in env if e.startswith("PYTHONPATH=")), None) or None


def image_missing(image: str, override: bool = False) -> str | None:
    """Why `image` cannot run here (None when it can). `override`: it was named by --image."""
    try:
        ctr.client().images.get(image)
        return None
    except docker.errors.ImageNotFound:
        if override:
            return (f"--image {image}: no such image on this Docker engine; build it (`gagar image build`), "
                    "`docker pull` or `docker load` it, or leave --image out to use the gagar-* images")
        return f"image {image!r} not found; build it with `gagar image build --all` or pass --image"
    except (docker.errors.DockerException, ctr.SandboxInfraError, requests.RequestException) as exc:
        return f"cannot reach the Docker engine ({exc})"


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def evaluate_one(instance: Instance, pred: Prediction, group: RolloutGroup, config: SandboxConfig, image: str,
                 log_dir: Path | None, stop: threading.Event) -> EvalResult:
    """Evaluate one prediction end to end; every failure becomes a status, never an exception (except stop)."""
    from sandbox.apply import TestPatchFailed, apply_patch, restore_task_tests
    from sandbox.grading import grade
    from sandbox.parsers import STDOUT_REPORT, parse_results
    from sandbox.patchcheck import EmptyPatch, PatchRejected, validate_patch
    from sandbox.watch import STDOUT_REPORT_BYTES

    t0 = time.monotonic()
    framework = (instance.test_framework or "").lower()
    res = EvalResult(instance_id=instance.instance_id, model_name_or_path=pred.model_name_or_path,
                     rollout_id=pred.rollout_id, status="infra_error",
                     log_path=str(log_dir) if log_dir else None)
    notes: list[str] = []

    def finish(status: str, error: str | None = None) -> EvalResult:
        res.status, res.error = status, error
        res.duration_s = round(time.monotonic() - t0, 3)
        if log_dir is not None:
            (log_dir / "run.log").write_text("\n".join(notes) + f"\n== status: {status}\n"
                                             + (f"== error: {error}\n" if error else ""), errors="replace")
        return res

    patch = pred.model_patch or ""
    tree: Path | None = None
    report_root: Path | None = None
    slot: Slot | None = None
    taken = False
    try:
        if log_dir is not None:
            (log_dir / "patch.diff").write_text(patch, errors="replace")
        if not patch.strip():
            return finish("empty_patch", "the prediction has no patch")
        ws = group.open()
        try:
            info = validate_patch(patch, ws.base, max_bytes=config.max_patch_bytes,
                                  max_expand_bytes=config.max_apply_bytes)
        except EmptyPatch as exc:
            return finish("empty_patch", str(exc) or "the patch changes nothing")
        except PatchRejected as exc:
            return finish("rejected", str(exc))
        if stop.is_set():
            raise _Interrupted
        if not instance.test_cmd.strip():
            return finish("infra_error", f"instance {instance.instance_id} has no test_cmd")
        slot = group.take()
        taken = True
        tree, channel = slot.tree, slot.channel
        report_dir, report_root = channel.report_dir, channel.root
        ws.copy(tree)
        try:
            applied = apply_patch(tree, patch, base_commit=instance.base_commit, max_bytes=config.max_patch_bytes,
                                  max_expand_bytes=config.max_apply_bytes,
                                  fresh=True)  # ws.copy just made it from the clean base checkout
        except EmptyPatch as exc:
            return finish("empty_patch", str(exc) or "the patch changes nothing")
        except PatchRejected as exc:
            return finish("rejected", str(exc))
        notes.append(f"== apply ({applied.method}):\n{applied.log}")
        res.apply_method = applied.method
        if not applied.applied:
            return finish("patch_failed", "the patch does not apply to the repo at base_commit "
                          f"(tried git apply, --3way, --reject, patch --fuzz); see {log_dir or 'the log'}")
        res.patch_successfully_applied = True
        try:
            restored = restore_task_tests(tree, base_commit=instance.base_commit, test_patch=instance.test_patch,
                                          model_patch_info=info, extra_protected=_test_files(instance),
                                          changed=applied.changed_paths, config_links=applied.config_links)
        except TestPatchFailed as exc:
            return finish("infra_error", f"the task's own test_patch does not apply: {exc}")
        notes.append(f"== restore tests (touched: {', '.join(restored.touched) or 'none'}):\n{restored.log}")
        res.tampered_tests = bool(restored.tampered)
        # What the patch and the tree say before the run: the run cannot rewrite these findings.
        static = integrity.static_findings(patch, info, _test_paths(instance), tree, applied.changes)
        undefined = integrity.undefined_tests(instance, tree)
        hand_over(tree)
        # pytest: which files the patch wrote and the conftest/configuration state, to judge the run against.
        pre = PreRun.take(instance, tree, changed=applied.changed_paths, reverted=restored.touched,
                          test_paths=_test_paths(instance)) if framework == "pytest" else None
        if stop.is_set():
            raise _Interrupted
        prepared = slot.run.result()
        channel.open()  # before the hand-off: if it fails, the `finally` still discards the slot's container
        slot = None  # the run owns its container now: go() removes it
        try:
            outcome = prepared.go(background_remove=True)
        finally:
            live = channel.close()
        if stop.is_set():
            raise _Interrupted
        if live.lost:
            # The verdict needs both channels; a host fault is not the patch's (a re-run retries it).
            return finish("infra_error", f"the host lost the tests' live result pipe ({live.lost}); re-run the "
                          "same command to retry this prediction")
        if log_dir is not None:
            (log_dir / "test_output.txt").write_text(outcome.output, errors="replace")
            collect_reports(report_dir, log_dir)
        notes.append(f"== tests: exit {outcome.exit_code}, {outcome.duration_s:.2f}s, "
                     f"{outcome.output_bytes} output bytes{' (truncated)' if outcome.truncated else ''}"
                     f"{', OOM-killed' if outcome.oom_killed else ''}")
        if outcome.timed_out:
            res.exit_code = None
            return finish("timeout", f"the tests ran past the {config.timeout:g}s timeout; the container was killed")
        res.exit_code = outcome.exit_code
        if outcome.write_limit_hit:
            return finish("unresolved", f"the tests wrote more than {config.max_write_bytes / 2**20:g} MiB into the "
                          "work tree (files count 4 KiB each); the container was killed before the host's disk filled up")
        log = outcome.output
        if framework in STDOUT_REPORT:  # the output is the report: read it whole, never the capped copy
            if outcome.report is None:
                return finish("infra_error", f"the test report ({framework}'s output) is {outcome.output_bytes} bytes, "
                              f"over its {STDOUT_REPORT_BYTES >> 20} MiB bound: no verdict is read from part of it")
            log = outcome.report
        # pytest was told (PYTEST_ADDOPTS) to write a report: without one, the suite did not run.
        parsed = parse_results(framework, log, report_dir, require_report=framework == "pytest")
        turned: list[str] = []
        if pre is not None:  # an XFAIL counts only when it is the test's own (`settle_xfails`)
            parsed, turned = settle_xfails(instance, parsed, live, pre)
        graded = grade(instance, parsed, exit_code=outcome.exit_code)
        res.tests_status = graded.tests_status if isinstance(graded.tests_status, TestsStatus) else TestsStatus(
            **graded.tests_status)
        res.resolved = bool(graded.resolved)
        cause = None if res.resolved else build_failure(
            framework, log, tests_ran=bool(parsed.statuses), patch_paths=info.paths,
            declared_modules=go_requires(ws.base) if framework == "go" else ())
        if cause:  # the environment, not the patch, kept the suite from building
            return finish("infra_error", cause)
        error = None
        reasons = integrity.check(instance, parsed, report_dir=report_dir, output=log,
                                  exit_code=outcome.exit_code, channel=live, undefined=undefined, static=static,
                                  pre=pre) + turned  # an XFAIL the patch's code made is a forged pass
        if reasons:
            # The report cannot be trusted: not resolved, whatever it says (the trainer counts it as a hack).
            res.suspicious_report, res.resolved = True, False
            notes.append("== suspicious report:\n" + "\n".join(f"- {r}" for r in reasons))
            return finish("unresolved", "suspicious report: " + "; ".join(reasons)[:2000])
        if outcome.oom_killed:
            error = f"out of memory: a test process was killed at the {config.memory} memory limit"
        elif outcome.truncated:
            error = f"the tests printed {outcome.output_bytes} bytes; output kept up to {config.output_limit_bytes}"
        return finish("resolved" if res.resolved else "unresolved", error)
    except _Interrupted:
        raise
    except (WorkspaceError, ImageError, ctr.SandboxInfraError, docker.errors.DockerException) as exc:
        if stop.is_set():
            raise _Interrupted from exc
        return finish("infra_error", str(exc))
    except requests.RequestException as exc:  # the SDK lets connection errors through unwrapped
        if stop.is_set():
            raise _Interrupted from exc
        return finish("infra_error", f"lost the Docker engine mid-run ({type(exc).__name__}: {exc}); re-run the "
                      "same command to retry this prediction")
    except Exception as exc:  # a bug or an unforeseen repo state: record it, keep the run going
        if stop.is_set():
            raise _Interrupted from exc
        notes.append(traceback.format_exc())
        return finish("infra_error", f"internal error: {type(exc).__name__}: {exc}")
    finally:
        if slot is not None:  # taken but never started (patch failed, rejected after apply, error)
            discard_slot(slot)
        for p in (tree, report_root):
            if p is not None:
                janitor.submit(remove_tree, p)
        if not taken:
            group.skip()
        group.release()


def _test_paths(instance: Instance) -> set[str]:
    """Every path the task's own tests live in: test_patch's files and the files the pytest ids name."""
    named = re.findall(r"^(?:\+\+\+ b/|--- a/)(\S+)", instance.test_patch or "", re.M)
    return set(named) | set(_test_files(instance))


def _test_files(instance: Instance) -> list[str]:
    """The test files the task's pytest ids name (`path::test`): protected like test_patch's files, so a patch
    cannot edit a PASS_TO_PASS test that test_patch does not touch to hide a regression."""
    if (instance.test_framework or "").lower() != "pytest":
        return []
    out = set()
    for tid in [*instance.FAIL_TO_PASS, *instance.PASS_TO_PASS]:
        path = tid.split("::", 1)[0]
        if "::" in tid and path.endswith(".py") and not path.startswith("/") and ".." not in path.split("/"):
            out.add(path)
    return sorted(out)


@contextmanager
def _signals_raise(stop: threading.Event):
    """SIGTERM behaves like Ctrl-C, so both reach the `finally` that removes the containers."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        if stop.is_set():
            return  # already stopping: a second Ctrl-C must not cut the container cleanup short
        stop.set()
        raise KeyboardInterrupt(f"signal {signum}")

    old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def evaluate_predictions(
    instances: Mapping[str, Instance] | Iterable[Instance],
    predictions: list[Prediction],
    config: SandboxConfig,
    *,
    run_dir: Path | str | None = None,
    redo: bool = False,
    progress: bool = False,
    extra_report: dict | None = None,
    on_result: Callable[[EvalResult], None] | None = None,
    stop: threading.Event | None = None,
    env_specs: dict | None = None,
    require_fail_to_pass: bool = True,
    incremental: bool = False,
) -> list[EvalResult]:
    """Evaluate `predictions` against `instances`; returns one result per known prediction, in input order.
    With `run_dir`, results/logs/report.json go there and a rerun skips what is already finished.
    `on_result` sees each new result as it is recorded; setting `stop` ends the run early (results so far
    are kept), as Ctrl-C does — the Ray executor's workers use both. An instance without FAIL_TO_PASS is an
    `InputError` (a ValueError) before anything runs (`sandbox.inputs.check_runnable`), unless
    `require_fail_to_pass=False`: a run that derives the lists from the test statuses, not a verdict.
    `incremental=True` is for a caller that evaluates a growing set of predictions into one run dir and resumes
    itself (`gagar tasks synth`): the results of predictions not in this call stay in results.jsonl for its
    later calls (otherwise the file is made to hold exactly this call's predictions), and `gagar eval`'s notes on
    what a re-run reuses (they name its `--redo`) stay off stderr."""
    if not isinstance(instances, Mapping):
        instances = {i.instance_id: i for i in instances}
    if config.repos_dir is None:
        raise ValueError("SandboxConfig.repos_dir is required")
    t_start = time.monotonic()
    run_dir = Path(run_dir) if run_dir is not None else None
    start = start_run(instances, predictions, image=config.image, run_dir=run_dir, redo=redo,
                      say=(lambda _msg: None) if incremental else _say, fail_to_pass=require_fail_to_pass,
                      prune=not incremental)
    known, unknown, keys, vkeys, writer, done = (start.known, start.unknown, start.keys, start.verdict_keys,
                                                 start.writer, start.done)
    if writer is not None:  # a run with a report dir may resume one: what a dead earlier process of it left goes
        remove_stale(config.run_id)
        for stale in stale_workspaces(run_id=config.run_id):
            remove_tree(stale)
    todo = [p for p in known if (p.instance_id, p.rollout_id) not in done]
    # Group by instance, keeping first-seen order, so one group's rollouts run together.
    order: dict[str, list[Prediction]] = {}
    for p in todo:
        order.setdefault(p.instance_id, []).append(p)
    # Base image, toolchain or environment image per instance; env images are built here, once per spec.
    images, image_errors, env_extra = prepare_images(
        [instances[iid] for iid in order], repos_dir=config.repos_dir, specs=env_specs, override=config.image,
        max_workers=config.max_workers, log_dir=run_dir / "env-builds" if run_dir else None,
        say=_say)  # a build takes minutes: always say so, progress bar or not
    missing = {img: image_missing(img, img == config.image) for img in {v for v in images.values() if v}}
    for iid, img in images.items():
        if img and missing.get(img):
            image_errors[iid] = missing[img]
    starter = ThreadPoolExecutor(max_workers=2, thread_name_prefix="gagar-start")
    call = ctr.new_call_id()  # this call's containers, and only they, are removed when it stops
    groups = {iid: RolloutGroup(instances[iid], len(ps), config, None if iid in image_errors else images[iid],
                                {**_test_env(instances[iid]), **env_extra.get(iid, {})}, starter, call=call,
                                pythonpath=_image_pythonpath(images[iid]) if images.get(iid) else None)
              for iid, ps in order.items()}
    chain = list(groups.values())
    for g, nxt in zip(chain, chain[1:], strict=False):
        g.next = nxt

    stop = stop if stop is not None else threading.Event()
    results: dict[tuple[str, str], EvalResult] = dict(done)
    lock = threading.Lock()
    bar = _Progress(len(keys), sum(r.resolved for k, r in done.items() if k in set(keys)),
                    len([k for k in keys if k in done]), enabled=progress)

    def record(r: EvalResult) -> None:
        r.verdict_key = vkeys.get(r.key)
        with lock:
            results[r.key] = r
        if writer is not None:
            writer.write(r)
        if on_result is not None:
            on_result(r)
        bar.advance(r.resolved)

    def task(p: Prediction) -> EvalResult:
        if stop.is_set():
            raise _Interrupted
        inst = instances[p.instance_id]
        if p.instance_id in image_errors:
            groups[p.instance_id].release()
            r = EvalResult(instance_id=p.instance_id, model_name_or_path=p.model_name_or_path,
                           rollout_id=p.rollout_id, status="infra_error", error=image_errors[p.instance_id])
        else:
            r = evaluate_one(inst, p, groups[p.instance_id], config, images[p.instance_id],
                             log_dir_for(run_dir, p), stop)
        record(r)
        return r

    def write_report() -> None:
        if run_dir is None:
            return
        rep = build_report(run_id=config.run_id, total_instances=len(instances), submitted=keys, results=results,
                           unknown_instance_ids=unknown, skipped_lines=(extra_report or {}).get("skipped", []),
                           duration_s=time.monotonic() - t_start, config=_config_dict(config))
        atomic_write_text(run_dir / "report.json", _json(rep))

    pool = ThreadPoolExecutor(max_workers=config.max_workers, thread_name_prefix="gagar-eval")
    futures: list[Future] = []
    # The handlers stay installed through the cleanup below, so a second signal cannot interrupt it.
    with _signals_raise(stop):
        try:
            with bar:
                futures = [pool.submit(task, p) for ps in order.values() for p in ps]
                pending = set(futures)
                while pending:
                    finished, pending = wait(pending, timeout=0.5, return_when=FIRST_COMPLETED)
                    for f in finished:
                        exc = f.exception()
                        if exc is not None and not isinstance(exc, _Interrupted):
                            raise exc
        except BaseException:
            stop.set()
            for f in futures:
                f.cancel()
            ctr.remove_live(call)  # first, and at once: unblocks the workers waiting on their containers
            pool.shutdown(wait=True, cancel_futures=True)
            starter.shutdown(wait=True, cancel_futures=True)
            for g in groups.values():
                g.close()
            janitor.drain("container")
            ctr.remove_live(call)  # anything a starter thread created meanwhile
            janitor.drain()
            sweep_workspaces(call)  # an interrupted run leaves no repo copy behind, whichever race made one
            try:
                write_report()
            except OSError:
                pass  # the original error says more (often: this same directory is gone)
            raise
        pool.shutdown(wait=True)
        starter.shutdown(wait=True)
        for g in groups.values():
            g.close()
        # Containers are gone when this returns; temp trees may still be being deleted (the janitor finishes
        # them in the background, and at interpreter exit at the latest).
        janitor.drain("container")
        write_report()
    return [results[k] for k in keys if k in results]


def _config_dict(config: SandboxConfig) -> dict:
    d = asdict(config)
    d["repos_dir"] = str(d["repos_dir"])
    return d


def _json(obj: object) -> str:
    import json

    return json.dumps(obj, indent=2, ensure_ascii=False) + "\n"


class _Progress:
    """A rich progress bar: done/total, resolved so far, rate. A no-op when disabled."""

    def __init__(self, total: int, resolved: int, done: int, *, enabled: bool) -> None:
        self.enabled = enabled and total > 0
        self.resolved = resolved
        self.total = total
        self.done = done
        self.t0 = time.monotonic()
        self.new = 0
        self._p = None

    def __enter__(self) -> _Progress:
        if self.enabled:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._p = Progress(TextColumn("[bold]eval"), BarColumn(), MofNCompleteColumn(),
                               TextColumn("resolved {task.fields[resolved]}"), TextColumn("{task.fields[rate]}"),
                               TimeElapsedColumn(), transient=False)
            self._p.__enter__()
            self._task = self._p.add_task("eval", total=self.total, completed=self.done,
                                          resolved=self.resolved, rate="")
        return self

    def advance(self, resolved: bool) -> None:
        self.resolved += int(resolved)
        self.new += 1
        if self._p is not None:
            dt = time.monotonic() - self.t0
            self._p.update(self._task, advance=1, resolved=self.resolved,
                           rate=f"{self.new / dt * 60:.1f}/min" if dt > 0 else "")

    def __exit__(self, *exc: object) -> None:
        if self._p is not None:
            self._p.__exit__(None, None, None)
