"""`DynamicSamplingGRPOTrainer`: TRL's `GRPOTrainer` with DAPO's dynamic sampling.

The trainer drops the groups whose rewards all agree and refills the generation batch with new prompts, through the
sampler it shares with `CGRPOConfig(drop_unanimous=True)`: `cgrpo.dapo.sampler.DynamicSampler`, whose docstring says
what a round is, which groups are dropped and how the kept ones are shared out and trained on.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from ..padding import checked_reward_funcs
from ..support.base import SupportedGRPOTrainer
from ..support.model_card import describe_dynamic_sampling
from .config import DynamicSamplingConfig
from .sampler import DynamicSampler


class DynamicSamplingGRPOTrainer(SupportedGRPOTrainer):
    """TRL's `GRPOTrainer` with DAPO's dynamic sampling: zero-variance groups are dropped and the batch refilled.

    Every generation batch is sampled in rounds (see `cgrpo.dapo.sampler`): each round generates whole groups of
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
    trainer of the support layer, `cgrpo.support.base`, gives its generation costs). TRL's own metrics keep their meaning per pass: `completions/*` and
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

    def method_description(self) -> str:
        return describe_dynamic_sampling(self.args)

    # Why: a resumed run must continue the refill stream where it stopped and keep its totals.
    def save_own_state(self, folder: Path) -> None:
        self._sampler.save(folder)

    def load_own_state(self, folder: Path) -> None:
        self._sampler.load(folder)

    def _generate_round(self, examples: list[dict[str, Any]]):
        return self._generate([example["prompt"] for example in examples]), None
