"""`CGRPOTrainer`: TRL's `GRPOTrainer` with conformal, per-prompt rollout budgets."""

from __future__ import annotations

import logging
import math
import random
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar

import torch
from accelerate.utils import gather_object
from datasets import Dataset
from trl import GRPOTrainer

from .allocation.batch import PLANNED_KEY, BatchAllocation, prompt_key
from .allocation.reinforce_ada import balanced_group, rate_weight
from .calibration import Thresholds
from .config import TOKEN_NORMALIZED_LOSSES, CGRPOConfig
from .dapo.sampler import DynamicSampler
from .padding import (
    ALL_NONE_WARNING,
    drop_padded_from_logs,
    keep_rows,
    place_rows,
    real_rows_only,
    trim_completion_columns,
    without_all_none_warning,
)
from .support.base import SupportedGRPOTrainer
from .support.model_card import describe_cgrpo
from .support.resume import read_state, write_state
from .trainer_budgets import BudgetSamplingMixin
from .trainer_calibration import CalibrationMixin
from .trainer_checks import (
    calibration_examples,
    check_initial_thresholds,
    check_scoring,
    probe_reward_funcs,
    reward_funcs_list,
)
from .trainer_state import CGRPOState
from .vllm_streaming import (
    streams_increments,
)

logger = logging.getLogger(__name__)

AnswerExtractor = Callable[[str], "str | None"]
Verifier = Callable[..., Sequence[bool]]

# The file name of C-GRPO's per-process state in a checkpoint.
STATE_NAME = "cgrpo"
# The file name of the prompt allocator's per-process state in a checkpoint.
ALLOCATION_STATE_NAME = "allocation"


