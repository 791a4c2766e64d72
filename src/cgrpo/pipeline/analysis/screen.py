"""The difficulty screen: on a model's sample pools, how many rollouts each stopping rule saves against fixed group
sizes at an equal share of informative prompts, before any training (`benchmarks/difficulty_screen.py`).

A prompt is informative when its ``max(grid)`` rewards differ (GRPO can learn from it). The fixed group sizes of the
grid trace how the share of informative prompts a group keeps grows with its rollouts; a rule's *saving* is the
rollouts per prompt that line needs to keep the rule's share, divided by the rule's own rollouts per prompt (1.5:
the rule keeps as many informative prompts with two thirds of the rollouts). Where the rule keeps more than the
largest fixed group, it has no saving to state (NaN).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from .replay import MEASURES, replay_frontier, rule_settings

__all__ = ["pool_shares", "savings_at_equal_informative", "screen_pools"]

_ROLLOUTS, _KEPT = MEASURES.index("rollouts"), MEASURES.index("kept")
_INFORMATIVE = MEASURES.index("informative")


def savings_at_equal_informative(keys: Sequence[tuple[str, Any]], measures: np.ndarray) -> pd.DataFrame:
    """One row per non-fixed rule setting of a replay (`replay_frontier`'s keys and measures): its rollouts per
    prompt, the share of informative prompts it keeps, the fixed-G rollouts at that share, and the saving."""
    means = measures.mean(axis=1)
    informative = means[:, _INFORMATIVE]
    rollouts = means[:, _ROLLOUTS]
    with np.errstate(invalid="ignore", divide="ignore"):
        kept = means[:, _KEPT] / informative
    fixed = [s for s, (name, _) in enumerate(keys) if name == "fixed"]
    order = sorted(fixed, key=lambda s: rollouts[s])
    rows = []
    for s, (name, value) in enumerate(keys):
        if name == "fixed":
            continue
        inside = kept[order[0]] <= kept[s] <= kept[order[-1]]
        at_fixed = float(np.interp(kept[s], kept[order], rollouts[order])) if inside else np.nan
        rows.append(
            {
                "rule": name,
                "setting": "auto" if value is None else value,
                "rollouts_per_prompt": rollouts[s],
                "informative_kept": kept[s],
                "fixed_rollouts_at_equal_kept": at_fixed,
                "saving": at_fixed / rollouts[s],
            }
        )
    return pd.DataFrame(rows)


def pool_shares(rewards: Sequence[Sequence[float]]) -> dict[str, float]:
    """Shares of prompts whose pools are all correct (trivial), all wrong (hopeless) or mixed, and the mean reward."""
    rates = np.array([np.mean(row) for row in rewards])
    return {
        "trivial": float(np.mean(rates == 1.0)),
        "hopeless": float(np.mean(rates == 0.0)),
        "mixed": float(np.mean((rates > 0) & (rates < 1))),
        "accuracy": float(rates.mean()),
    }


def screen_pools(pools, resplits: int, seed: int) -> tuple[dict[str, float], pd.DataFrame]:
    """The pools' shares (`pool_shares`) and every registered rule's saving at its default sweep."""
    rules = rule_settings(pools.grid, {}, {}, pools.score)
    keys, measures = replay_frontier(pools, rules, resplits, seed)
    return pool_shares(pools.rewards), savings_at_equal_informative(keys, measures)
