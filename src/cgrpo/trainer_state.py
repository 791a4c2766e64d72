"""`CGRPOState`: what a `CGRPOTrainer` decides the rest of its run with and adds its costs up in, beyond TRL's state."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from .calibration import Thresholds
from .support.learning_signal import SIGNAL_KEYS

# Keys of `CGRPOState.totals` (documented with `CGRPOTrainer.cgrpo_totals`).
TOTALS_KEYS = (
    "train_rollouts",
    "train_tokens",
    "groups",
    "lockstep_rollouts",
    "generation_rounds",
    "calibration_rollouts",
    "calibration_tokens",
    "generation_s",
    "calibration_s",
    "extraction_errors",
    "verifier_errors",
    "holdout_rollouts",
    "holdout_tokens",
    "holdout_s",
    "holdout_cpu_s",
    *SIGNAL_KEYS,
)


@dataclass
class CGRPOState:
    """One process's C-GRPO state, saved in every checkpoint (`to_dict`, JSON-ready) and restored from it.

    Attributes:
        thresholds: the conformal thresholds in force (None before the first calibration, and always with another
            stopping rule).
        rule_fit: the fit in force of a calibrated stopping rule other than the conformal one (JSON data: see the
            rule's `fit`), None otherwise.
        last_calibration_step: the optimizer step of the latest calibration (None before the first).
        calibration_history: one record per calibration (step, delta, qhat, solve rate, cost).
        totals: running cost totals, keys `TOTALS_KEYS`.
        budget_histogram: training groups (all processes) per budget they stopped at.
        unlogged_calibration_rollouts: rollouts of the latest calibration, logged once, at the first step it serves.
        stopping_rng: the RNG of this process's stopping decisions.
    """

    stopping_rng: random.Random
    thresholds: Thresholds | None = None
    rule_fit: Any = None
    last_calibration_step: int | None = None
    calibration_history: list[dict[str, Any]] = field(default_factory=list)
    totals: dict[str, float] = field(default_factory=lambda: dict.fromkeys(TOTALS_KEYS, 0.0))
    budget_histogram: Counter[int] = field(default_factory=Counter)
    unlogged_calibration_rollouts: int | None = None

    def to_dict(self) -> dict[str, Any]:
        version, internal, gauss = self.stopping_rng.getstate()
        return {
            "thresholds": None if self.thresholds is None else self.thresholds.to_dict(),
            "rule_fit": self.rule_fit,
            "last_calibration_step": self.last_calibration_step,
            "calibration_history": self.calibration_history,
            "totals": self.totals,
            "budget_histogram": {str(k): n for k, n in self.budget_histogram.items()},
            "unlogged_calibration_rollouts": self.unlogged_calibration_rollouts,
            "stopping_rng": [version, list(internal), gauss],
        }

    @classmethod
    def from_dict(cls, state: dict[str, Any]) -> CGRPOState:
        version, internal, gauss = state["stopping_rng"]
        rng = random.Random()
        rng.setstate((version, tuple(internal), gauss))
        return cls(
            stopping_rng=rng,
            thresholds=None if state["thresholds"] is None else Thresholds.from_dict(state["thresholds"]),
            rule_fit=state.get("rule_fit"),
            last_calibration_step=state["last_calibration_step"],
            calibration_history=[_history_record(record) for record in state["calibration_history"]],
            totals={**dict.fromkeys(TOTALS_KEYS, 0.0), **state["totals"]},
            budget_histogram=Counter({int(k): n for k, n in state["budget_histogram"].items()}),
            unlogged_calibration_rollouts=state["unlogged_calibration_rollouts"],
        )


def _history_record(record: dict[str, Any]) -> dict[str, Any]:
    # JSON turned the budgets into strings; the live history keys them by int, as Thresholds.to_dict does.
    restored = dict(record)
    if "qhat" in record:
        restored["qhat"] = _by_budget(record["qhat"])
    if "holdout" in record:
        restored["holdout"] = {**record["holdout"], "coverage": _by_budget(record["holdout"]["coverage"])}
    return restored


def _by_budget(values: dict) -> dict[int, Any]:
    return {int(k): v for k, v in values.items()}
