"""Small numeric helpers shared by every layer (no imports from the package).

Covers only what more than one package needs: the geometric mean of speedups and ratios.
"""

from __future__ import annotations

import math
from collections.abc import Iterable


def geomean(values: Iterable[float]) -> float | None:
    """Geometric mean of the finite positive values; None when there are none.

    Zeros, negatives, NaN and infinities are left out rather than raising: callers pass
    ratios where a missing or failed measurement reads as 0 or None upstream.
    """
    vals = [v for v in values if v is not None and v > 0 and math.isfinite(v)]
    if not vals:
        return None
    return math.exp(sum(math.log(v) for v in vals) / len(vals))
