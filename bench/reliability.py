"""The reliability suite in one command (`make reliability`): the adversarial corpus, the faults, the grader under
hostile input, and load — then the figures (cases tried, contained, lost results, leaked containers, peak memory)
printed as a table and written to bench/results/reliability.json. Exit status 1 when any check failed.

    .venv/bin/python bench/reliability.py            # full load count (200 evaluations)
    .venv/bin/python bench/reliability.py --load 24  # quicker
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hardening.agent_git import run_agent_git  # noqa: E402
from hardening.faults import EngineError  # noqa: E402
from hardening.forging4 import run as run_forging4  # noqa: E402
from hardening.grader_cases import run_hostile_judge, run_hostile_patches, run_injection  # noqa: E402
from hardening.harness import docker_reason, run_corpus  # noqa: E402
from hardening.load import run_load  # noqa: E402
from hardening.scenarios import engine_crash, interrupt, report_dir_errors  # noqa: E402


def _timed(fn, *args, **kw) -> tuple[dict, float]:
    t0 = time.monotonic()
    try:
        out = fn(*args, **kw)
    except EngineError as exc:
        out = {"problems": [], "skipped": str(exc)}
    except Exception as exc:  # noqa: BLE001 - a crashed scenario is a failed check, reported with the rest
        out = {"problems": [f"the scenario crashed: {type(exc).__name__}: {exc}"]}
    return out, round(time.monotonic() - t0, 1)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    p.add_argument("--load", type=int, default=200, help="evaluations in the load test (default 200)")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="workers under load (default: cores)")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "reliability.json")
    p.add_argument("--keep", action="store_true", help="keep the scratch dir (logs of every run)")
    p.add_argument("--markdown", action="store_true", help="print the figures of an existing --out as a markdown "
                   "table (for docs/reliability.md) and exit")
    args = p.parse_args(argv)
    if args.markdown:
        if not args.out.is_file():
            print(f"reliability: {args.out}: no figures yet; run `make reliability` first", file=sys.stderr)
            return 2
        print(markdown(json.loads(args.out.read_text())))
        return 0
    reason = docker_reason()
    if reason:
        print(f"reliability: {reason}", file=sys.stderr)
        return 2
    scratch = Path(tempfile.mkdtemp(prefix="gagar-reliability-"))
    sections: dict[str, dict] = {}
    t0 = time.monotonic()
    try:
        corpus, secs = _timed(run_corpus, scratch / "corpus", workers=args.workers, timeout=20)
        if hasattr(corpus, "summary"):
            s = corpus.summary()
            sections["corpus"] = {"problems": s["failed"], **s, "seconds": secs,
                                  "cases": [{"name": o.name, "category": o.category, "status": o.status,
                                             "expected": o.expected, "duration_s": o.duration_s,
                                             "contained": o.contained, "known_limit": o.known_limit,
                                             "problems": o.problems} for o in corpus.outcomes]}
        else:
            sections["corpus"] = {**corpus, "seconds": secs}
        for name, fn, kw in [
            ("engine_crash", engine_crash, {"n": 6, "sleep_s": 3.0}),
            ("sigint", interrupt, {"sig": signal.SIGINT, "n": 4, "sleep_s": 3.0}),
            ("sigterm", interrupt, {"sig": signal.SIGTERM, "n": 4, "sleep_s": 3.0}),
            ("report_dir", report_dir_errors, {}),
            ("grader_hostile_replies", run_hostile_judge, {}),
            ("grader_hostile_patches", run_hostile_patches, {}),
            ("grader_injection", run_injection, {}),
            ("agent_git", run_agent_git, {}),
            ("forging4", run_forging4, {"workers": args.workers}),
        ]:
            d = scratch / name
            d.mkdir()
            out, secs = _timed(fn, d, **kw)
            sections[name] = {**out, "seconds": secs}
            print(f"reliability: {name}: {'ok' if not out['problems'] else 'FAILED'} ({secs}s)", file=sys.stderr)
        load, secs = _timed(run_load, scratch / "load", args.load, workers=args.workers)
        sections["load"] = {**load, "seconds": secs}
    finally:
        if not args.keep:
            shutil.rmtree(scratch, ignore_errors=True)
    figures = _figures(sections)
    figures["seconds"] = round(time.monotonic() - t0, 1)
    doc = {"figures": figures, "sections": sections, "machine": {"cores": os.cpu_count(),
                                                                 "python": platform.python_version(),
                                                                 "platform": platform.platform()},
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    os.replace(tmp, args.out)
    _print(figures, sections)
    print(f"written: {args.out}" + (f" (scratch kept in {scratch})" if args.keep else ""), file=sys.stderr)
    return 0 if not figures["failed_checks"] else 1


def _figures(sections: dict[str, dict]) -> dict:
    corpus = sections.get("corpus", {})
    grader = sections.get("grader_hostile_replies", {})
    scenarios = ["engine_crash", "sigint", "sigterm", "report_dir", "grader_hostile_patches", "grader_injection"]
    agent_git = sections.get("agent_git", {})
    f4 = sections.get("forging4", {})
    f4_bad = len({p.split(":")[0] for p in f4.get("problems", [])})  # "case on instance (...): why"
    tried = (corpus.get("cases_tried", 0) + grader.get("scripts", 0) + len(scenarios) + agent_git.get("tried", 0)
             + f4.get("tried", 0))
    failed = [f"{name}: {p}" for name, s in sections.items() for p in s.get("problems", [])]
    grader_failed = len({p.split(":")[0] for p in grader.get("problems", [])})
    contained = (corpus.get("contained", 0) + grader.get("scripts", 0) - grader_failed
                 + sum(1 for n in scenarios if n in sections and not sections[n].get("problems"))
                 + agent_git.get("contained", 0) + max(f4.get("tried", 0) - f4_bad, 0))
    load = sections.get("load", {})
    lost = corpus.get("lost_results", 0) + sum(sections.get(n, {}).get("lost", 0) for n in
                                               ("engine_crash", "sigint", "sigterm")) + load.get("lost_results", 0)
    return {
        "cases_tried": tried,
        "contained": contained,
        "known_limits": corpus.get("known_limits", []),
        "lost_results": lost,
        "leaked_containers": load.get("leaked_containers", 0) + sum(
            1 for p in failed if "containers left" in p or "containers of the run left" in p),
        "leaked_volumes": load.get("leaked_volumes", 0),
        "leaked_temp_dirs": load.get("leaked_temp_dirs", 0),
        "load_evaluations": load.get("evaluations"),
        "load_workers": load.get("workers"),
        "load_evals_per_min": load.get("evals_per_min"),
        "load_peak_rss_mb": load.get("peak_rss_mb"),
        "load_rss_first_half_mb": load.get("rss_first_half_mb"),
        "load_rss_second_half_mb": load.get("rss_second_half_mb"),
        "load_differences_vs_1_worker": load.get("differences_vs_1_worker"),
        "corpus_peak_rss_mb": corpus.get("peak_rss_mb"),
        "engine_crash_infra_errors": sections.get("engine_crash", {}).get("infra_errors"),
        "forging_tried": corpus.get("forging", {}).get("tried"),
        "forging_detected": corpus.get("forging", {}).get("detected"),
        "forging_flagged_suspicious": corpus.get("forging", {}).get("flagged_suspicious"),
        "forging_remaining": corpus.get("forging", {}).get("remaining"),
        "agent_git_tried": agent_git.get("tried"),
        "agent_git_contained": agent_git.get("contained"),
        "forging4_tried": f4.get("tried"),
        "forging4_resolved": f4.get("forged"),
        "forging4_rejected": f4.get("rejected"),
        "forging4_flagged": f4.get("flagged"),
        "forging4_gold_resolved": f4.get("gold_resolved"),
        "failed_checks": failed,
    }


LABELS = {
    "cases_tried": "cases tried (corpus + faults + grader scripts + agent-path git cases + forging round 4)",
    "contained": "contained (expected outcome, nothing escaped)",
    "known_limits": "known limits (tried, reported, not counted as contained)",
    "lost_results": "lost results",
    "leaked_containers": "leaked containers",
    "leaked_volumes": "leaked volumes",
    "leaked_temp_dirs": "leaked temp dirs",
    "load_evaluations": "load: evaluations",
    "load_workers": "load: workers (= cores)",
    "load_evals_per_min": "load: evaluations per minute",
    "load_peak_rss_mb": "load: peak memory of the gagar process (MiB, VmHWM)",
    "load_rss_first_half_mb": "load: peak RSS, first half of the run (MiB)",
    "load_rss_second_half_mb": "load: peak RSS, second half of the run (MiB)",
    "load_differences_vs_1_worker": "load: results differing from a 1-worker run",
    "corpus_peak_rss_mb": "corpus: peak memory of the gagar process (MiB; holds the 50 MB diff)",
    "engine_crash_infra_errors": "engine crash: predictions ended as infra_error, then finished on re-run",
    "forging_tried": "report forging: cases tried (corpus category `forge`, pytest/Go/JUnit)",
    "forging_detected": "report forging: detected (unresolved)",
    "forging_flagged_suspicious": "report forging: of those, flagged suspicious_report",
    "forging_remaining": "report forging: still possible (come out resolved)",
    "agent_git_tried": "agent path: git attacks and no-future probes tried (hardening/agent_git.py)",
    "agent_git_contained": "agent path: contained (no host marker, no secret, no future, plant proved live)",
    "forging4_tried": "forging round 4: attack rollouts tried (hardening/forging4.py, 18 shapes x 2 test commands)",
    "forging4_resolved": "forging round 4: attack rollouts resolved (the forgery worked)",
    "forging4_rejected": "forging round 4: rejected before anything was written",
    "forging4_flagged": "forging round 4: unresolved and flagged tampered_tests or suspicious_report",
    "forging4_gold_resolved": "forging round 4: gold resolved (of 2 test commands)",
    "seconds": "suite wall time (s)",
}


def markdown(doc: dict) -> str:
    f = doc["figures"]
    rows = [f"| {LABELS.get(k, k)} | {', '.join(v) if isinstance(v, list) else v} |" for k, v in f.items()
            if k != "failed_checks"]
    rows.append(f"| failed checks | {len(f['failed_checks'])} |")
    m = doc.get("machine", {})
    head = (f"Measured {doc.get('date', '')} on {m.get('cores')} cores, Python {m.get('python')}, by "
            "`make reliability` (`bench/results/reliability.json`).\n\n| figure | value |\n|---|---|\n")
    return head + "\n".join(rows)


def _print(figures: dict, sections: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table("figure", "value", title="gagar reliability")
    for k, v in figures.items():
        if k != "failed_checks":
            t.add_row(k, json.dumps(v) if isinstance(v, list | dict) else str(v))
    t.add_row("failed_checks", str(len(figures["failed_checks"])))
    c = Console()
    c.print(t)
    s = Table("section", "result", "seconds")
    for name, sec in sections.items():
        s.add_row(name, "ok" if not sec.get("problems") else f"FAILED ({len(sec['problems'])})",
                  str(sec.get("seconds")))
    c.print(s)
    for p in figures["failed_checks"]:
        c.print(f"[red]FAILED[/red] {p}", markup=True, highlight=False)


if __name__ == "__main__":
    sys.exit(main())
