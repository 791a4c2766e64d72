"""`DynamicSamplingConfig`, and the checks any GRPO config with dynamic sampling options needs (`CGRPOConfig`'s
`drop_unanimous` runs them too)."""

from __future__ import annotations

from dataclasses import dataclass, field

from trl import GRPOConfig

from ..support.config_checks import check_whole_groups, refuse_ignore_data_skip
from ..support.renames import quiet_trl_renames

# The DAPO recipe samples gen_batch_size = 3 x train_batch_size prompts per round.
DAPO_ROUNDS_OF_PROMPTS = 3


@dataclass
class DynamicSamplingConfig(GRPOConfig):
    r"""
    Configuration class for [`DynamicSamplingGRPOTrainer`].

    Every [`~trl.GRPOConfig`] option keeps its meaning; the generation batch (`generation_batch_size`, or
    `per_device_train_batch_size * num_processes * steps_per_generation`) is the number of rows, and so
    `generation_batch_size // num_generations` the number of informative groups, each generation batch is filled with.
    Dynamic sampling adds:

    The defaults are those of verl's DAPO recipe (`docs/dapo.md` lists what still differs).

    Parameters:
        prompts_per_round (`int` or `None`, *optional*, defaults to `None`):
            Prompts sampled per round, all processes together (DAPO's over-sampling, verl's `gen_batch_size`). The
            first round holds the dataloader's prompts and tops them up to this number from the training set; later
            rounds draw this many new prompts. `None` means `3 * generation_batch_size // num_generations`, three
            generation batches of prompts, as the recipe's `gen_batch_size = 3 * train_batch_size`. Must be at least
            one generation batch of prompts and a multiple of the number of processes.
        max_sampling_rounds (`int`, *optional*, defaults to `10`):
            Most rounds per generation batch, the first included (the recipe's `max_num_gen_batches`). `1` drops
            zero-variance groups without refilling.
        filter_metric (`str` or `None`, *optional*, defaults to `None`):
            Name of the reward function whose rewards alone decide whether a group is informative (verl's
            `filter_groups.metric`, the accuracy reward `"acc"` in the recipe), as TRL names reward functions: a
            function's `__name__` (that of the function a `functools.partial` binds), a reward model's name. `None`
            tests the reward TRL normalises (the weighted sum of all reward functions). An unknown name is an error
            when the trainer is built.
        allow_short_batch (`bool`, *optional*, defaults to `False`):
            When the rounds are spent with fewer informative groups than the batch needs, train on the ones found (a
            warning gives the counts) instead of stopping with an error, as verl does.
    """

    prompts_per_round: int | None = field(
        default=None,
        metadata={
            "help": "Prompts sampled per round, all processes together (verl's gen_batch_size); None means three "
            "generation batches of prompts, 3 * generation_batch_size // num_generations."
        },
    )
    max_sampling_rounds: int = field(
        default=10,
        metadata={
            "help": "Most generation rounds per generation batch, the first included (verl's max_num_gen_batches)."
        },
    )
    filter_metric: str | None = field(
        default=None,
        metadata={
            "help": "Name of the reward function (as TRL names it) whose rewards alone decide whether a group "
            "is informative (verl's filter_groups.metric); None tests the combined reward."
        },
    )
    allow_short_batch: bool = field(
        default=False,
        metadata={
            "help": "Train on the informative groups found when the rounds are spent short of a full batch, "
            "instead of stopping with an error as verl does."
        },
    )

    def __post_init__(self):
        with quiet_trl_renames():
            super().__post_init__()
        refuse_ignore_data_skip(self, "dynamic sampling's saved state (refill stream position, totals)")
        validate_dynamic_sampling(self, DAPO_ROUNDS_OF_PROMPTS)


def validate_dynamic_sampling(config: GRPOConfig, default_rounds_of_prompts: int) -> None:
    """The checks dynamic sampling needs of any GRPO config with its options (`DynamicSamplingConfig`, `CGRPOConfig`).

    Run after `GRPOConfig.__post_init__` (which sets `generation_batch_size`); a `prompts_per_round` of None becomes
    `default_rounds_of_prompts` generation batches of prompts.
    """
    rounds = config.max_sampling_rounds
    if not isinstance(rounds, int) or isinstance(rounds, bool) or rounds < 1:
        raise ValueError(
            f"max_sampling_rounds must be a positive integer (1 drops zero-variance groups without refilling), got "
            f"{rounds!r}."
        )
    # Dynamic sampling keeps or drops whole groups.
    check_whole_groups(
        config.per_device_train_batch_size,
        config.steps_per_generation,
        "steps_per_generation",
        config.num_generations,
        "num_generations",
        "adjust the batch size",
    )
    batch_prompts = config.generation_batch_size // config.num_generations
    if config.prompts_per_round is None:
        config.prompts_per_round = default_rounds_of_prompts * batch_prompts
    elif config.prompts_per_round < batch_prompts:
        raise ValueError(
            f"prompts_per_round ({config.prompts_per_round}) must be at least the prompts of one generation batch "
            f"(generation_batch_size // num_generations = {batch_prompts}), which the first round holds; raise it or "
            "leave it None."
        )
    if config.prompts_per_round % config.world_size:
        raise ValueError(
            f"prompts_per_round ({config.prompts_per_round}) must be a multiple of the number of processes "
            f"({config.world_size}) so that every process samples as many prompts; round it."
        )
    if config.filter_metric is not None and not (isinstance(config.filter_metric, str) and config.filter_metric):
        raise ValueError(f"filter_metric must be a reward function's name or None, got {config.filter_metric!r}.")
