"""Supervised fine-tuning of the judge: training data with known-order labels (synthetic degradations or real
rollouts), TRL `SFTTrainer` + PEFT LoRA training, and evaluation against the heuristic.
Entry points: `gagar sft history|data|train|eval` (`sft.cli`), `sft.data.main`, `sft.train.train(cfg)`,
`sft.evaluate.main`."""
