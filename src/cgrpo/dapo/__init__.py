"""DAPO's dynamic sampling for TRL's GRPO: drop the groups whose rewards all agree and refill the batch with new
prompts.

- `config`: `DynamicSamplingConfig` and the checks any config with dynamic sampling options needs
  (`validate_dynamic_sampling`, which `CGRPOConfig(drop_unanimous=True)` runs too).
- `groups`: which groups are informative, the refill stream of prompts, and how the kept groups are shared out over
  processes (pure functions).
- `sampler`: `DynamicSampler`, the rounds of one generation batch, shared by `DynamicSamplingGRPOTrainer` and by
  `CGRPOTrainer` with `drop_unanimous`.
- `trainer`: `DynamicSamplingGRPOTrainer`, a drop-in for TRL's `GRPOTrainer`.
"""

from .config import DynamicSamplingConfig
from .trainer import DynamicSamplingGRPOTrainer

__all__ = ["DynamicSamplingConfig", "DynamicSamplingGRPOTrainer"]
