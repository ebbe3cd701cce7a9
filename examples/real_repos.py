#!/usr/bin/env python3
"""SWE-bench instances from real fix commits of two public repositories, to try environments on real code.

    git clone https://github.com/pallets/itsdangerous R/pallets__itsdangerous
    git clone https://github.com/lmittmann/tint       R/lmittmann__tint
    python examples/real_repos.py --repos-dir R --out OUT
    gagar eval --instances OUT/instances.jsonl --predictions OUT/predictions.jsonl --repos-dir R \
               --env-specs OUT/env_specs.json --run-id real --report-dir runs

itsdangerous 37f0997 (year-overflow fix; its failing test is 85b1e3b) needs freezegun and an installed package:
its spec installs `requirements/tests.txt` and runs `pip install -e .`. tint 2f95434 (panic on <nil>) has
`go 1.21` in go.mod and imports log/slog: Go 1.24 (trixie) is chosen. Each gets a gold and a no-op ("base")
prediction: gold resolves, base stays unresolved (docs/environments.md has the measured run). Nothing of these
repositories is shipped with gagar.
"""
import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from sandbox.integrity import gitsafe  # noqa: E402

ap = argparse.ArgumentParser(allow_abbrev=False)
ap.add_argument("--repos-dir", required=True)
ap.add_argument("--out", required=True)
args = ap.parse_args()
R, OUT = args.repos_dir, args.out
Path(OUT).mkdir(parents=True, exist_ok=True)
def git(repo, *a):
    return gitsafe.source_git(f"{R}/{repo}", *a)
PLAIN = ("--no-color", "--no-ext-diff", "--no-textconv")  # the diff as git computes it, no driver of the clone's
def inst(iid, repo, base, fix, test_commit, test_paths, src_paths, f2p, p2p, test_cmd, framework, env=None, version=None):
    d = {"instance_id": iid, "repo": repo, "base_commit": base,
         "patch": git(repo.replace("/", "__"), "diff", *PLAIN, base, fix, "--", *src_paths),
         "test_patch": git(repo.replace("/", "__"), "diff", *PLAIN, base, test_commit, "--", *test_paths),
         "FAIL_TO_PASS": json.dumps(f2p), "PASS_TO_PASS": json.dumps(p2p),  # as SWE-bench ships them
         "problem_statement": "", "hints_text": "", "created_at": "2022-03-08T00:00:00Z",
         "test_cmd": test_cmd, "test_framework": framework, "environment_setup_commit": base}
    if env:
        d["env"] = env
    if version:
        d["version"] = version
    return d
its = "pallets__itsdangerous"
base = git(its, "rev-parse", "85b1e3b^").strip()
i1 = inst("pallets__itsdangerous-year-overflow", "pallets/itsdangerous", base, "37f0997", "85b1e3b",
          ["tests"], ["src"], ["tests/test_itsdangerous/test_timed.py::TestTimestampSigner::test_malformed_future_timestamp"],
          ["tests/test_itsdangerous/test_timed.py::TestTimestampSigner::test_malformed_timestamp",
           "tests/test_itsdangerous/test_timed.py::TestTimestampSigner::test_future_age",
           "tests/test_itsdangerous/test_timed.py::TestTimestampSigner::test_max_age",
           "tests/test_itsdangerous/test_timed.py::TestTimestampSigner::test_timestamp_missing",
           "tests/test_itsdangerous/test_timed.py::TestTimestampSigner::test_sig_error_date_signed"],
          "python -m pytest -rA -p no:cacheprovider tests/test_itsdangerous/test_timed.py", "pytest", version="2.1")
tint = "lmittmann__tint"
tb = git(tint, "rev-parse", "2f95434^").strip()
i2 = inst("lmittmann__tint-88", "lmittmann/tint", tb, "2f95434", "2f95434", ["handler_test.go"], ["handler.go"],
          ["TestHandler/41"], [f"TestHandler/{i}" for i in range(41) if i not in (8, 31, 33)], "TZ= go test -tags=faketime -json ./...", "go")
json.dump({"pallets/itsdangerous": {"2.1": {"python": "3.11", "packages": "requirements/tests.txt",
                                            "install": "python -m pip install -e ."}}},
          open(f"{OUT}/env_specs.json", "w"), indent=1)
with open(f"{OUT}/instances.jsonl", "w") as f:
    for d in (i1, i2):
        f.write(json.dumps(d) + "\n")
with open(f"{OUT}/predictions.jsonl", "w") as f:
    for d in (i1, i2):
        f.write(json.dumps({"instance_id": d["instance_id"], "model_name_or_path": "gold", "rollout_id": "gold", "model_patch": d["patch"]}) + "\n")
        f.write(json.dumps({"instance_id": d["instance_id"], "model_name_or_path": "base", "rollout_id": "base",
            "model_patch": "diff --git a/.noop b/.noop\nnew file mode 100644\n--- /dev/null\n+++ b/.noop\n@@ -0,0 +1 @@\n+x\n"}) + "\n")
print(f"wrote {OUT}/instances.jsonl, predictions.jsonl, env_specs.json")