class CGRPOTrainer(CalibrationMixin, BudgetSamplingMixin, SupportedGRPOTrainer):
    """GRPO with a per-prompt rollout budget chosen by split-conformal prediction.

    Every prompt of a generation batch is sampled in increments along `args.budget_grid` (2, then 2 more, then 4 more,
    ...), one generation call (a round) per increment for all prompts still active; with
    `args.skip_impossible_budgets` (the default) a prompt draws straight past the budgets where its rule cannot stop
    whatever it draws (after two different answers, a unanimous stop), so it stops where it would have, in fewer
    rounds. With vLLM and `args.stream_increments` (the default) there are no rounds: each prompt's next increment goes
    into the engine as soon as its previous one is decided (`cgrpo.vllm_streaming`). A generation batch spans
    `args.steps_per_generation` optimizer steps: one, as in TRL, by default; several with `args.min_generation_prompts`,
    so that these calls cover many prompts (on small batches a call costs its latency, not its rows). A prompt stops at the first budget whose
    conformal prediction set over the answers drawn so far is a single answer (score `"aps"`), or, for the execution
    scores, at the first budget with a passing completion whose score is within the threshold. Thresholds `qhat_k`,
    one per budget, are fitted with the current policy on `calibration_dataset` before the first optimizer step and
    every `args.recalibrate_every` steps. `args.stopping_rule` replaces the conformal rule with a calibration-free one
    on the same grid (`"unanimous"`, `"share"`; see `cgrpo.stopping`), for ablations: no calibration runs, nothing of
    it is counted, and the threshold metrics (`cgrpo/delta`, `cgrpo/qhat_*`, `cgrpo/calibration_*`) are not logged.

    Groups stay `max(budget_grid)` wide for TRL: a prompt that stopped at `k` is padded with one-token (EOS) rows.
    Padded rows never reach the reward functions, get a NaN reward (so TRL's NaN-aware group baseline ignores them and
    their advantage is zero), are left out of TRL's completion statistics and completion table, and are removed from
    the batch before the policy update and skipped when TRL scores old-policy and reference log-probs, so they cost no
    forward or backward pass and do not enter any loss normaliser.

    With several processes, every process holds whole groups, the increments run in lockstep (a process with fewer
    active prompts generates throwaway rows so that collective generation backends stay in step), and calibration is
    split across processes and gathered, so that every process fits the same thresholds.

    With `args.drop_unanimous`, the groups whose rewards all agree (those stopped at unanimity among them) are dropped
    instead of padded and trained on, and the generation batch is refilled with new prompts in rounds, each sampled
    along the budget grid, until it holds as many informative groups as it started with prompts or
    `args.max_sampling_rounds` rounds ran (`cgrpo.dapo.trainer`; the counts are in `dynamic_totals` and the
    `dynamic/*` metrics, while `cgrpo_totals` and the `cgrpo/*` metrics count every round's groups and rollouts).

    Checkpoints carry C-GRPO's state beside TRL's (`cgrpo_state_<process>.json`: thresholds in force, calibration step
    and history, cost totals, stopping RNG), so `train(resume_from_checkpoint=...)` after a preemption continues the
    run as if it had not stopped.

    Args:
        model, reward_funcs, args, train_dataset, eval_dataset, processing_class, reward_processing_classes,
        callbacks, optimizers, peft_config:
            As in [`~trl.GRPOTrainer`]; `args` must be a [`CGRPOConfig`].
        calibration_dataset (`datasets.Dataset`, *optional*):
            Held-out examples the policy never trains on, with a `prompt` column and, for the `"aps"` score, the
            column `args.calibration_answer_column`. Required by the conformal stopping rule; the calibration-free
            rules (`args.stopping_rule`) do not read it.
        answer_extractor (`Callable[[str], str | None]`, *optional*):
            Maps a completion's text to its final answer (None when there is none). Required for `"aps"`. Its output
            is compared with the calibration answer after `str(...).strip()`.
        verifier (`Callable[..., list[bool]]`, *optional*):
            `verifier(completions=list_of_texts, **example_columns_except_prompt)` returns one pass/fail per
            completion. Required for the execution scores `"first_success"` and `"pass_rate"`.
        initial_thresholds (`Thresholds`, *optional*):
            Thresholds already fitted for the initial policy (one per budget of the grid); they replace the
            calibration before the first step, whose cost the caller then accounts for. An error with a
            calibration-free stopping rule.
        initial_calibration_rollouts (`int`, *optional*, defaults to `0`):
            Rollouts generated to fit `initial_thresholds`, logged as `cgrpo/calibration_rollouts` at the first step
            and counted in `cgrpo/calibration_rollouts_total`.
        **kwargs:
            Further [`~trl.GRPOTrainer`] arguments. `tools`, `rollout_func` and `environment_factory` are not
            supported.

    Attributes:
        cgrpo_state (`CGRPOState`): this process's C-GRPO state, checkpointed; the next four are views of it.
        thresholds (`Thresholds | None`): the thresholds in force (always None with a calibration-free rule).
        calibration_history (`list[dict]`): one record per calibration (`step`, `delta`, `qhat`, `solve_rate`,
            `n_calibration`, `rollouts`, `tokens`, `wall_s`, and with `args.calibration_holdout` a `holdout` dict:
            see `holdout_coverage`); empty with a calibration-free rule.
        cgrpo_totals (`dict[str, float]`): generated rollouts and tokens in training and calibration (all processes),
            groups sampled, throwaway lockstep rollouts (all processes, training and calibration calls), training
            generation rounds (`generation_rounds`: budget-increment generation calls, the same on every process;
            streamed on vLLM, the longest chain of increments of any prompt), seconds spent in training generation
            and calibration, and the completions whose answer extractor or verifier raised (this process), which
            count as failed outcomes; with `args.calibration_holdout`, the held-out
            diagnostic's own costs, counted nowhere else: `holdout_rollouts`, `holdout_tokens` (all processes),
            `holdout_s` and `holdout_cpu_s` (this process's wall and CPU seconds, children included). The run's wall
            clock includes them.
        budget_histogram (`collections.Counter[int]`): training groups (all processes) per budget they stopped at.
        generation_totals (`dict[str, float]`): `cgrpo_totals` under the name every trainer of `cgrpo.support.base` has.
        dynamic_totals (`dict[str, float] | None`): with `drop_unanimous`, the dynamic sampling totals (rounds, groups
            sampled, kept, dropped, ...; see `cgrpo.dapo.sampler.DynamicSampler`); None otherwise.
    """

    _tag_names: ClassVar[list[str]] = ["trl", "grpo", "cgrpo"]
    unsupported_arguments: ClassVar[dict[str, str]] = {
        "tools": "tool calls turn one completion into several generation rounds, which the budget increments do not "
        "model",
        "rollout_func": "a custom rollout function owns generation, so C-GRPO cannot sample in budget increments",
        "environment_factory": "environments own the rollout, so C-GRPO cannot sample in budget increments",
    }
    text_only_reason = "vision-language inputs are not split into budget increments"
    generation_batch_fix = (
        "lower min_generation_prompts (or set it to None for TRL's one generation batch per "
        "step), steps_per_generation or generation_batch_size"
    )

    def __init__(
        self,
        model,
        reward_funcs=None,
        args: CGRPOConfig | None = None,
        train_dataset=None,
        *more,
        calibration_dataset: Dataset | None = None,
        answer_extractor: AnswerExtractor | None = None,
        verifier: Verifier | None = None,
        initial_thresholds: Thresholds | None = None,
        initial_calibration_rollouts: int = 0,
        **kwargs,
    ):
        if not isinstance(args, CGRPOConfig):
            raise TypeError(
                "CGRPOTrainer needs args=CGRPOConfig(...), which carries the budget grid and conformal options."
            )
        self._calibration_examples, self._holdout_examples = calibration_examples(
            calibration_dataset, args, train_dataset
        )
        check_scoring(args, answer_extractor, verifier)
        check_initial_thresholds(initial_thresholds, args)
        self.answer_extractor = answer_extractor
        self.verifier = verifier
        self.stopping_rule = args.build_stopping_rule()
        _check_rewards_readable(self.stopping_rule, args, train_dataset)
        self._lockstep_before_batch = 0.0
        # Answer extractions made by this process, and whether the first generation batch's have been checked.
        self._extractions = 0
        self._first_batch_checked = False
        self._rewards_probed = False
        self._initial_calibration_rollouts = initial_calibration_rollouts
        self._pad_mask: list[bool] | None = None
        self._batch_examples: list[dict[str, Any]] = []
        reward_funcs = [real_rows_only(f, lambda: self._pad_mask) for f in reward_funcs_list(reward_funcs)]
        super().__init__(model, reward_funcs, args, train_dataset, *more, **kwargs)
        # Thresholds fitted beforehand (say by a pipeline step) stand in for the calibration before the first step,
        # and their rollouts are logged at the first step like a calibration's. Stopping decisions are local to each
        # process; calibration draws come from a per-calibration seed instead, so that every process scores the
        # gathered calibration set identically.
        self.cgrpo_state = CGRPOState(
            stopping_rng=random.Random(f"{args.seed}-sampling-{self.accelerator.process_index}"),
            thresholds=initial_thresholds,
            last_calibration_step=None if initial_thresholds is None else 0,
            unlogged_calibration_rollouts=None if initial_thresholds is None else initial_calibration_rollouts,
        )
        self._streams = streams_increments(self)
        # C-GRPO's own filler rows keep micro-batches equal, so any number of kept groups splits evenly.
        self._dynamic = DynamicSampler(self, rows_multiple=1) if args.drop_unanimous else None
        self.dynamic_totals = None if self._dynamic is None else self._dynamic.totals
        self._allocation = _batch_allocation(self)
        # Each group's outcomes in the latest generation batch, for the prompt allocator and the balanced group.
        self._group_outcomes: list[list] = []
        # With `balanced_group_size`: the real rows left out of the loss, and each row's advantage factor.
        self._left_out: list[bool] | None = None
        self._row_factors: list[float] | None = None

    # ------------------------------------------------------------------ the state, by its documented names
    @property
    def thresholds(self) -> Thresholds | None:
        return self.cgrpo_state.thresholds

    @property
    def stopping_fit(self) -> Any:
        """What the stopping rule decides with: the conformal thresholds, another calibrated rule's fit, or None."""
        return self.cgrpo_state.thresholds if self.args.stopping_rule == "conformal" else self.cgrpo_state.rule_fit

    @property
    def calibration_history(self) -> list[dict[str, Any]]:
        return self.cgrpo_state.calibration_history

    @property
    def cgrpo_totals(self) -> dict[str, float]:
        return self.cgrpo_state.totals

    @property
    def generation_totals(self) -> dict[str, float]:
        # Every round's rollouts, dropped groups included, count here with `drop_unanimous` too.
        return self.cgrpo_state.totals

    @property
    def budget_histogram(self) -> Counter[int]:
        return self.cgrpo_state.budget_histogram

    @property
    def allocation_totals(self) -> dict[str, float] | None:
        return None if self._allocation is None else self._allocation.totals

    # ------------------------------------------------------------------ TRL hooks
    # Why: calibration must run with the current policy right before the batch it serves, and the padded rows must
    # leave the batch after TRL has used them for its group-shaped advantage computation. With `drop_unanimous`, the
    # dynamic sampling rounds run first, and TRL builds the batch from the kept groups only.
    def _generate_and_score_completions(self, inputs):
        if not self.model.training:
            return super()._generate_and_score_completions(inputs)
        if self._calibration_due():
            if not self._rewards_probed:
                probe_reward_funcs(self.reward_funcs, self.reward_func_names, inputs[0], self.state)
                self._rewards_probed = True
            start = self._extraction_counts()
            self.calibrate()
            self._check_extractions_since(start, f"the calibration at step {self.state.global_step}")
        inputs = self._plan_batch(inputs)
        start = self._extraction_counts()
        try:
            if self._dynamic is not None:
                inputs, self._pad_mask = self._dynamic.sample(inputs, self._generate_round)
            output = super()._generate_and_score_completions(inputs)
            self._observe_batch()
            if self._row_factors is not None:
                output["advantages"] = output["advantages"] * torch.tensor(
                    self._row_factors, device=self.accelerator.device
                )
            if not self._first_batch_checked:
                self._check_extractions_since(start, "the first generation batch")
                self._first_batch_checked = True
            return self._drop_padded_rows(output)
        finally:
            self._pad_mask = self._left_out = self._row_factors = None
            if self._dynamic is not None:
                self._dynamic.clear()

    def _plan_batch(self, inputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The generation batch TRL builds: the dataloader's, or the prompt allocator's with skipped prompts replaced,
        whose generation-side copies (`_batch_examples`) carry each prompt's planned rollouts."""
        if self._allocation is None:
            self._batch_examples = inputs
            return inputs
        width = self.args.max_budget
        examples, planned = self._allocation.plan(inputs[::width])
        self._batch_examples = [
            {**example, PLANNED_KEY: k} for example, k in zip(examples, planned) for _ in range(width)
        ]
        metrics, totals = self._metrics["train"], self._allocation.totals
        for key in ("skipped_prompts", "refill_prompts", "planned_rollouts"):
            metrics[f"allocation/{key}_total"] = [totals[key]]
        return [example for example in examples for _ in range(width)]

    def _observe_batch(self) -> None:
        """Tell the prompt allocator what each group of the batch drew (its correctness rewards)."""
        if self._allocation is None:
            return
        examples = self._batch_examples[:: self.args.max_budget]
        self._allocation.observe([prompt_key(example["prompt"]) for example in examples], self._batch_rewards())

    def _batch_rewards(self) -> list[list[float]]:
        """Each group's correctness rewards in the batch just drawn, in the batch's order."""
        examples = self._batch_examples[:: self.args.max_budget]
        return [self._rewards(outcomes, e) for outcomes, e in zip(self._group_outcomes, examples, strict=True)]

    # Why: TRL draws all G completions of a group in one call; C-GRPO draws them in budget increments and stops each
    # prompt early (with `drop_unanimous`, TRL's pass over the kept groups gets the completions the rounds sampled).
    # Evaluation generation passes through untouched.
    def _generate(self, prompts: list):
        if not self.model.training:
            return super()._generate(prompts)
        replay = None if self._dynamic is None else self._dynamic.take_replay()
        if replay is not None:
            return replay
        start = time.perf_counter()
        result = self._generate_with_budgets(prompts)
        self.cgrpo_totals["generation_s"] += time.perf_counter() - start
        self._choose_balanced_rows()
        return result

    def _choose_balanced_rows(self) -> None:
        """With `balanced_group_size`, Reinforce-Ada's balanced group of each prompt's answers (the rest left out of
        the loss) and its advantage factor; TRL's baseline, the mean over a group's real rows, is the pool's mean."""
        size = self.args.balanced_group_size
        if size is None:
            return
        width, rng = self.args.max_budget, self.cgrpo_state.stopping_rng
        self._left_out, self._row_factors = [False] * len(self._pad_mask), [1.0] * len(self._pad_mask)
        for g, rewards in enumerate(self._batch_rewards()):
            chosen = set(balanced_group(rewards, size, rng) if len(rewards) > size else range(len(rewards)))
            factor = rate_weight(rewards, self.args.balanced_weighting)
            for i in range(len(rewards)):
                self._left_out[g * width + i] = i not in chosen
                self._row_factors[g * width + i] = factor

    def _rows_out_of_the_loss(self) -> list[bool]:
        """The rows that leave the batch before the loss: padding, and with a balanced group the answers left out."""
        if self._left_out is None:
            return list(self._pad_mask)
        return [pad or out for pad, out in zip(self._pad_mask, self._left_out, strict=True)]

    # Why: padded rows must carry a NaN reward whatever the reward function (a reward model scores any text), and
    # TRL's warning about rows without a reward would fire for every padded row. With `drop_unanimous`, the kept
    # groups were scored in their round, and TRL's pass gets those rewards rather than a second scoring.
    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        cached = None if self._dynamic is None else self._dynamic.take_rewards()
        if cached is not None:
            return cached
        if self._pad_mask is None:
            return super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        with without_all_none_warning(logging.getLogger(GRPOTrainer.__module__)):
            rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        padded = self.accelerator.gather(torch.tensor(self._pad_mask, device=rewards.device))
        rewards[padded] = torch.nan
        if torch.isnan(rewards[~padded]).all(dim=1).any():
            logger.warning("%s for some real completions; they get no advantage.", ALL_NONE_WARNING)
        return rewards

    # Why: TRL computes the old-policy log-probs (several steps per generation, vLLM importance sampling) and the
    # reference log-probs (beta != 0) over the whole group-shaped batch, before C-GRPO drops the padded rows. Scoring
    # only the real rows keeps padded rows out of these forward passes; the zeros left in their place never reach a
    # loss, because padded rows leave the batch or stay fully masked. The real rows are scored in chunks of similar
    # completion length, each cut to its longest completion: a generation batch spanning several steps is padded to
    # its longest completion, and completions are right-padded for a causal model, so the cut changes no log-prob.
    # The answers a balanced group leaves out are scored too: TRL's importance-sampling statistics read every real row.
    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, *args, **kwargs):
        if self._pad_mask is None:
            return super()._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, *args, **kwargs
            )
        real = (~torch.tensor(self._pad_mask, device=input_ids.device)).nonzero().squeeze(1)
        lengths = attention_mask[real, -logits_to_keep:].sum(dim=1)
        order = real[torch.argsort(lengths, descending=True, stable=True)]
        chunk = kwargs.pop("batch_size", None) or (args[0] if args else None) or len(order)
        logps = entropies = None
        aux_losses = []
        for rows in torch.split(order, chunk):
            keep = max(1, int(attention_mask[rows[0], -logits_to_keep:].sum().item()))
            end = input_ids.size(1) - logits_to_keep + keep
            part = super()._get_per_token_logps_and_entropies(
                model, input_ids[rows, :end], attention_mask[rows, :end], keep, None, *args[1:], **kwargs
            )
            logps = place_rows(logps, part[0], rows, len(self._pad_mask), logits_to_keep)
            entropies = place_rows(entropies, part[1], rows, len(self._pad_mask), logits_to_keep)
            aux_losses.append(part[2])
        aux_loss = None if aux_losses[0] is None else torch.stack(aux_losses).mean()
        return logps, entropies, aux_loss

    # Why: three things TRL's loss does not know about C-GRPO's batches. (1) A generation batch spanning several steps
    # is padded to its longest completion, so each step's micro-batch carries trailing columns that no row of it uses;
    # they are cut, which changes no loss term (completions are right-padded, the model is causal, and no loss type
    # divides by the tensor width). (2) TRL's per-row loss normalisations (grpo, sapo, luspo, dr_grpo) divide by the
    # rows of a micro-batch, so the masked filler rows that keep micro-batches equal across processes would shrink
    # them: scaling the advantages and the KL coefficient by rows / (expected real rows) restores the mean over real
    # rows exactly (both loss terms are linear in these factors, and fillers are fully masked). (3) bnpo and the
    # entropy bonus average micro-batch means over the accumulation window and the processes, so a micro-batch made
    # only of fillers would count as one more mean: the accumulation steps TRL divides by are lowered to the
    # micro-batches holding real rows, and the other loss terms are scaled back by the same factor.
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        inputs = trim_completion_columns(inputs)
        if "filler_rows" not in inputs:
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        inputs = {key: value for key, value in inputs.items() if key != "filler_rows"}
        rows = inputs["advantages"].size(0) * self.accelerator.num_processes * self.args.steps_per_generation
        row_weight = 1.0 if self.loss_type in TOKEN_NORMALIZED_LOSSES else rows / inputs["num_real_rows"].item()
        share = self._real_micro_batch_share()
        scale = 1.0 if self.loss_type == "bnpo" else row_weight * share
        accumulation, beta = self.current_gradient_accumulation_steps, self.beta
        self.current_gradient_accumulation_steps = accumulation * share
        self.beta = beta * scale
        try:
            scaled = {**inputs, "advantages": inputs["advantages"] * scale}
            return super().compute_loss(model, scaled, return_outputs, num_items_in_batch)
        finally:
            self.current_gradient_accumulation_steps, self.beta = accumulation, beta

    def _real_micro_batch_share(self) -> float:
        """Share of this accumulation window's micro-batches, over all processes, that hold a real row (1.0 if none)."""
        accumulation = self.current_gradient_accumulation_steps
        index = self._step % self.args.steps_per_generation
        start = index - index % accumulation
        window = self._buffered_inputs[start : start + accumulation]
        local = sum(int((~chunk["filler_rows"]).any().item()) for chunk in window)
        device = self.accelerator.device
        real = self.accelerator.gather(torch.tensor([local], device=device)).sum().item()
        return real / (accumulation * self.accelerator.num_processes) if real else 1.0

    def method_description(self) -> str:
        return describe_cgrpo(self.args, self.thresholds)

    def _row_groups(self, rows: int, device) -> torch.Tensor:
        groups = super()._row_groups(rows, device)
        if self._pad_mask is not None:
            # Rows that never reach the loss (padding, answers a balanced group left out) belong to no group.
            groups[torch.tensor(self._rows_out_of_the_loss(), device=device)] = -1
        return groups

    def rollouts_generated(self, include_calibration: bool = True) -> int:
        training = super().rollouts_generated()
        if not include_calibration:
            return training
        # The held-out diagnostic (`holdout_rollouts`) is counted apart, in no cost.
        return training + int(self.cgrpo_totals["calibration_rollouts"]) + self._initial_calibration_rollouts

    # Why: C-GRPO's state decides the rest of a resumed run; with `drop_unanimous`, so does the sampler's.
    def save_own_state(self, folder: Path) -> None:
        rank = self.accelerator.process_index
        write_state(folder, STATE_NAME, rank, self.cgrpo_state.to_dict())
        if self._dynamic is not None:
            self._dynamic.save(folder)
        if self._allocation is not None:
            write_state(folder, ALLOCATION_STATE_NAME, rank, self._allocation.state_dict())

    def load_own_state(self, folder: Path) -> None:
        state = read_state(folder, STATE_NAME, self.accelerator.process_index, "C-GRPO state")
        self.cgrpo_state = CGRPOState.from_dict(state)
        if self._dynamic is not None:
            self._dynamic.load(folder)
        if self._allocation is not None:
            rank = self.accelerator.process_index
            self._allocation.load_state_dict(read_state(folder, ALLOCATION_STATE_NAME, rank, "prompt allocator state"))

    # ------------------------------------------------------------------ after TRL's scoring
    def _drop_padded_rows(self, output: dict[str, Any]) -> dict[str, Any]:
        """Remove padded rows, keeping only the masked filler rows that equal micro-batches need.

        Every process keeps the same number of rows (the largest real-row count, rounded up to a multiple of
        `steps_per_generation`), because TRL gathers per-row loss statistics and splits the batch evenly.
        """
        device = self.accelerator.device
        padded = torch.tensor(self._rows_out_of_the_loss())
        drop_padded_from_logs(self._logs, self.accelerator.gather(padded.to(device)).tolist())
        real, pads = (~padded).nonzero().squeeze(1), padded.nonzero().squeeze(1)
        real_counts = self.accelerator.gather(torch.tensor([len(real)], device=device))
        split = self.args.steps_per_generation
        needed = math.ceil(real_counts.max().item() / split) * split
        kept = keep_rows(output, torch.cat([real, pads[: needed - len(real)]]).to(device), len(padded))
        kept["completion_mask"][len(real) :] = 0
        kept["filler_rows"] = torch.arange(needed, device=device) >= len(real)
        kept["num_items_in_batch"] = self.accelerator.gather(kept["completion_mask"].sum()).sum()
        kept["num_real_rows"] = real_counts.sum()
        return kept


