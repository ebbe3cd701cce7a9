"""sft package."""
