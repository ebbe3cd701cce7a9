"""Integrations of the advantage engine with other trainers (verl, TRL). Each imports its framework lazily."""
