"""The experiment pipeline built on the C-GRPO trainer: tasks, the offline base model, splits, training runs,
evaluation, tables and plots. Each Snakemake rule calls one function of these modules.

Nothing in `cgrpo` itself imports this package: `from cgrpo import CGRPOConfig, CGRPOTrainer` loads the trainer
library alone.
"""
