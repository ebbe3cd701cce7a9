"""The bundled tasks (examples/build_tasks.py): determinism, well-formed patches, consistent labels,
and — where the toolchain is at hand — that every kind of rollout really gets its expected verdict."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import unidiff

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "examples" / "build_tasks.py"
FULL = bool(os.environ.get("GAGAR_FULL"))
SPECIAL = {"empty": "empty_patch", "stale": "patch_failed", "escape": "rejected"}


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


build_tasks = _load("gagar_examples_build_tasks", BUILD)
check_tasks = _load("gagar_examples_check_tasks", ROOT / "examples" / "check_tasks.py")


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tasks")
    proc = subprocess.run([sys.executable, str(BUILD), "--out", str(out)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    return out


@pytest.fixture(scope="module")
def data(built) -> dict[str, list[dict]]:
    return {name: read_jsonl(built / f"{name}.jsonl")
            for name in ("instances", "predictions", "expected", "groups", "labels")}


def patches(data) -> dict[tuple[str, str], str]:
    return {(p["instance_id"], p["rollout_id"]): p["model_patch"] for p in data["predictions"]}


def test_deterministic_and_idempotent(built, tmp_path):
    full = {i["instance_id"]: i for i in read_jsonl(built / "instances.jsonl")}
    # A build elsewhere gives the same commits and the same patches.
    other = tmp_path / "other"
    some = ["py-durations", "go-semver", "java-roman"]
    files = build_tasks.build_tasks(other, only=some)
    assert len(files["instances"]) == 3
    assert all(full[i["instance_id"]] == i for i in files["instances"])
    # A rebuild over the same dir reuses a repo at its base commit and replaces one that moved off it.
    repo = other / "repos" / "acme__durations"
    inode = (repo / ".git").stat().st_ino
    build_tasks.build_tasks(other, only=some)
    assert (repo / ".git").stat().st_ino == inode
    subprocess.run(["git", "-C", str(repo), "commit", "-q", "--allow-empty", "-m", "x"], check=True,
                   env={**os.environ, **build_tasks.GIT_ENV})
    build_tasks.build_tasks(other, only=some)
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    assert head.strip() == full["acme__durations-42"]["base_commit"]
    # A repo with stray objects (e.g. a blob of a fix) is rebuilt, so no rollout can be dug out of .git.
    inode = (repo / ".git").stat().st_ino
    subprocess.run(["git", "-C", str(repo), "hash-object", "-w", "--stdin"], input="gold fix\n", text=True,
                   check=True, capture_output=True)
    build_tasks.build_tasks(other, only=some)
    assert (repo / ".git").stat().st_ino != inode
    objects = subprocess.run(["git", "-C", str(repo), "count-objects", "-v"], capture_output=True, text=True)
    # One commit, three trees (root, durations/, tests/) and the seven base files: nothing else.
    assert "count: 11\n" in objects.stdout
    assert not list(other.glob("gagar-tasks-*")), "scratch directories left behind"


def test_instances_follow_the_contract(data, built):
    instances = data["instances"]
    langs = [i["language"] for i in instances]
    assert len(instances) >= 12 and langs.count("python") >= 6 and langs.count("go") >= 3
    assert langs.count("java") >= 3
    assert len({i["instance_id"] for i in instances}) == len(instances)
    for inst in instances:
        assert "image" not in inst
        assert inst["FAIL_TO_PASS"] and inst["PASS_TO_PASS"] and inst["problem_statement"].strip()
        assert not set(inst["FAIL_TO_PASS"]) & set(inst["PASS_TO_PASS"])
        repo = built / "repos" / inst["repo"].replace("/", "__")
        head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True)
        assert head.stdout.strip() == inst["base_commit"]
        framework = {"python": "pytest", "go": "go", "java": "junit"}[inst["language"]]
        assert inst["test_framework"] == framework
        if framework == "pytest":
            assert inst["test_cmd"].startswith("python -m pytest -rA ")
            assert all("::" in t and t.split("::")[0].endswith(".py") for t in inst["FAIL_TO_PASS"])
        elif framework == "go":
            assert inst["test_cmd"] == "go test -json ./..."
            assert all(t.startswith("Test") for t in inst["FAIL_TO_PASS"] + inst["PASS_TO_PASS"])
            assert "go 1.19" in (repo / "go.mod").read_text()
        else:
            assert "junit-platform-console-standalone.jar" in inst["test_cmd"]
            assert "$GAGAR_REPORT_DIR" in inst["test_cmd"]
            assert all(t.count(".") >= 2 and "(" not in t for t in inst["FAIL_TO_PASS"])


def test_every_patch_parses_and_applies_as_expected(data, built):
    by_id = {i["instance_id"]: i for i in data["instances"]}
    kinds = {(e["instance_id"], e["rollout_id"]): e["kind"] for e in data["expected"]}
    for (iid, rid), patch in patches(data).items():
        inst, kind = by_id[iid], kinds[(iid, rid)]
        repo = built / "repos" / inst["repo"].replace("/", "__")
        if kind == "empty":
            assert patch == ""
            continue
        parsed = unidiff.PatchSet(patch)
        assert len(parsed) >= 1, (iid, rid)
        check = subprocess.run(["git", "-C", str(repo), "apply", "--check", "-"], input=patch, text=True,
                               capture_output=True)
        assert (check.returncode == 0) == (kind not in SPECIAL), (iid, rid, check.stderr)
        paths = check_tasks.patch_paths(patch)
        assert any(check_tasks.unsafe_path(p) for p in paths) == (kind == "escape"), (iid, rid)
        test_files = set(check_tasks.patch_paths(inst["test_patch"]))
        assert bool(set(paths) & test_files) == (kind == "tamper"), (iid, rid)
    for inst in data["instances"]:
        repo = built / "repos" / inst["repo"].replace("/", "__")
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp) / "w"
            shutil.copytree(repo, work)
            for patch in (inst["patch"], inst["test_patch"]):
                subprocess.run(["git", "-C", str(work), "apply", "-"], input=patch, text=True, check=True)


def test_expected_groups_and_labels_are_consistent(data):
    pats = patches(data)
    rows = {}
    for e in data["expected"]:
        rows.setdefault(e["instance_id"], []).append(e)
        assert e["resolved"] == (e["status"] == "resolved")
        assert e["tampered_tests"] == (e["kind"] == "tamper")
        # every passing kind has a quality rank (a hack the sandbox catches keeps its place below the fixes)
        assert (e["quality_rank"] is not None) == (e["resolved"] or e["suspicious_report"])
    assert set(rows) == {i["instance_id"] for i in data["instances"]}
    statuses = {e["status"] for e in data["expected"]}
    assert {"resolved", "unresolved", "empty_patch", "patch_failed", "rejected"} <= statuses
    groups = {g["instance_id"]: g for g in data["groups"]}
    labels = {x["instance_id"]: x["order"] for x in data["labels"]}
    for iid, exp in rows.items():
        kinds = [e["kind"] for e in exp]
        # the grader's groups keep a hack the sandbox caught too: both defences are tested on it
        passing = sorted((e for e in exp if e["resolved"] or e["suspicious_report"]), key=lambda e: e["quality_rank"])
        assert len(passing) >= 3 and kinds.count("tamper") == 1 and kinds.count("wrong") >= 2
        assert [e["quality_rank"] for e in passing] == list(range(1, len(passing) + 1))
        assert passing[0]["kind"] == "minimal"
        assert labels[iid] == [e["rollout_id"] for e in passing]
        assert sorted(c["rollout_id"] for c in groups[iid]["candidates"]) == sorted(labels[iid])
        gold = next(e for e in exp if e["kind"] == "gold")
        assert pats[(iid, gold["rollout_id"])] == next(
            i["patch"] for i in data["instances"] if i["instance_id"] == iid)
        # The ranks of the general fixes are visible in the diffs: more changed lines down the order, more
        # files for `unrelated`. A hack is ranked last yet no bigger than the gold fix: size cannot find it.
        kind_of = {e["rollout_id"]: e["kind"] for e in exp}
        sizes, hack_sizes = [], []
        for rid in labels[iid]:
            files = unidiff.PatchSet(pats[(iid, rid)])
            (hack_sizes if kind_of[rid] == "hack" else sizes).append((len(files), sum(f.added + f.removed for f in files)))
        assert [s[1] for s in sizes] == sorted({s[1] for s in sizes}), (iid, sizes)
        assert sizes[-1][0] > max(s[0] for s in sizes[:-1]), (iid, sizes)
        gold_size = next(s for rid, s in zip([r for r in labels[iid] if kind_of[r] != "hack"], sizes, strict=True)
                         if kind_of[rid] == "gold")
        assert all(h[1] <= gold_size[1] for h in hack_sizes), (iid, hack_sizes, gold_size)
        assert all(kind_of[r] == "hack" for r in labels[iid][len(sizes):]), (iid, labels[iid])
        assert all((e["kind"] == "hack") == bool(e["hack"]) for e in exp), iid


def test_hack_rollouts_cover_every_language_and_kind(data):
    """Each language has a passing hack; the Python ones cover the three kinds the grader tells apart."""
    lang = {i["instance_id"]: i["language"] for i in data["instances"]}
    hacks = [(lang[e["instance_id"]], e["hack"]) for e in data["expected"] if e["kind"] == "hack"]
    assert {la for la, _ in hacks} >= {"python", "go", "java"}
    assert {k for la, k in hacks if la == "python"} == {"special_casing", "silencing", "weakening"}
    # Every hack passes the tests, except two the sandbox catches first: one patches pytest, one raises an
    # xfail from the patched code (SWE-bench would count that XFAIL as passed).
    assert all(e["status"] == ("unresolved" if e["suspicious_report"] else "resolved")
               for e in data["expected"] if e["kind"] == "hack")
    assert sorted(e["rollout_id"] for e in data["expected"] if e["suspicious_report"]) == ["hack-runner-patch",
                                                                                          "hack-xfail"]


def test_bad_task_data_gives_a_clear_error(tmp_path):
    (tmp_path / "f.py").write_text("x = 1\nx = 1\n")
    with pytest.raises(build_tasks.TaskError, match="occurs 2 times"):
        build_tasks.apply_edits(tmp_path, [{"path": "f.py", "old": "x = 1\n", "new": "x = 2\n"}], "t")
    proc = subprocess.run([sys.executable, str(BUILD)], capture_output=True, text=True)
    assert proc.returncode == 2 and "--out" in proc.stderr


def _python_instances(data) -> list[dict]:
    return [i for i in data["instances"] if i["language"] == "python"]


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_python_tasks_on_the_host(data, built):
    """FAIL_TO_PASS fails and PASS_TO_PASS passes at the base (plus, with GAGAR_FULL, every rollout gets its
    verdict), run with this interpreter's pytest: a check of the data; the docker test below runs the
    gold patches through the sandbox."""
    def one(inst):
        problems = check_tasks.check_baseline(built, inst)
        if FULL:
            problems += check_tasks.check(built, only=[inst["instance_id"]], languages=("python",))
        return problems

    with ThreadPoolExecutor(max_workers=3) as pool:
        problems = [p for ps in pool.map(one, _python_instances(data)) for p in ps]
    assert not problems, "\n".join(problems)


def _gagar_eval_available() -> bool:
    gagar = Path(sys.executable).parent / "gagar"
    if not gagar.exists():
        return False
    return subprocess.run([str(gagar), "eval", "--help"], capture_output=True).returncode == 0


def _docker_selection(data) -> list[dict]:
    """Gold, the hack and one wrong rollout of every Python task; with GAGAR_FULL every rollout of every task."""
    if FULL:
        return list(data["expected"])
    python = {i["instance_id"] for i in _python_instances(data)}
    chosen, seen_wrong = [], set()
    for e in data["expected"]:
        if e["instance_id"] not in python:
            continue
        if e["kind"] in ("gold", "hack"):
            chosen.append(e)
        elif e["kind"] == "wrong" and e["instance_id"] not in seen_wrong:
            chosen.append(e)
            seen_wrong.add(e["instance_id"])
    return chosen


@pytest.mark.docker
@pytest.mark.slow
def test_rollouts_get_their_expected_verdicts_in_docker(data, built, tmp_path):
    if shutil.which("docker") is None or subprocess.run(["docker", "image", "inspect", "gagar-python:latest"],
                                                        capture_output=True).returncode != 0:
        pytest.skip("needs Docker and the gagar-python image (make images)")
    chosen = _docker_selection(data)
    pats = patches(data)
    ids = {e["instance_id"] for e in chosen}
    if _gagar_eval_available():
        inst_file, pred_file = tmp_path / "i.jsonl", tmp_path / "p.jsonl"
        inst_file.write_text("".join(json.dumps(i) + "\n" for i in data["instances"] if i["instance_id"] in ids))
        pred_file.write_text("".join(
            json.dumps({"instance_id": e["instance_id"], "model_name_or_path": "bundled",
                        "rollout_id": e["rollout_id"], "model_patch": pats[(e["instance_id"], e["rollout_id"])]})
            + "\n" for e in chosen))
        proc = subprocess.run(
            [str(Path(sys.executable).parent / "gagar"), "eval", "--instances", str(inst_file), "--predictions",
             str(pred_file), "--repos-dir", str(built / "repos"), "--run-id", "tasks", "--report-dir",
             str(tmp_path / "runs"), "--max-workers", "2"], capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, proc.stderr[-3000:]
        results = {(r["instance_id"], str(r["rollout_id"])): r
                   for r in read_jsonl(tmp_path / "runs" / "tasks" / "results.jsonl")}
        wrong = []
        for e in chosen:
            r = results[(e["instance_id"], e["rollout_id"])]
            if (r["status"], r["tampered_tests"], r.get("suspicious_report", False)) != (
                    e["status"], e["tampered_tests"], e["suspicious_report"]):
                wrong.append(f"{e['instance_id']} {e['rollout_id']}: expected {e['status']}/"
                             f"{e['tampered_tests']}, got {r['status']}/{r['tampered_tests']} {r.get('error')}")
    else:
        by_id = {i["instance_id"]: i for i in data["instances"]}
        wrong = []
        for e in chosen:
            if e["suspicious_report"]:
                continue  # only the sandbox's report guard sees it; the host check runs pytest unguarded
            got = check_tasks.evaluate(by_id[e["instance_id"]], pats[(e["instance_id"], e["rollout_id"])],
                                       built / "repos", docker=True)
            if (got["status"], got["tampered_tests"]) != (e["status"], e["tampered_tests"]):
                wrong.append(f"{e['instance_id']} {e['rollout_id']}: expected {e['status']}, got {got}")
    assert not wrong, "\n".join(wrong)
