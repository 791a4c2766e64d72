"""The checks `CGRPOConfig.__post_init__` runs on the prompt allocator's options and on Reinforce-Ada's balanced group."""

from __future__ import annotations

from .reinforce_ada import WEIGHTINGS

__all__ = ["validate_allocation", "validate_balanced_group"]


def validate_allocation(config) -> None:
    """Refuse allocation options without an allocator, with dynamic sampling, or off the grid; build the allocator
    (which checks its name and options); `allocation_rollouts_per_prompt` None becomes the grid's largest budget."""
    if config.prompt_allocator is None:
        if config.allocator_options or config.allocation_rollouts_per_prompt is not None:
            raise ValueError(
                "allocator_options and allocation_rollouts_per_prompt configure a prompt allocator; set "
                "prompt_allocator (e.g. 'greso') or drop them."
            )
        return
    if config.drop_unanimous:
        raise ValueError(
            "prompt_allocator and drop_unanimous both replace prompts of a generation batch; use one of them."
        )
    # Building the allocator checks its name and options before any model is loaded.
    config.build_allocator()
    smallest = config.budget_grid[0]
    if config.allocation_rollouts_per_prompt is None:
        config.allocation_rollouts_per_prompt = float(config.max_budget)
    elif not smallest <= config.allocation_rollouts_per_prompt <= config.max_budget:
        raise ValueError(
            f"allocation_rollouts_per_prompt must lie between the grid's smallest and largest budgets ({smallest} "
            f"and {config.max_budget}), got {config.allocation_rollouts_per_prompt!r}."
        )


def validate_balanced_group(config) -> None:
    """Refuse a balanced group off the grid, under a reward scaling, or beside a prompt allocator or dynamic sampling."""
    if config.balanced_weighting not in WEIGHTINGS:
        raise ValueError(
            f"balanced_weighting must be one of {', '.join(WEIGHTINGS)}, got {config.balanced_weighting!r}."
        )
    size = config.balanced_group_size
    if size is None:
        return
    if not (isinstance(size, int) and not isinstance(size, bool) and 2 <= size <= config.max_budget):
        raise ValueError(
            f"balanced_group_size must be an integer between 2 and max(budget_grid) ({config.max_budget}), got "
            f"{size!r}."
        )
    if config.scale_rewards != "none":
        raise ValueError(
            "balanced_group_size takes the mean reward of a prompt's answers as the baseline without dividing by a "
            f"deviation (Reinforce-Ada), which scale_rewards={config.scale_rewards!r} would; set scale_rewards='none'."
        )
    if config.prompt_allocator is not None or config.drop_unanimous:
        raise ValueError(
            "balanced_group_size chooses which answers train within each group, which a prompt allocator or "
            "drop_unanimous does not yet compose with; use one of them."
        )
