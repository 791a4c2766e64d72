"""C-GRPO: conformal, per-prompt rollout budgets for GRPO post-training with TRL.

The package is the trainer library:

- the method's mathematics, pure and seeded: `conformal` (scores, quantile, prediction sets), `calibration` (fitting
  thresholds, replaying the rule over many prompts) and `costs` (savings in generated rollouts);
- `CGRPOConfig` and `CGRPOTrainer` (`config`, `trainer`, with its parts `trainer_budgets`, `trainer_calibration`,
  `trainer_checks`, `trainer_state`, `padding` and `vllm_streaming`), and the stopping rules as plug-ins (`stopping`);
- prompt allocators as plug-ins, deciding across a batch's prompts before they are drawn (`allocation`: GRESO, a
  knapsack allocator, Reinforce-Ada's balanced sampling; their logic, not yet in the trainer);
- DAPO's dynamic sampling for TRL's GRPO (`dapo`: `DynamicSamplingConfig`, `DynamicSamplingGRPOTrainer`, and the
  sampler C-GRPO reuses with `drop_unanimous=True`);
- a compute budget for any GRPO trainer (`budget`: `RolloutBudget`), and a learning-rate schedule over it
  (`budget_schedule`: `BudgetLRSchedule`);
- what the trainers share, below them all (`support`).

The experiment pipeline built on it lives in `cgrpo.pipeline`, which nothing here imports.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

__all__ = [
    "BudgetLRSchedule",
    "CGRPOConfig",
    "CGRPOTrainer",
    "DynamicSamplingConfig",
    "DynamicSamplingGRPOTrainer",
    "RolloutBudget",
    "__version__",
]

# TRL takes seconds to import; loading the trainer on first use keeps the pure modules (conformal, calibration)
# and the pipeline's table and plot steps fast.
_LAZY = {
    "BudgetLRSchedule": "cgrpo.budget_schedule",
    "CGRPOConfig": "cgrpo.config",
    "CGRPOTrainer": "cgrpo.trainer",
    "DynamicSamplingConfig": "cgrpo.dapo",
    "DynamicSamplingGRPOTrainer": "cgrpo.dapo",
    "RolloutBudget": "cgrpo.budget",
}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'cgrpo' has no attribute {name!r}")
