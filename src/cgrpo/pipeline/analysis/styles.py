"""One look across every figure: each method and each stopping rule has one colour and one marker, set here alone.

A stopping rule trained as a method (`cgrpo.ablations.rules`) and the same rule in the replay look the same: the
conformal rule is C-GRPO's and the fixed rule GRPO's (fixed-group GRPO on the grid). The settings of one method share
its colour in shades, the first setting the colour itself, so that a method reads as one family in every figure. A
rule a plugin registers gets a colour and marker of its own from a spare list, by its name, the same in every figure
and run. The colours are Okabe and Ito's, distinguishable with the common colour-vision deficiencies.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass

from matplotlib.colors import to_hex, to_rgb

__all__ = ["BAND", "BASE", "REFERENCE", "STYLES", "Style", "progression", "shades", "style"]


@dataclass(frozen=True)
class Style:
    """How a method or rule is drawn: its colour and its matplotlib marker."""

    color: str
    marker: str


STYLES: dict[str, Style] = {
    "cgrpo": Style("#0072B2", "o"),
    "grpo": Style("#D55E00", "s"),
    "dapo": Style("#CC79A7", "^"),
    "unanimous": Style("#009E73", "v"),
    "share": Style("#E69F00", "D"),
    "esc": Style("#56B4E9", "P"),
    "adaptive": Style("#8C564B", "X"),
    "signal": Style("#6A3D9A", "h"),
    "balanced": Style("#882255", "d"),
    "greso": Style("#44AA99", "<"),
    "knapsack": Style("#999933", ">"),
    "base": Style("#555555", "*"),
}
# The replay's names for two methods' rules.
RULE_METHODS = {"conformal": "cgrpo", "fixed": "grpo"}
# A plugin's rule: one of these, picked by its name.
_SPARE = [Style("#B8860B", "<"), Style("#17BECF", ">"), Style("#BCBD22", "p"), Style("#E7298A", "H")]

# What is not a method: the base model's line, the nominal targets and theory's bands.
BASE = STYLES["base"].color
REFERENCE = "#000000"
BAND = "#BBBBBB"


def style(name: str) -> Style:
    """The style of a method (a key of `cgrpo.pipeline.configuration.methods.METHODS`, or ``"base"``) or a rule."""
    name = RULE_METHODS.get(name, name)
    if name in STYLES:
        return STYLES[name]
    return _SPARE[zlib.crc32(name.encode()) % len(_SPARE)]


def shades(color: str, count: int) -> list[str]:
    """`count` shades of `color` for the settings of one method: the colour itself first, then alternately darker
    and lighter ones, never so light that they fade into the white axes."""
    rgb = to_rgb(color)
    steps = [0.0] + [sign * 0.22 * (1 + i // 2) for i, sign in zip(range(count - 1), [-1, 1] * count)]
    return [_mix(rgb, step) for step in steps]


def progression(color: str, count: int) -> list[str]:
    """`count` shades of `color` for a sequence in time (a run's calibrations): the colour itself, then darker."""
    rgb = to_rgb(color)
    return [_mix(rgb, -0.6 * i / max(1, count - 1)) for i in range(count)]


def _mix(rgb: Sequence[float], step: float) -> str:
    # Negative steps move toward black, positive ones toward white, by |step| (capped so the shade stays visible).
    step = max(-0.6, min(0.55, step))
    target = 1.0 if step > 0 else 0.0
    return to_hex([channel + abs(step) * (target - channel) for channel in rgb])
