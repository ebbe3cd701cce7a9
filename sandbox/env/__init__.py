"""Environments: base images built offline, per-spec environment images, toolchains, task validation."""
