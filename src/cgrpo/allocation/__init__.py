"""Prompt allocators as plug-ins: before a generation batch, each prompt's planned rollouts from its history.

Registered here, run by `CGRPOTrainer` with `CGRPOConfig.prompt_allocator` (`cgrpo.allocation.batch`):

* ``greso``: skips, before rollout, prompts whose recent groups all agreed, with an adaptive exploration probability;
* ``knapsack``: shares a batch's rollouts out by each prompt's last success rate under a fixed total;

and Reinforce-Ada's balanced exit, balanced group and pool-baseline advantages (`reinforce_ada`), which act within a
prompt as it is drawn (the trainer's `balanced` stopping rule and `balanced_group_size`). A new allocator is one :class:`PromptAllocator` subclass
decorated with :func:`register_allocator` (docs/method.md, "Prompt allocators").
"""

from . import greso, knapsack, reinforce_ada  # noqa: I001
from .base import ALLOCATORS, PromptAllocator, allocator_names, get_allocator, register_allocator

__all__ = [
    "ALLOCATORS",
    "PromptAllocator",
    "allocator_names",
    "get_allocator",
    "greso",
    "knapsack",
    "register_allocator",
    "reinforce_ada",
]
