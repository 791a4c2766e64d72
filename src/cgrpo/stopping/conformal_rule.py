"""C-GRPO's own rule: stop where the split-conformal prediction set over the answers so far is a single answer."""

from __future__ import annotations

import random
from typing import Any

from ..calibration import Thresholds, calibration_scores, fit_thresholds, should_stop
from ..conformal import DELTA_MARGIN
from .base import Pools, StoppingRule, register, repeat_leader

__all__ = ["ConformalRule"]


@register
class ConformalRule(StoppingRule):
    """One threshold ``qhat_k`` per budget, fitted by split-conformal prediction (:mod:`cgrpo.calibration`).

    Options: ``delta`` (miscoverage level; None chooses it from the calibration solve rate), ``delta_margin`` and
    ``split_delta`` (see `CGRPOConfig`). Its fit is a :class:`~cgrpo.calibration.Thresholds`.
    """

    name = "conformal"
    label = "C-GRPO"
    calibrated = True
    parameter = "delta"
    sweep = (None, 0.1, 0.2, 0.35, 0.5)
    defaults = {"delta": None, "delta_margin": DELTA_MARGIN, "split_delta": False}

    def check_options(self) -> None:
        delta = self.options["delta"]
        if delta is not None and not (isinstance(delta, (int, float)) and 0.0 < delta < 1.0):
            raise ValueError(f"The conformal rule's delta must lie in (0, 1) or be None (automatic), got {delta!r}.")

    @classmethod
    def from_config(cls, args) -> ConformalRule:
        return cls(args.score, delta=args.conformal_delta, delta_margin=args.delta_margin, split_delta=args.split_delta)

    def fit(self, pools: Pools) -> Thresholds:
        scores = calibration_scores(pools.score, pools.grid, pools.outcomes, pools.golds, pools.rng)
        options = self.options
        return fit_thresholds(scores, options["delta"], options["delta_margin"], options["split_delta"])

    def fit_from_dict(self, data: Any) -> Thresholds:
        return Thresholds.from_dict(data)

    def fit_to_dict(self, fit: Thresholds) -> dict[str, Any]:
        return fit.to_dict()

    def stops(self, k, outcomes, rewards, fit: Thresholds, rng) -> bool:
        return should_stop(self.score, k, fit.qhat[k], outcomes, rng)

    def could_stop(self, j, outcomes, rewards, fit: Thresholds) -> bool:
        # The set is a singleton exactly when the top answer's share (or, for the execution scores, the passes) reaches
        # qhat_j, so repeating the leader decides it. The tie-break draws never change that decision, so a generator
        # of its own keeps the real one's stream as it was.
        return self.stops(j, repeat_leader(self.score, outcomes, j), None, fit, random.Random(0))
