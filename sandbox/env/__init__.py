"""Environments: base images built offline, per-spec environment images, toolchains, task validation.
Entry points: `gagar image build|list|ls|prune` and `gagar validate` (`sandbox.env.cli`, `sandbox.env.validate`),
`sandbox.env.images.select_image` / `build_image`."""
