"""Where the trainer's patches are evaluated: the local Docker engine, or several Docker hosts.

With one engine, `evaluate_predictions` runs in-process (it groups predictions by instance and prepares each
group's repo copy once). With `sandbox.docker_hosts: [tcp://a:2376, ssh://b, ...]` the predictions are split by
instance over the hosts and each share runs as `gagar eval` with that host's `DOCKER_HOST` (the Docker SDK reads
the engine from the environment, which is per process). A remote engine bind-mounts paths of *its* machine,
so the repos dir and the run dir must be on a filesystem shared at the same path by every host (e.g. NFS).
Without a shared filesystem, run one sandbox per node instead (the verl recipe's Ray reward does that).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from sandbox.config import SandboxConfig
from sandbox.records import EvalResult, Instance, Prediction
from trainer.config import SandboxSection


class SandboxPool:
    def __init__(self, section: SandboxSection, repos_dir: Path, run_id: str = "gagar-train") -> None:
        self.section = section
        self.repos_dir = Path(repos_dir)
        self.hosts = list(section.docker_hosts)
        self.run_id = run_id

    def config(self) -> SandboxConfig:
        s = self.section
        return SandboxConfig(repos_dir=self.repos_dir, image=s.image, memory=s.memory, cpus=s.cpus,
                             timeout=s.timeout, max_workers=s.max_workers, run_id=self.run_id)

    def evaluate(self, instances: dict[str, Instance], predictions: list[Prediction],
                 run_dir: Path) -> list[EvalResult]:
        if not predictions:
            return []
        if len(self.hosts) <= 1:
            env_host = self.hosts[0] if self.hosts else None
            if env_host and os.environ.get("DOCKER_HOST") != env_host:
                return self._remote(env_host, instances, predictions, Path(run_dir))
            from sandbox.run import evaluate_predictions

            return evaluate_predictions(instances, predictions, self.config(), run_dir=Path(run_dir))
        # Whole instances per host, so each group's repo copy is still prepared once.
        by_inst: dict[str, list[Prediction]] = {}
        for p in predictions:
            by_inst.setdefault(p.instance_id, []).append(p)
        shares: list[list[Prediction]] = [[] for _ in self.hosts]
        for iid in sorted(by_inst, key=lambda i: -len(by_inst[i])):  # largest first onto the least loaded host
            min(shares, key=len).extend(by_inst[iid])
        jobs = [(k, h, s) for k, (h, s) in enumerate(zip(self.hosts, shares, strict=True)) if s]
        with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
            parts = pool.map(lambda j: self._remote(j[1], instances, j[2], Path(run_dir) / f"host{j[0]}"), jobs)
        return [r for part in parts for r in part]

    def _remote(self, host: str, instances: dict[str, Instance], preds: list[Prediction],
                run_dir: Path) -> list[EvalResult]:
        run_dir.mkdir(parents=True, exist_ok=True)
        inst_file, pred_file = run_dir / "instances.jsonl", run_dir / "predictions.jsonl"
        needed = {p.instance_id for p in preds}
        inst_file.write_text("".join(json.dumps(instances[i].to_dict()) + "\n" for i in sorted(needed)))
        pred_file.write_text("".join(json.dumps(p.to_dict()) + "\n" for p in preds))
        s = self.section
        cmd = [sys.executable, "-m", "gagar.cli", "eval", "--instances", str(inst_file), "--predictions",
               str(pred_file), "--repos-dir", str(self.repos_dir), "--run-id", "eval", "--report-dir", str(run_dir),
               "--max-workers", str(s.max_workers), "--timeout", str(s.timeout), "--memory", s.memory,
               "--cpus", str(s.cpus)] + (["--image", s.image] if s.image else [])
        proc = subprocess.run(cmd, env={**os.environ, "DOCKER_HOST": host}, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"gagar eval on DOCKER_HOST={host} failed ({proc.returncode}): {proc.stderr[-2000:]}")
        lines = (run_dir / "eval" / "results.jsonl").read_text().splitlines()
        return [EvalResult.from_dict(json.loads(ln)) for ln in lines if ln.strip()]
