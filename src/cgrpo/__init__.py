"""C-GRPO: conformal, per-prompt rollout budgets for GRPO post-training with TRL."""

from .config import CGRPOConfig
from .trainer import CGRPOTrainer

__version__ = "0.1.0"

__all__ = ["CGRPOConfig", "CGRPOTrainer", "__version__"]
