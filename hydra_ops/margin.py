"""The rule every measured hardware choice follows: a faster option wins only by a margin the
measurement resolves.

Two options were timed in several rounds each, interleaved. The challenger replaces the default
(the conservative option: fp32, the first backend of a fixed order) only when

- its fastest round beats the default's fastest round by at least ``margin``
  (``min(default) / min(challenger) >= 1 + margin``), and
- its **slowest** round is faster than the default's **fastest** round (the two sets of rounds do
  not overlap).

Anything closer is noise on a shared or busy machine, and the default is kept: two runs that
measure within noise of each other make the same choice. The rule is written into the hardware
record with the raw rounds (:func:`describe_rule`).
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["DEFAULT_MARGIN", "clearly_faster", "describe_rule"]

#: The challenger's fastest round must be at least this much faster than the default's (0.15:
#: 1.15x).
DEFAULT_MARGIN: float = 0.15


def clearly_faster(
    challenger: Sequence[float], default: Sequence[float], margin: float = DEFAULT_MARGIN
) -> bool:
    """Whether ``challenger``'s rounds (seconds or ms, lower is faster) beat ``default``'s by
    the rule of the module doc. ValueError for an empty side or a negative margin."""
    if not challenger or not default:
        raise ValueError("clearly_faster: each option needs at least one timed round")
    if margin < 0:
        raise ValueError(f"clearly_faster: margin must be >= 0, got {margin!r}")
    fast, slow = min(challenger), min(default)
    if fast <= 0:
        return False
    return slow / fast >= 1.0 + margin and max(challenger) < slow


def describe_rule(margin: float = DEFAULT_MARGIN) -> str:
    """The rule in one sentence, for the record."""
    return (
        f"a faster option replaces the default (fp32; the first backend of the fixed order) only "
        f"when its fastest round is >= {1 + margin:.2f}x faster than the default's fastest round "
        "and its slowest round is faster than the default's fastest; otherwise the default stays"
    )
