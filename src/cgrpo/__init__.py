"""C-GRPO: conformal, per-prompt rollout budgets for GRPO post-training with TRL."""

__version__ = "0.1.0"
