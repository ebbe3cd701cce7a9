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


# Two windows are equally narrow when their widths differ by at most TIE_ULPS float rounding steps of the values
# that bound them: rewards like thirds or tenths are not exact in binary floating point, so equal true widths come
# out of the subtraction a few ulps apart, and a strict minimum would pick whichever window the rounding favoured.
# The tolerance comes from each window's own end values (never the group's largest |r|), so an outlier far away
# cannot make unequal windows tie.
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


def _tied(lo: Tensor, hi: Tensor, padded: bool = False) -> Tensor:
    """(G, w) bool: the windows as narrow as the narrowest one, up to rounding.

    lo, hi: (G, w) first and last sorted value of every window (``padded``: +inf in both where no window starts;
    the caller masks those out of the result).
    """
    widths = hi - lo
    if padded:  # inf − inf = NaN where no window starts: never the minimum
        widths = widths.nan_to_num(nan=math.inf)
    tol = torch.maximum(lo.abs(), hi.abs()).mul_(TIE_ULPS * torch.finfo(lo.dtype).eps)
    best = widths.argmin(1, keepdim=True)  # one narrowest window; the others are compared with it
    return widths - widths.gather(1, best) <= tol + tol.gather(1, best)


def gapo_center(s: Tensor, sizes: Tensor | None, coverage: float, center: str) -> Tensor:
    """Centre Q of GAPO: the mean of the centres (median, or mean with ``center="mean"``) of every narrowest window
    of k = ceil(coverage·n) sorted rewards (widths equal up to TIE_ULPS rounding steps of each window's own
    values). s: (G, m) rewards sorted ascending, padding (if any) +inf at the end. Returns Q: (G, 1)."""
    m = s.shape[1]
    zero = torch.zeros((), dtype=s.dtype, device=s.device)
    if sizes is None:
        k = window_size(m, coverage)
        w = m - k + 1
        tied = _tied(s[:, :w], s[:, k - 1 :])  # (G, w), one per window start
        if center == "mean":
            centres = s.unfold(1, k, 1).mean(-1)
        elif k % 2:
            centres = s[:, k // 2 : k // 2 + w]
        else:
            centres = (s[:, k // 2 - 1 : k // 2 - 1 + w] + s[:, k // 2 : k // 2 + w]) * 0.5
        return torch.where(tied, centres, zero).sum(1, keepdim=True) / tied.sum(1, keepdim=True)
    k = window_size(sizes, coverage)[:, None]  # (G, 1), one k per group
    starts = torch.arange(m, device=s.device)[None, :]  # (1, m)
    valid = starts + k - 1 < sizes[:, None]
    inf = torch.full((), math.inf, dtype=s.dtype, device=s.device)
    hi = torch.where(valid, s.gather(1, (starts + k - 1).clamp(max=m - 1)), inf)
    tied = _tied(torch.where(valid, s, inf), hi, padded=True) & valid
    if center == "mean":
        # window sums from a float64 running sum over the real cells (padding is +inf), then back to s's dtype
        real = starts < sizes[:, None]
        run = torch.where(real, s, zero).double().cumsum(1)
        run = torch.cat([torch.zeros_like(run[:, :1]), run], 1)  # run[:, j] = sum of the first j values
        ends = (starts + k).clamp(max=m)
        centres = ((run.gather(1, ends) - run[:, :m]) / k.double()).to(s.dtype)
    else:
        centres = (s.gather(1, (starts + (k - 1) // 2).clamp(max=m - 1))
                   + s.gather(1, (starts + k // 2).clamp(max=m - 1))) * 0.5
    centres = torch.where(tied, centres, zero)  # untied (and padding) windows hold inf/NaN otherwise
    return centres.sum(1, keepdim=True) / tied.sum(1, keepdim=True)


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
    window of k = ceil(coverage·n) sorted rewards; when several windows are equally narrow, the mean of their
    centres (symmetric: evenly spaced rewards get Q = their midpoint, so their advantages sum to 0).
    D = sqrt(Σ(r − Q)²/(n − 1)) over the whole group. Group of 1 -> 0; group of 2 (coverage 0.5) -> k = 1, both
    one-value windows tie, Q = the midpoint, A = ±Δ/2 / (D + eps).
    """
    if not 0.0 < coverage <= 1.0:
        raise ValueError(f"coverage must be in (0, 1], got {coverage}")
    if center not in ("median", "mean"):
        raise ValueError(f"center must be 'median' or 'mean', got {center!r}")
    if sizes is None:  # fast path: every group full, fewest kernel launches
        d = x - gapo_center(torch.sort(x, dim=1)[0], None, coverage, center)
        if not norm:
            return d
        scale = 1.0 / math.sqrt(max(x.shape[1] - 1, 1))
        return d / torch.linalg.vector_norm(d, dim=1, keepdim=True).mul_(scale).add_(eps)
    mask = _mask(x, sizes)
    padded = torch.where(mask, x, torch.full((), math.inf, dtype=x.dtype, device=x.device))
    d = x - gapo_center(torch.sort(padded, dim=1)[0], sizes, coverage, center)
    if not norm:
        return d
    return d / (_bessel_std(d, _count(x, sizes), mask) + eps)
