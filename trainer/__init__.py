"""RL post-training of code agents: the advantage engine (GRPO family, GAPO, GAGAR), the SWE agent, rollout
backends and the native RL loop, plus verl/TRL integrations and controlled experiments.
Entry points: `gagar train CONFIG` (`trainer.cli`), `trainer.loop.train(cfg)`,
`trainer.advantage.compute_advantages`; rooms: `advantage/`, `agent/`, `rollout/`, `integrations/` and
`experiments/` (`gagar experiment`)."""
