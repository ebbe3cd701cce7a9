from .money import round_money, split_evenly, to_cents

__all__ = ["round_money", "split_evenly", "to_cents"]
