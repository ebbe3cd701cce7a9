"""Group-relative advantage estimators as pure batched tensor functions, and their registry.

Every estimator has the signature ``fn(x, sizes, **params) -> Tensor`` where
  x:     (G, m) float32/float64 — rewards of G groups, padded to the widest group m;
  sizes: (G,) long or None — true group sizes (None: every group is full, size m);
and returns (G, m) advantages (padding cells are ignored by the caller). No Python loop over groups:
everything is a sort, an unfold/gather or a masked reduction over the whole batch.

Edge cases, shared by all estimators:
  * a group of 1 gets advantage 0 (no relative signal; the (n-1) divisor is clamped to 1);
  * a group whose rewards are all equal gets 0;
  * NaN or ±inf rewards raise ValueError in ``compute_advantages`` (a silent NaN would poison the update).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from fractions import Fraction

import torch
from torch import Tensor

Estimator = Callable[..., Tensor]
ESTIMATORS: dict[str, Estimator] = {}


def register_estimator(name: str, fn: Estimator | None = None, *, overwrite: bool = False):
    """Register ``fn`` under ``name`` (usable as a decorator). Re-registering a name needs ``overwrite``."""

    def deco(f: Estimator) -> Estimator:
        if name in ESTIMATORS and ESTIMATORS[name] is not f and not overwrite:
            raise ValueError(f"estimator {name!r} is already registered; pass overwrite=True to replace it")
        ESTIMATORS[name] = f
        return f

    return deco(fn) if fn is not None else deco


def _mask(x: Tensor, sizes: Tensor | None) -> Tensor | None:
    """(G, m) bool of real cells, or None when every group is full."""
    if sizes is None:
        return None
    return torch.arange(x.shape[1], device=x.device) < sizes[:, None]


def _count(x: Tensor, sizes: Tensor | None) -> Tensor:
    """(G, 1) group sizes as x's dtype."""
    if sizes is None:
        return x.new_full((x.shape[0], 1), x.shape[1])
    return sizes.to(x.dtype)[:, None]


def _sum(v: Tensor, mask: Tensor | None) -> Tensor:
    """(G, m) -> (G, 1) sum over the real cells."""
    if mask is not None:
        v = torch.where(mask, v, torch.zeros((), dtype=v.dtype, device=v.device))
    return v.sum(1, keepdim=True)


def _bessel_std(d: Tensor, n: Tensor, mask: Tensor | None) -> Tensor:
    """sqrt(Σ d² / (n − 1)) per group, (G, 1); n − 1 is clamped to 1 so a group of 1 gives 0."""
    return torch.sqrt(_sum(d * d, mask) / (n - 1).clamp(min=1))


@register_estimator("grpo")
def grpo(x: Tensor, sizes: Tensor | None = None, *, eps: float = 1e-6, norm: bool = True) -> Tensor:
    """GRPO: A = (r − mean) / (std + eps), std with Bessel's correction. x: (G, m) -> (G, m)."""
    mask = _mask(x, sizes)
    n = _count(x, sizes)
    d = x - _sum(x, mask) / n
    return d / (_bessel_std(d, n, mask) + eps) if norm else d


@register_estimator("dr_grpo")
def dr_grpo(x: Tensor, sizes: Tensor | None = None) -> Tensor:
    """Dr. GRPO: A = r − mean (no std normalisation). x: (G, m) -> (G, m)."""
    return grpo(x, sizes, norm=False)


@register_estimator("rloo")
def rloo(x: Tensor, sizes: Tensor | None = None) -> Tensor:
    """RLOO: A_i = r_i − mean of the other n − 1 rewards = (n·r_i − Σr)/(n − 1); a group of 1 gives 0."""
    mask = _mask(x, sizes)
    n = _count(x, sizes)
    out = (n * x - _sum(x, mask)) / (n - 1).clamp(min=1)
    return torch.where(n > 1, out, torch.zeros_like(out))


# Two window widths within TIE_ULPS float rounding steps of the group's largest |reward| are the same width:
# rewards like thirds or tenths are not exact in binary floating point, so equal true widths come out of the
# subtraction a few ulps apart, and a strict minimum would pick whichever window the rounding favoured.
TIE_ULPS = 8