# ---------------------------------------------------------------------- helpers
def _check_rewards_readable(rule, args: CGRPOConfig, train_dataset) -> None:
    """A rule or allocator that reads rewards needs each training prompt's gold answer for the `"aps"` score."""
    columns = getattr(train_dataset, "column_names", None)
    column = args.calibration_answer_column
    if args.score != "aps" or columns is None or column in columns:
        return
    for reads, what in [
        (rule.needs_rewards, f"stopping_rule={args.stopping_rule!r}"),
        (args.prompt_allocator, f"prompt_allocator={args.prompt_allocator!r}"),
    ]:
        if reads:
            raise ValueError(
                f"{what} reads each training prompt's reward, but train_dataset has no column {column!r} with its "
                "gold answer; add it or set calibration_answer_column."
            )


def _batch_allocation(trainer: CGRPOTrainer) -> BatchAllocation | None:
    """The prompt allocator's runner over the trainer's batches (None without `args.prompt_allocator`)."""
    args, accelerator = trainer.args, trainer.accelerator
    if args.prompt_allocator is None:
        return None
    return BatchAllocation(
        args.build_allocator(),
        args.allocation_rollouts_per_prompt,
        trainer.train_dataset,
        args.seed,
        accelerator.process_index,
        accelerator.num_processes,
        gather=lambda value: gather_object([value]),
    )
