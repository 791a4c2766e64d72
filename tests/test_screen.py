"""The difficulty screen's saving: fixed-G rollouts at a rule's share of informative prompts, over the rule's own."""

from __future__ import annotations

import math

import numpy as np
import pytest

from cgrpo.pipeline.analysis.replay import MEASURES
from cgrpo.pipeline.analysis.screen import pool_shares, savings_at_equal_informative


def _measures(rows: list[tuple[float, float]]) -> np.ndarray:
    """Replay measures of one prompt per setting: (rollouts, kept); every prompt informative."""
    array = np.zeros((len(rows), 1, len(MEASURES)))
    for s, (rollouts, kept) in enumerate(rows):
        array[s, 0, MEASURES.index("rollouts")] = rollouts
        array[s, 0, MEASURES.index("informative")] = 1.0
        array[s, 0, MEASURES.index("kept")] = kept
    return array


def test_a_rule_keeping_as_many_informative_prompts_with_fewer_rollouts_saves_the_ratio():
    keys = [("fixed", 2), ("fixed", 8), ("fixed", 32), ("signal", 0.1), ("unanimous", None), ("esc", 2)]
    measures = _measures([(2, 0.4), (8, 0.7), (32, 1.0), (10, 0.85), (4, 0.55), (3, 0.3)])
    table = savings_at_equal_informative(keys, measures).set_index("rule")
    # 0.85 lies halfway between G = 8 (0.7) and G = 32 (1.0): 20 rollouts, twice the rule's 10.
    assert table.loc["signal", "fixed_rollouts_at_equal_kept"] == pytest.approx(20.0)
    assert table.loc["signal", "saving"] == pytest.approx(2.0)
    assert table.loc["unanimous", "saving"] == pytest.approx(5.0 / 4.0)
    assert table.loc["unanimous", "setting"] == "auto"
    # A share below the smallest fixed group's is outside the line: no saving to state.
    assert math.isnan(table.loc["esc", "saving"])


def test_pool_shares_sort_prompts_into_trivial_hopeless_and_mixed():
    shares = pool_shares([[1, 1], [0, 0], [1, 0], [0, 0]])
    assert shares == {"trivial": 0.25, "hopeless": 0.5, "mixed": 0.25, "accuracy": 0.375}
