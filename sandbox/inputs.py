"""Loading `gagar eval`'s inputs: SWE-bench instances and predictions, as JSONL, a JSON list, or a JSON dict
keyed by instance_id. The documented policy (README, `gagar eval`): a broken line or record is skipped with a
note naming it and the rest is used; a file with nothing usable is an `InputError`. Lines are read by the
project's one JSONL reader (`sandbox.jsonl`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path

from sandbox.jsonl import JsonlError, parse_lines, read_text
from sandbox.records import Instance, Prediction


class InputError(ValueError):
    """An input file that cannot be used at all (missing, unreadable, wrong shape, an instance that cannot run)."""


def check_runnable(instances: Mapping[str, Instance] | Iterable[Instance], *, test_cmd: bool = True,
                   fail_to_pass: bool = True) -> dict[str, list[str]]:
    """What keeps each instance from an honest verdict, by instance id (only those with a problem).

    - no FAIL_TO_PASS (missing or empty): with nothing that must go from failing to passing, any patch that
      keeps PASS_TO_PASS green would resolve — a silent reward for doing nothing;
    - no test_cmd: there is nothing to run (`test_cmd=False` skips this check).

    `fail_to_pass=False` is for runs that derive the lists (base vs fix: bench/hackset, bench/swebench_rows), which
    read the test statuses and never the verdict.

    Call it after environment specs are applied (`sandbox.env.spec.apply_specs`): a spec may supply the
    test_cmd. The CLIs (`gagar eval`, `gagar validate`, `gagar image build --instances`) and the trainer's task
    loader refuse such instances before anything runs (`require_runnable`)."""
    items = instances.values() if isinstance(instances, Mapping) else instances
    out: dict[str, list[str]] = {}
    for inst in items:
        problems = []
        if fail_to_pass and not inst.FAIL_TO_PASS:
            problems.append("FAIL_TO_PASS is missing or empty (with no test that must start passing, any patch "
                            "that keeps PASS_TO_PASS green would resolve)")
        if test_cmd and not (inst.test_cmd or "").strip():
            problems.append("test_cmd is missing (set it on the instance, or pass --env-specs with a spec that "
                            "gives one)")
        if problems:
            out[inst.instance_id] = problems
    return out


def require_runnable(instances: Mapping[str, Instance] | Iterable[Instance], source: str | Path | None = None, *,
                     test_cmd: bool = True, fail_to_pass: bool = True) -> None:
    """`check_runnable`, raising an `InputError` that names every instance and field at fault."""
    problems = check_runnable(instances, test_cmd=test_cmd, fail_to_pass=fail_to_pass)
    if not problems:
        return
    lines = [f"  {iid}: {p}" for iid, ps in list(problems.items())[:20] for p in ps]
    more = f"\n  … and {len(problems) - 20} more instance(s)" if len(problems) > 20 else ""
    where = f" in {source}" if source else ""
    raise InputError(f"{len(problems)} instance(s){where} cannot be evaluated; nothing was run:\n"
                     + "\n".join(lines) + more)


def _whole_json(text: str, bad_utf8: bool, path: Path, what: str, notes: list[str]) -> list[tuple[int, dict]] | None:
    """The records of a JSON list or a dict keyed by instance_id; None when `text` is JSONL."""
    if text.lstrip()[:1] not in ("[", "{"):
        return None
    try:
        whole = json.loads(text)
    except ValueError:
        return None  # JSONL whose first line is an object
    if bad_utf8 and isinstance(whole, (list, dict)):
        raise InputError(f"cannot read {what} file {path}: not valid UTF-8")
    if isinstance(whole, list):
        out = []
        for i, r in enumerate(whole):
            if isinstance(r, dict):
                out.append((i, r))
            else:
                notes.append(f"{path} item {i}: not a JSON object; skipped")
        return out
    if isinstance(whole, dict) and not ("instance_id" in whole and len(text.strip().splitlines()) == 1):
        out = []
        for i, (k, v) in enumerate(whole.items()):
            if isinstance(v, dict):
                out.append((i, {"instance_id": k, **v}))
            else:
                notes.append(f"{path} key {k!r}: not a JSON object; skipped")
        return out
    return None


def _records(path: Path, what: str, notes: list[str]) -> list[tuple[int, dict]]:
    """(position, record): position counts every non-blank line (a skipped one too), so a prediction without
    rollout_id keeps the id its line number gives it."""
    try:
        text, bad_utf8 = read_text(path)
    except JsonlError as exc:
        raise InputError(f"cannot read {what} file {path}: {exc}") from exc
    whole = _whole_json(text, bad_utf8, path, what, notes)
    if whole is not None:
        return whole
    line_pos = {n: pos for pos, n in enumerate(n for n, ln in enumerate(text.splitlines(), 1) if ln.strip())}
    out = [(line_pos[n], r) for n, r in parse_lines(text, str(path), skip_bad=True, notes=notes, bad_utf8=bad_utf8)]
    if not out and text.strip():
        raise InputError(f"{path}: no usable {what} records (expected JSONL, a JSON list or a dict by instance_id)")
    return out


def load_instances(path: Path, notes: list[str]) -> dict[str, Instance]:
    from sandbox.env.spec import SpecError

    out: dict[str, Instance] = {}
    for pos, r in _records(Path(path), "instances", notes):
        try:
            inst = Instance.from_dict(r)
        except SpecError as exc:  # a bad env spec is not a broken line: stop before anything runs
            raise InputError(f"{path} record {pos}: {exc}") from exc
        except ValueError as exc:
            notes.append(f"{path} record {pos}: {exc}; skipped")
            continue
        if inst.instance_id in out:
            notes.append(f"{path}: instance {inst.instance_id} appears twice; the first is used")
            continue
        out[inst.instance_id] = inst
    return out


def load_predictions(path: Path, notes: list[str]) -> list[Prediction]:
    out, seen = [], set()
    for pos, r in _records(Path(path), "predictions", notes):
        iid = r.get("instance_id")
        if not iid:
            notes.append(f"{path} record {pos}: no instance_id; skipped")
            continue
        rid = r.get("rollout_id")
        patch = r.get("model_patch")
        if patch is not None and not isinstance(patch, str):
            notes.append(f"{path} record {pos}: model_patch is not a string; skipped")
            continue
        p = Prediction(instance_id=str(iid), model_patch=patch or "",
                       model_name_or_path=str(r.get("model_name_or_path") or "unknown"),
                       rollout_id=str(pos if rid is None else rid))
        if (p.instance_id, p.rollout_id) in seen:
            notes.append(f"{path} record {pos}: duplicate (instance_id={p.instance_id}, rollout_id={p.rollout_id});"
                         " skipped — give each rollout its own rollout_id")
            continue
        seen.add((p.instance_id, p.rollout_id))
        out.append(p)
    return out
