"""C-GRPO: conformal, per-prompt rollout budgets for GRPO post-training with TRL.

The package is the trainer library: `CGRPOConfig` and `CGRPOTrainer` (`config`, `trainer`, `trainer_calibration`,
`trainer_state`, `padding`, and the stopping rules in `stopping`) on the seeded conformal core they share with the evaluation (`conformal`, `calibration`), and DAPO's dynamic
sampling for TRL's GRPO (`DynamicSamplingConfig`, `DynamicSamplingGRPOTrainer` in `dynamic_sampling`) on the sampler
C-GRPO reuses with `drop_unanimous=True` (`sampler`). The trainers share one support layer (`support`). The experiment pipeline built on it lives in `cgrpo.pipeline`, which nothing here imports.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

__all__ = ["CGRPOConfig", "CGRPOTrainer", "DynamicSamplingConfig", "DynamicSamplingGRPOTrainer", "__version__"]

# TRL takes seconds to import; loading the trainer on first use keeps the pure modules (conformal, calibration)
# and the pipeline's table and plot steps fast.
_LAZY = {
    "CGRPOConfig": "cgrpo.config",
    "CGRPOTrainer": "cgrpo.trainer",
    "DynamicSamplingConfig": "cgrpo.dynamic_sampling",
    "DynamicSamplingGRPOTrainer": "cgrpo.dynamic_sampling",
}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'cgrpo' has no attribute {name!r}")
