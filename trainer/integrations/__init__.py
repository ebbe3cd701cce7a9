"""Integrations of the advantage engine with other trainers; each imports its framework lazily.
Entry points: verl — `trainer.integrations.verl_plugin.register()` (GAPO/GAGAR advantage estimators) and
`verl_trainer.run(config)` (`GagarRayPPOTrainer`, grading in the loop); TRL — `trl_grpo.GagarGRPOTrainer`."""