def window_size(n: Tensor | int, coverage: float) -> Tensor | int:
    """k = ceil(coverage · n), clamped to [1, n], in exact integer arithmetic.

    ``coverage`` is read as the nearest fraction p/q with q <= 10**6 (0.55 -> 11/20, 0.1 + 0.2 -> 3/10), so
    k = ceil(p·n / q) = (p·n + q − 1) // q has no float error: τ = 0.55, n = 100 gives 55, not 56.
    """
    frac = Fraction(coverage).limit_denominator(10**6)
    p, q = frac.numerator, frac.denominator
    if isinstance(n, int):
        return min(max((p * n + q - 1) // q, 1), n)
    return ((n.long() * p + (q - 1)) // q).clamp(min=1).minimum(n)


def _lowest_narrowest(widths: Tensor, lo: Tensor, hi: Tensor) -> Tensor:
    """(G, 1) start of the lowest window whose width ties the narrowest one.

    widths: (G, w) per window start (+inf where no window starts); lo, hi: (G, 1) smallest and largest reward.
    """
    # sorted rewards: max |r| = max(hi, −lo); the tolerance scales with it, as the rounding error does
    scale = torch.maximum(hi, lo.neg())
    thr = widths.amin(1, keepdim=True).add_(scale, alpha=TIE_ULPS * torch.finfo(widths.dtype).eps)
    wider = widths > thr  # False exactly at the tied windows
    # argmin returns the first minimum (documented), i.e. the lowest tied window; uint8 view: no copy
    return wider.view(torch.uint8).argmin(1, keepdim=True)


def _center(s: Tensor, sizes: Tensor | None, coverage: float, center: str) -> tuple[Tensor, float]:
    """(t, c) with Q = c·t: c = 0.5 when t is the sum of an even window's two middle values, else 1, so the
    halving fuses into the caller's ``x − c·t`` (one kernel fewer: small batches are launch-bound on CPU)."""
    m = s.shape[1]
    if sizes is None:
        k = window_size(m, coverage)
        widths = s[:, k - 1 :] - s[:, : m - k + 1]  # (G, m − k + 1), one per window start
        start = _lowest_narrowest(widths, s[:, :1], s[:, m - 1 :])
        if center == "mean":
            return s.unfold(1, k, 1).mean(-1).gather(1, start), 1.0
        if k % 2:
            return s.gather(1, start + k // 2), 1.0
        # the two-middle sums of every window at once, then the chosen window's
        return (s[:, k // 2 - 1 : m - k // 2] + s[:, k // 2 : m - k // 2 + 1]).gather(1, start), 0.5
    k = window_size(sizes, coverage)[:, None]  # (G, 1), one k per group
    starts = torch.arange(m, device=s.device)[None, :]  # (1, m)
    ends = starts + k - 1
    valid = ends < sizes[:, None]
    widths = s.gather(1, ends.clamp(max=m - 1)) - s
    widths = torch.where(valid, widths, torch.full((), math.inf, dtype=s.dtype, device=s.device))
    start = _lowest_narrowest(widths, s[:, :1], s.gather(1, sizes[:, None] - 1))
    if center == "mean":
        inside = (starts >= start) & (starts < start + k)
        total = torch.where(inside, s, torch.zeros((), dtype=s.dtype, device=s.device)).sum(1, keepdim=True)
        return total / k.to(s.dtype), 1.0
    return s.gather(1, start + (k - 1) // 2) + s.gather(1, start + k // 2), 0.5


def gapo_center(s: Tensor, sizes: Tensor | None, coverage: float, center: str) -> Tensor:
    """Centre Q of the narrowest window of k = ceil(coverage·n) sorted rewards; ties (widths within TIE_ULPS
    rounding steps of the largest |reward|) -> the lowest window.

    s: (G, m) rewards sorted ascending, padding (if any) +inf at the end. Returns Q: (G, 1).
    """
    t, c = _center(s, sizes, coverage, center)
    return t * c if c != 1.0 else t


@register_estimator("gapo")
def gapo(
    x: Tensor,
    sizes: Tensor | None = None,
    *,
    coverage: float = 0.5,
    eps: float = 1e-6,
    center: str = "median",
    norm: bool = True,
) -> Tensor:
    """GAPO: A = (r − Q)/(D + eps), or r − Q when ``norm=False``. x: (G, m) -> (G, m).

    Q: median (even k: mean of the two middle values) — or mean with ``center="mean"`` — of the narrowest
    window of k = ceil(coverage·n) sorted rewards (ties: the lowest window). D = sqrt(Σ(r − Q)²/(n − 1)) over
    the whole group. Group of 1 -> 0; group of 2 (coverage 0.5) -> k = 1, Q = min, so A = (0, Δ/(|Δ| + eps)).
    """
    if not 0.0 < coverage <= 1.0:
        raise ValueError(f"coverage must be in (0, 1], got {coverage}")
    if center not in ("median", "mean"):
        raise ValueError(f"center must be 'median' or 'mean', got {center!r}")
    if sizes is None:  # fast path: every group full, fewest kernel launches
        t, c = _center(torch.sort(x, dim=1)[0], None, coverage, center)
        d = torch.sub(x, t, alpha=c)
        if not norm:
            return d
        scale = 1.0 / math.sqrt(max(x.shape[1] - 1, 1))
        return d / torch.linalg.vector_norm(d, dim=1, keepdim=True).mul_(scale).add_(eps)
    mask = _mask(x, sizes)
    padded = torch.where(mask, x, torch.full((), math.inf, dtype=x.dtype, device=x.device))
    t, c = _center(torch.sort(padded, dim=1)[0], sizes, coverage, center)
    d = torch.sub(x, t, alpha=c)
    if not norm:
        return d
    return d / (_bessel_std(d, _count(x, sizes), mask) + eps)
