"""The trainer's sandbox pool and its executor setting. The Ray executor under it (and under the verl reward)
is tested on a real local Ray in test_sandbox_ray.py; the verl reward itself in test_advantage_verl.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from trainer_fixtures import ROOT

from trainer.config import SandboxSection
from trainer.sandbox_pool import SandboxPool


def test_docker_hosts_is_retired_with_a_pointer_to_ray():
    from trainer.config import ConfigError, load_config

    cfg = ROOT / "configs" / "tiny.yaml"
    with pytest.raises(ConfigError, match=r"sandbox\.docker_hosts was retired.*executor: ray"):
        load_config(cfg, ["sandbox.docker_hosts=[tcp://a:2376]"])
    with pytest.raises(ConfigError, match=r"sandbox\.executor must be .*local or ray"):
        load_config(cfg, ["sandbox.executor=k8s"])


def test_pool_uses_the_local_executor_by_default():
    from sandbox.executor import LocalExecutor

    assert isinstance(SandboxPool(SandboxSection(), Path("/nonexistent")).executor, LocalExecutor)
