"""An honest accuracy protocol: choose on one half of the images, report on the other, with intervals.

A setting (recipe, calibration method, budget) chosen on the images it is then reported on
looks better than it is; one image of 500 is 0.2 points, so differences of a few images are
noise. Hence:

* ``halves``: a seeded split of the evaluation set into a *tuning* half (every choice is made
  there) and a *report* half (the numbers quoted);
* ``wilson``: a 95 % interval for a top-1 rate;
* ``paired_bootstrap``: a 95 % interval for the difference of two settings measured on the
  *same* images (resampling images, so the pairing is kept);
* ``verdict``: "no gain" / "no loss" whenever that interval includes zero.
"""
from __future__ import annotations

import numpy as np

HALVES = ("all", "tune", "report")
SEED = 0
Z95 = 1.959963984540054


def halves(n: int, seed: int = SEED) -> dict[str, np.ndarray]:
    """Sorted image indices of each half: a seeded permutation cut in two (tune gets the odd one)."""
    perm = np.random.default_rng(seed).permutation(n)
    cut = (n + 1) // 2
    return {"all": np.arange(n), "tune": np.sort(perm[:cut]), "report": np.sort(perm[cut:])}


def wilson(hits: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of a proportion (well behaved near 0 and 1, unlike p ± z·se)."""
    if n <= 0:
        return (0.0, 1.0)
    p = hits / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (float(max(0.0, centre - half)), float(min(1.0, centre + half)))


def paired_bootstrap(a, b, reps: int = 10000, seed: int = SEED) -> dict:
    """Difference of mean(b) − mean(a) for per-image 0/1 outcomes on the same images, with the
    2.5 / 97.5 percentiles of ``reps`` image resamples."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.shape != b.shape or a.ndim != 1 or len(a) == 0:
        raise ValueError("paired_bootstrap needs two equal-length 1-D outcome vectors")
    d = b - a
    rng = np.random.default_rng(seed)
    means = np.empty(reps)
    for start in range(0, reps, 1000):          # 1000 resamples at a time bounds the memory
        k = min(1000, reps - start)
        means[start:start + k] = d[rng.integers(0, len(d), (k, len(d)))].mean(axis=1)
    lo, hi = np.percentile(means, [2.5, 97.5])
    return {"diff": float(d.mean()), "ci95": [float(lo), float(hi)], "verdict": verdict(lo, hi)}


def verdict(lo: float, hi: float) -> str:
    """What a difference interval allows one to say."""
    if lo > 0:
        return "gain"
    if hi < 0:
        return "loss"
    return "no gain or loss (interval includes 0)"


def at_chance(hits: int, n: int, classes: int) -> bool:
    """True when ``hits`` of ``n`` is not clearly above guessing among ``classes`` (3 sigma)."""
    if classes < 2 or n == 0:
        return False
    p = 1.0 / classes
    return hits <= n * p + 3 * np.sqrt(n * p * (1 - p))
