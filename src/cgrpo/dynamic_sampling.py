"""Dynamic sampling (DAPO) for TRL's GRPO: `DynamicSamplingConfig` and `DynamicSamplingGRPOTrainer`.

The trainer drops the groups whose rewards all agree and refills the generation batch with new prompts, through the
sampler it shares with `CGRPOConfig(drop_unanimous=True)`: `cgrpo.sampler.DynamicSampler`, whose docstring says what a
round is, which groups are dropped and how the kept ones are shared out and trained on. The sampler's names are
re-exported here, where they lived first.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from trl import GRPOConfig

from .padding import checked_reward_funcs
from .sampler import (
    TOTALS_KEYS,
    DynamicSampler,
    PromptStream,
    SharePlan,
    informative_groups,
    share_plan,
    validate_dynamic_sampling,
)
from .support import SupportedGRPOTrainer, refuse_ignore_data_skip

# The DAPO recipe samples gen_batch_size = 3 x train_batch_size prompts per round.
DAPO_ROUNDS_OF_PROMPTS = 3

__all__ = [
    "TOTALS_KEYS",
    "DynamicSampler",
    "DynamicSamplingConfig",
    "DynamicSamplingGRPOTrainer",
    "PromptStream",
    "SharePlan",
    "informative_groups",
    "share_plan",
    "validate_dynamic_sampling",
]


# ---------------------------------------------------------------------- the config
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
        super().__post_init__()
        refuse_ignore_data_skip(self, "dynamic sampling's saved state (refill stream position, totals)")
        validate_dynamic_sampling(self, DAPO_ROUNDS_OF_PROMPTS)


# ---------------------------------------------------------------------- the trainer
class DynamicSamplingGRPOTrainer(SupportedGRPOTrainer):
    """TRL's `GRPOTrainer` with DAPO's dynamic sampling: zero-variance groups are dropped and the batch refilled.

    Every generation batch is sampled in rounds (see `cgrpo.sampler`): each round generates whole groups of
    `num_generations` completions for `args.prompts_per_round` prompts and scores them with the reward functions; the
    groups whose rewards all agree are dropped, and rounds go on until the batch holds
    `generation_batch_size // num_generations` informative groups or `args.max_sampling_rounds` rounds have run (then
    training stops with an error, or, with `args.allow_short_batch`, goes on with the groups found and a warning says
    so). With `args.filter_metric`, one reward function's rewards alone decide which groups are informative. TRL then builds the batch from the kept groups
    alone: their old-policy and reference log-probs, advantages and loss are exactly TRL's on a generation batch made
    of them, for every loss type. Rewards are computed once per round, so every reward function sees every sampled
    completion exactly once.

    With several processes, the rounds run in lockstep, the decision to stop is taken on the groups found by all
    processes, and the informative groups are shared out so that every process trains on as many.

    Logged metrics (per generation batch, through TRL's `log`): `dynamic/rollouts_generated` and
    `dynamic/tokens_generated` (every completion generated, dropped groups included), `dynamic/rounds`,
    `dynamic/groups_sampled`, `dynamic/groups_dropped` (zero-variance), `dynamic/groups_surplus` (informative but
    beyond the batch), `dynamic/informative_groups` (informative groups trained on), `dynamic/informative_rate`
    (informative groups found / groups sampled), `dynamic/short_batch` (1 when the rounds ran out first) and
    `dynamic/sampled_reward_mean` (mean reward over every sampled completion; TRL's `reward` describes the kept ones).
    `trainer.dynamic_totals` holds running totals (see `DynamicSampler.totals`), among them `train_rollouts`,
    `train_tokens` and `generation_s` as C-GRPO's `cgrpo_totals` has them (also `generation_totals`, the name every
    trainer of the support layer, `cgrpo.support`, gives its generation costs). TRL's own metrics keep their meaning per pass: `completions/*` and
    `num_tokens` describe every completion generated (one entry per round), `reward`, `rewards/*`,
    `frac_reward_zero_std` and the completion table the kept groups. Checkpoints carry the totals and the
    position of the refill stream (`dynamic_sampling_state_<process>.json`).

    Not supported (`NotImplementedError`): `tools`, `rollout_func`, `environment_factory` and vision-language models,
    and refill from an iterable dataset.
    """

    _tag_names: ClassVar[list[str]] = ["trl", "grpo", "dynamic-sampling"]
    unsupported_arguments: ClassVar[dict[str, str]] = {
        "tools": "tool calls run inside TRL's generation, whose per-row results dynamic sampling cannot regroup",
        "rollout_func": "a custom rollout function owns generation, so dynamic sampling cannot run it in rounds",
        "environment_factory": "environments own the rollout, so dynamic sampling cannot run it in rounds",
    }
    text_only_reason = "image inputs are not carried through the refill rounds"
    generation_batch_fix = "lower steps_per_generation or generation_batch_size"

    def __init__(
        self, model, reward_funcs=None, args: DynamicSamplingConfig | None = None, train_dataset=None, *more, **kwargs
    ):
        if not isinstance(args, DynamicSamplingConfig):
            raise TypeError(
                "DynamicSamplingGRPOTrainer needs args=DynamicSamplingConfig(...), which carries the "
                "dynamic sampling options."
            )
        super().__init__(model, checked_reward_funcs(reward_funcs), args, train_dataset, *more, **kwargs)
        self._sampler = DynamicSampler(self, rows_multiple=args.steps_per_generation)
        self.dynamic_totals = self._sampler.totals
        self.generation_totals = self.dynamic_totals

    # Why: the rounds (generate, score, drop, refill) must run before TRL builds the batch, and TRL must build it from
    # the kept groups only, so that no dropped row reaches a log-prob pass, the advantages or a loss normaliser.
    # Evaluation passes through untouched.
    def _generate_and_score_completions(self, inputs):
        if not self.model.training:
            return super()._generate_and_score_completions(inputs)
        kept, _ = self._sampler.sample(inputs, self._generate_round)
        try:
            return super()._generate_and_score_completions(kept)
        finally:
            self._sampler.clear()

    # Why: in TRL's pass over the kept groups, generation must return the completions the rounds already sampled.
    def _generate(self, prompts: list):
        replay = self._sampler.take_replay() if self.model.training else None
        return super()._generate(prompts) if replay is None else replay

    # Why: the kept groups were scored in their round; scoring them again would double the reward functions' cost and
    # side effects (logged columns and metrics), and change stochastic rewards after the drop decision.
    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        cached = self._sampler.take_rewards()
        if cached is not None:
            return cached
        return super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)

    # Why: a resumed run must continue the refill stream where it stopped and keep its totals.
    def save_own_state(self, folder: Path) -> None:
        self._sampler.save(folder)

    def load_own_state(self, folder: Path) -> None:
        self._sampler.load(folder)

    def _generate_round(self, examples: list[dict[str, Any]]):
        return self._generate([example["prompt"] for example in examples]), None
