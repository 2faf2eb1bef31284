"""Percentiles as the seed article computes them, plus a compact log-binned histogram for token gaps.

The seed's percentile is `sorted(xs)[min(n-1, int(q*n))]` (no interpolation); reproducing its table
draw for draw needs exactly that rule, so every percentile here uses it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy.typing as npt

# Gap histogram resolution: bins of 1e-4 in ln(seconds), i.e. values within 0.01 % of the truth.
GAP_BINS_PER_LN = 10_000.0


# Up to this many values a list is sorted in Python (a seed row's 6,000: no numpy to import);
# beyond, numpy's partition is ~10x quicker than sorting (a day's millions of requests).
PYTHON_SORT_MAX = 50_000


def seed_percentile(values: Sequence[float] | npt.ArrayLike, q: float) -> float:
    """`sorted(xs)[min(n-1, int(q*n))]` (NaNs sort last, as numpy's do); NaN for an empty sample.

    Short lists and tuples are sorted in Python, anything else is partitioned by numpy: both select
    the same element.
    """
    if isinstance(values, list | tuple) and len(values) <= PYTHON_SORT_MAX:
        n = len(values)
        if n == 0:
            return math.nan
        index = min(n - 1, int(q * n))
        if not math.isnan(sum(values)):  # no NaN (the sum of one is NaN; so is inf - inf: then look)
            return float(sorted(values)[index])
        numbers = sorted(v for v in values if not math.isnan(v))
        return float(numbers[index]) if index < len(numbers) else math.nan
    import numpy as np

    array = np.asarray(values, dtype=np.float64)
    n = array.size
    if n == 0:
        return math.nan
    index = min(n - 1, int(q * n))
    return float(np.partition(array, index)[index])


def gap_bin(gap_s: float) -> int:
    """Histogram bin of one token gap (gaps are > 0: every step takes time)."""
    return math.floor(math.log(gap_s) * GAP_BINS_PER_LN)


def weighted_bin_percentile(histogram: dict[int, int], q: float) -> float:
    """The seed percentile of the multiset a bin → count histogram stands for (bin centre value)."""
    total = sum(histogram.values())
    if total == 0:
        return math.nan
    index = min(total - 1, int(q * total))
    seen = 0
    for key in sorted(histogram):
        seen += histogram[key]
        if seen > index:
            return math.exp((key + 0.5) / GAP_BINS_PER_LN)
    raise AssertionError("unreachable: the cumulative count reaches the total")


def mean_confidence_interval(samples: Sequence[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95 % confidence interval (Student t, n-1 degrees of freedom)."""
    import numpy as np

    array = np.asarray(samples, dtype=np.float64)
    n = array.size
    if n == 0:
        return math.nan, math.nan
    mean = float(array.mean())
    if n == 1:
        return mean, math.nan
    # Two-sided 97.5 % Student t quantiles for 1..10 degrees of freedom; 2.0 beyond (within 3 % to 30).
    t_quantiles = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228)
    t = t_quantiles[n - 2] if n - 2 < len(t_quantiles) else 2.0
    return mean, t * float(array.std(ddof=1)) / math.sqrt(n)
