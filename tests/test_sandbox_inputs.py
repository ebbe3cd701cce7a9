"""Instances that could never give an honest verdict are refused when the instance file loads, before anything
runs: no FAIL_TO_PASS (any patch that keeps PASS_TO_PASS green would resolve) or no test_cmd (nothing to run).
The test_cmd check runs after the environment specs, which may supply one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sandbox_fixtures import CalcTask, require_docker

from sandbox.cli import eval_main
from sandbox.records import Instance, Prediction


@pytest.fixture
def task(tmp_path: Path) -> CalcTask:
    return CalcTask(tmp_path)


def _write(task: CalcTask, rows: list[dict]) -> tuple[Path, Path]:
    inst = task.root / "bad-instances.jsonl"
    inst.write_text("".join(json.dumps(r) + "\n" for r in rows))
    preds = task.root / "bad-preds.jsonl"
    preds.write_text("".join(json.dumps({"instance_id": r["instance_id"], "model_patch": task.instance["patch"]})
                             + "\n" for r in rows))
    return inst, preds


def _bad_rows(task: CalcTask) -> list[dict]:
    no_f2p = {k: v for k, v in task.instance.items() if k != "FAIL_TO_PASS"} | {"instance_id": "acme__calc-2"}
    return [task.instance, no_f2p,
            {**task.instance, "instance_id": "acme__calc-3", "FAIL_TO_PASS": "[]"},
            {**task.instance, "instance_id": "acme__calc-4", "test_cmd": ""}]


def test_eval_refuses_instances_without_fail_to_pass_or_test_cmd(task: CalcTask, tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture) -> None:
    inst, preds = _write(task, _bad_rows(task))
    out = tmp_path / "out"
    rc = eval_main(["--instances", str(inst), "--predictions", str(preds), "--repos-dir", str(task.repos_dir),
                    "--run-id", "r", "--report-dir", str(out), "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "acme__calc-2: FAIL_TO_PASS is missing or empty" in err
    assert "acme__calc-3: FAIL_TO_PASS is missing or empty" in err
    assert "acme__calc-4: test_cmd is missing" in err
    assert "acme__calc-1" not in err and "nothing was run" in err
    assert not (out / "r" / "results.jsonl").exists() and not (out / "r" / "report.json").exists()


def test_check_runnable_names_each_instance_and_problem(task: CalcTask) -> None:
    from sandbox.inputs import check_runnable

    rows = _bad_rows(task)
    got = check_runnable([Instance.from_dict(r) for r in rows])
    assert sorted(got) == ["acme__calc-2", "acme__calc-3", "acme__calc-4"]
    assert check_runnable([Instance.from_dict(rows[3])], test_cmd=False) == {}
    # a run that derives the lists (bench/hackset, bench/swebench_rows: base vs fix) needs no FAIL_TO_PASS yet
    assert check_runnable([Instance.from_dict(r) for r in rows[1:3]], fail_to_pass=False) == {}
    assert sorted(check_runnable([Instance.from_dict(r) for r in rows], fail_to_pass=False)) == ["acme__calc-4"]


def test_the_python_api_refuses_an_instance_without_fail_to_pass(task: CalcTask) -> None:
    from sandbox.config import SandboxConfig
    from sandbox.run import evaluate_predictions

    inst = Instance.from_dict({**task.instance, "FAIL_TO_PASS": []})
    with pytest.raises(ValueError, match="acme__calc-1: FAIL_TO_PASS is missing or empty"):
        evaluate_predictions([inst], [Prediction(inst.instance_id, task.instance["patch"])],
                             SandboxConfig(repos_dir=task.repos_dir))


def test_validate_and_image_build_refuse_them_too(task: CalcTask, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture) -> None:
    from sandbox.cli import image_main
    from sandbox.env.validate import main as validate_main

    inst, _ = _write(task, _bad_rows(task))
    rc = validate_main(["--instances", str(inst), "--repos-dir", str(task.repos_dir), "--out", str(tmp_path / "v")])
    err = capsys.readouterr().err
    assert rc == 2 and "acme__calc-2: FAIL_TO_PASS" in err and "acme__calc-4: test_cmd" in err
    assert not (tmp_path / "v" / "runs").exists()
    rc = image_main(["build", "--instances", str(inst), "--repos-dir", str(task.repos_dir)])
    err = capsys.readouterr().err
    assert rc == 2 and "acme__calc-3: FAIL_TO_PASS" in err and "acme__calc-4: test_cmd" in err


def test_the_trainer_refuses_them_when_it_loads_its_tasks(task: CalcTask) -> None:
    from trainer.config import TrainConfig
    from trainer.tasks import load_instances

    inst, _ = _write(task, _bad_rows(task))
    cfg = TrainConfig.model_validate({"tasks": {"instances": str(inst), "repos_dir": str(task.repos_dir)}})
    with pytest.raises(ValueError, match="acme__calc-2: FAIL_TO_PASS is missing or empty"):
        load_instances(cfg)


@pytest.mark.docker
def test_the_test_cmd_check_comes_after_the_env_specs(task: CalcTask, tmp_path: Path, monkeypatch) -> None:
    """A spec may supply the test_cmd (SWE-bench rows carry none): the check must see the instance after
    `apply_specs`, never before. Here a stand-in spec map gives it; the run then goes ahead."""
    require_docker()
    import sandbox.env.spec as spec

    real = spec.apply_specs

    def apply_specs(instances, specs):
        for i in instances.values():
            i.test_cmd = i.test_cmd or "python -m pytest tests"
        return real(instances, specs)

    monkeypatch.setattr(spec, "apply_specs", apply_specs)
    inst, preds = _write(task, [{**task.instance, "test_cmd": ""}])
    out = tmp_path / "out"
    rc = eval_main(["--instances", str(inst), "--predictions", str(preds), "--repos-dir", str(task.repos_dir),
                    "--run-id", "r", "--report-dir", str(out), "--no-progress"])
    assert rc == 0
    (line,) = (out / "r" / "results.jsonl").read_text().splitlines()
    assert json.loads(line)["status"] == "resolved"
