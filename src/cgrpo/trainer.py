"""`CGRPOTrainer`: TRL's `GRPOTrainer` with conformal, per-prompt rollout budgets."""

from __future__ import annotations

import contextlib
import logging
import math
import random
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar

import torch
from accelerate.utils import broadcast_object_list, gather_object
from datasets import Dataset
from trl import GRPOTrainer

from .calibration import Thresholds
from .config import TOKEN_NORMALIZED_LOSSES, CGRPOConfig
from .costs import rollout_savings
from .padding import (
    ALL_NONE_WARNING,
    drop_padded_from_logs,
    keep_rows,
    log_length_stats,
    place_rows,
    real_rows_only,
    trim_completion_columns,
    without_all_none_warning,
)
from .resume import read_state, write_state
from .sampler import DynamicSampler
from .stopping import correct_flags, next_budget
from .support import Generated, SupportedGRPOTrainer
from .trainer_calibration import CalibrationMixin
from .trainer_checks import (
    calibration_examples,
    check_extractions,
    check_initial_thresholds,
    check_scoring,
    reward_funcs_list,
)
from .trainer_state import CGRPOState
from .user_code import completion_text, normalise_answer, verify
from .vllm_streaming import (
    BudgetStream,
    ServerEngine,
    colocate_rows,
    final_only,
    replaced,
    server_rows,
    streams_increments,
)

logger = logging.getLogger(__name__)

AnswerExtractor = Callable[[str], "str | None"]
Verifier = Callable[..., Sequence[bool]]

# The file name of C-GRPO's per-process state in a checkpoint.
STATE_NAME = "cgrpo"


class CGRPOTrainer(CalibrationMixin, SupportedGRPOTrainer):
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
    `args.max_sampling_rounds` rounds ran (`cgrpo.dynamic_sampling`; the counts are in `dynamic_totals` and the
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
        generation_totals (`dict[str, float]`): `cgrpo_totals` under the name every trainer of `cgrpo.support` has.
        dynamic_totals (`dict[str, float] | None`): with `drop_unanimous`, the dynamic sampling totals (rounds, groups
            sampled, kept, dropped, ...; see `cgrpo.dynamic_sampling.DynamicSampler`); None otherwise.
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

    # ------------------------------------------------------------------ TRL hooks
    # Why: calibration must run with the current policy right before the batch it serves, and the padded rows must
    # leave the batch after TRL has used them for its group-shaped advantage computation. With `drop_unanimous`, the
    # dynamic sampling rounds run first, and TRL builds the batch from the kept groups only.
    def _generate_and_score_completions(self, inputs):
        if not self.model.training:
            return super()._generate_and_score_completions(inputs)
        if self._calibration_due():
            start = self._extraction_counts()
            self.calibrate()
            self._check_extractions_since(start, f"the calibration at step {self.state.global_step}")
        self._batch_examples = inputs
        start = self._extraction_counts()
        try:
            if self._dynamic is not None:
                inputs, self._pad_mask = self._dynamic.sample(inputs, self._generate_round)
            output = super()._generate_and_score_completions(inputs)
            if not self._first_batch_checked:
                self._check_extractions_since(start, "the first generation batch")
                self._first_batch_checked = True
            return self._drop_padded_rows(output)
        finally:
            self._pad_mask = None
            if self._dynamic is not None:
                self._dynamic.clear()

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
        return result

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

    # Why: C-GRPO's state decides the rest of a resumed run; with `drop_unanimous`, so does the sampler's.
    def save_own_state(self, folder: Path) -> None:
        write_state(folder, STATE_NAME, self.accelerator.process_index, self.cgrpo_state.to_dict())
        if self._dynamic is not None:
            self._dynamic.save(folder)

    def load_own_state(self, folder: Path) -> None:
        state = read_state(folder, STATE_NAME, self.accelerator.process_index, "C-GRPO state")
        self.cgrpo_state = CGRPOState.from_dict(state)
        if self._dynamic is not None:
            self._dynamic.load(folder)

    # ------------------------------------------------------------------ sampling in budget increments
    def _generate_round(self, examples: list[dict[str, Any]]):
        """One dynamic sampling round: budget-grid sampling of `examples`' groups; returns TRL's tuple and pad flags."""
        self._batch_examples = examples
        generated = self._generate([example["prompt"] for example in examples])
        return generated, list(self._pad_mask)

    def _generate_with_budgets(self, prompts: list):
        """Sample each group in rounds: every prompt still going draws up to its next budget, then its rule decides.

        The next budget is the next one of the grid, or with `args.skip_impossible_budgets` the next one where the rule
        could stop (`cgrpo.stopping.next_budget`). Every process makes the same number of rounds.
        """
        width = self.args.max_budget
        group_prompts, examples = prompts[::width], self._batch_examples[::width]
        self._lockstep_before_batch = self.cgrpo_totals["lockstep_rollouts"]
        if self._streams:
            return self._stream_budgets(group_prompts, examples)
        rows: list[list[tuple]] = [[] for _ in group_prompts]
        outcomes: list[list] = [[] for _ in group_prompts]
        targets = {i: self._next_budget([], examples[i]) for i in range(len(group_prompts))}
        rounds = 0
        while self._any_process_has(len(targets)):
            rounds += 1
            steps = {i: target - len(outcomes[i]) for i, target in targets.items()}
            increment = [group_prompts[i] for i, step in steps.items() for _ in range(step)]
            generated = self._generate_rows(increment, self._common_step(steps.values()), group_prompts[0])
            start = 0
            for i, step in steps.items():
                part = slice(start, start + step)
                start += step
                rows[i].extend(zip(*(column[part] for column in generated)))
                outcomes[i].extend(self._outcomes(generated[2][part], examples[i]))
            targets = {
                i: self._next_budget(outcomes[i], examples[i])
                for i, target in targets.items()
                if target < width and not self._stops(target, outcomes[i], examples[i])
            }
        self._count_rounds(rounds)
        return self._pad_groups(rows)

    def _stream_budgets(self, group_prompts: list, examples: list[dict[str, Any]]):
        """`_generate_with_budgets` on vLLM, each prompt's increments streamed without rounds (`cgrpo.vllm_streaming`).

        One TRL generation call of every prompt at the full width: TRL syncs the weights, tokenizes and builds the
        sampling parameters, then hands the prompts to the colocated engine's `generate` (or, in server mode, the
        main process's client's `generate`), which `_stream_hook` replaces with the stream: the one place TRL exposes
        both the prompts' token ids and its sampling parameters. In server mode the main process decides for the
        prompts of every process. The rows a prompt did not draw are filled with one of its drawn rows for TRL's
        decoding, then replaced by padding.
        """
        width, server = self.args.max_budget, self.vllm_mode == "server"
        stream = BudgetStream(
            gather_object(examples) if server else examples,
            width,
            decode=lambda ids: self.processing_class.batch_decode(ids, skip_special_tokens=True),
            outcomes=self._outcomes,
            stops=self._stops,
            next_budget=self._next_budget,
        )
        owner, replacement = self._stream_hook(stream, server)
        with replaced(owner, "generate", replacement) if owner is not None else contextlib.nullcontext():
            generated = self._generate_rows([p for p in group_prompts for _ in range(width)], width, group_prompts[0])
        plan = [stream.plan()]
        if server:
            broadcast_object_list(plan, from_process=0)
            rank = self.accelerator.process_index
            plan[0] = plan[0].part(rank * len(examples), (rank + 1) * len(examples))
        rows = [
            list(zip(*(column[g * width : g * width + budget] for column in generated)))
            for g, budget in enumerate(plan[0].budgets)
        ]
        if [[completion_text(row[2]) for row in group] for group in rows] != plan[0].texts:
            raise RuntimeError(
                "TRL decoded the streamed completions differently from the text the stopping rule read (a tokenizer "
                "that parses responses?); set stream_increments=False to sample in rounds."
            )
        # The step waits for the longest chain of increments on any process.
        chain = torch.tensor([plan[0].chain], device=self.accelerator.device)
        self._count_rounds(int(self.accelerator.gather(chain).max().item()))
        return self._pad_groups(rows)

    def _stream_hook(self, stream: BudgetStream, server: bool) -> tuple[Any, Callable | None]:
        """The object whose `generate` TRL calls with the prompts' token ids, and the stream that replaces it (None on
        the processes of server mode other than the main one, which have no client)."""
        width = self.args.max_budget
        if not server:
            llm = self.vllm_generation.llm

            def colocated(prompts, sampling_params, *args, **kwargs):
                return colocate_rows(stream.run(llm.llm_engine, prompts[::width], final_only(sampling_params)), width)

            return llm, colocated
        if not self.accelerator.is_main_process:
            return None, None
        client = self.vllm_generation.vllm_client
        generate = client.generate

        def served(prompts, features=None, n=1, **sampling):
            with ServerEngine(generate, sampling) as engine:
                return server_rows(stream.run(engine, prompts, None), prompts, width)

        return client, served

    def _count_rounds(self, rounds: int) -> None:
        """Log a generation batch's rounds: its generation calls, or streamed, its longest chain of increments."""
        self.cgrpo_totals["generation_rounds"] += rounds
        self._metrics["train"]["cgrpo/generation_rounds"].append(float(rounds))

    def _next_budget(self, outcomes: list, example: dict[str, Any]) -> int:
        """The budget a prompt with these outcomes draws up to in its next round."""
        grid = self.args.budget_grid
        if not self.args.skip_impossible_budgets:
            return next(k for k in grid if k > len(outcomes))
        rewards = self._rewards(outcomes, example) if self.stopping_rule.needs_rewards else None
        return next_budget(self.stopping_rule, self.stopping_fit, grid, outcomes, rewards)

    def _common_step(self, steps) -> int:
        """The largest number that divides every process's increments: the group width TRL lays the call out in."""
        local = math.gcd(*steps)
        return math.gcd(*self.accelerator.gather(torch.tensor([local], device=self.accelerator.device)).tolist())

    def _stops(self, k: int, outcomes: list, example: dict[str, Any]) -> bool:
        rule = self.stopping_rule
        rewards = self._rewards(outcomes, example) if rule.needs_rewards else None
        return rule.stops(k, outcomes, rewards, self.stopping_fit, self.cgrpo_state.stopping_rng)

    def _rewards(self, outcomes: list, example: dict[str, Any]) -> list[float]:
        """1.0 for each correct outcome: an answer equal to the example's gold answer (`"aps"`), or a pass."""
        gold = normalise_answer(example[self.args.calibration_answer_column]) if self.args.score == "aps" else None
        return correct_flags(self.args.score, outcomes, gold)

    def _generate_rows(self, prompts: list, per_prompt: int, throwaway_prompt):
        """One TRL generation call whose prompts repeat `per_prompt` times each; returns ids, texts and logprobs.

        Every process makes the call with the same number of rows (the largest share, topped up with throwaway
        copies of `throwaway_prompt`), because TRL gathers per-row statistics and vLLM's server mode batches all
        processes' requests. Setting `num_generations` to the increment makes TRL (any version) lay out and request
        the rows as for a group of that width, which is what its vLLM helper expects. TRL's own bookkeeping of the
        call (completion statistics, token count) is undone: C-GRPO logs the real rows itself.
        """
        rows = len(prompts)
        counts = self.accelerator.gather(torch.tensor([rows], device=self.accelerator.device))
        most = int(counts.max().item())
        self.cgrpo_totals["lockstep_rollouts"] += most * len(counts) - int(counts.sum().item())
        metrics = self._metrics["train"]
        saved = {key: list(values) for key, values in metrics.items()}
        tokens_seen, width = self.state.num_input_tokens_seen, self.num_generations
        self.num_generations = per_prompt
        try:
            output = super()._generate(prompts + [throwaway_prompt] * (most - rows))
        finally:
            self.num_generations = width
            self.state.num_input_tokens_seen = tokens_seen
            metrics.clear()
            metrics.update(saved)
        output = Generated(*output)
        logprobs = [None] * len(output.completion_ids) if output.logprobs is None else output.logprobs
        return output.prompt_ids[:rows], output.completion_ids[:rows], output.completions[:rows], logprobs[:rows]

    def _any_process_has(self, count: int) -> bool:
        return self.accelerator.gather(torch.tensor([count], device=self.accelerator.device)).sum().item() > 0

    def _outcomes(self, completions: list, example: dict[str, Any]) -> list:
        texts = [completion_text(c) for c in completions]
        if self.args.score == "aps":
            return [self._extract(text) for text in texts]
        columns = {key: value for key, value in example.items() if key != "prompt"}
        return verify(
            self.verifier,
            texts,
            columns,
            self.args.verifier_timeout_s,
            lambda error: self._count_user_error("verifier_errors", error),
        )

    def _extract(self, text: str) -> str | None:
        self._extractions += 1
        try:
            answer = self.answer_extractor(text)
        except Exception as error:  # noqa: BLE001 - user code: an extractor that raises found no answer
            self._count_user_error("extraction_errors", error)
            return None
        # Outside the try: an answer of the wrong type (a list of matches) is a bug to fix, not a missing answer.
        return normalise_answer(answer)

    def _extraction_counts(self) -> tuple[int, float]:
        return self._extractions, self.cgrpo_totals["extraction_errors"]

    def _check_extractions_since(self, start: tuple[int, float], when: str) -> None:
        """`check_extractions` over the extractions of every process since `start` (`_extraction_counts()`)."""
        if self.args.score != "aps":
            return
        made, errors = (now - then for now, then in zip(self._extraction_counts(), start, strict=True))
        counts = self.accelerator.gather(torch.tensor([[made, errors]], device=self.accelerator.device)).sum(dim=0)
        check_extractions(int(counts[1].item()), int(counts[0].item()), when)

    def _count_user_error(self, key: str, error: Exception) -> None:
        if not self.cgrpo_totals[key]:
            logger.warning("C-GRPO counts a %s as a failed outcome and goes on; the first: %r", key[:-1], error)
        self.cgrpo_totals[key] += 1

    def _pad_groups(self, rows: list[list[tuple]]):
        """Pad every group to the full width with one-token EOS rows, in TRL's `_generate` return layout."""
        width, eos = self.args.max_budget, self._eos_ids[0]
        sampled_logprobs = rows[0][0][3] is not None
        prompt_ids, completion_ids, completions, logprobs, pad_mask = [], [], [], [], []
        for group in rows:
            empty = "" if isinstance(group[0][2], str) else [{"role": "assistant", "content": ""}]
            # A NaN sampling logprob gives a padded row an importance-sampling ratio of exactly 1 in TRL.
            padding = [(group[0][0], [eos], empty, [math.nan])] * (width - len(group))
            for p_ids, c_ids, completion, lps in group + padding:
                prompt_ids.append(p_ids)
                completion_ids.append(c_ids)
                completions.append(completion)
                logprobs.append(lps)
            pad_mask.extend([False] * len(group) + [True] * len(padding))
        self._pad_mask = pad_mask
        self._log_budget_metrics([len(group) for group in rows], prompt_ids, completion_ids)
        return Generated.of_rows(prompt_ids, completion_ids, completions, logprobs if sampled_logprobs else None)

    @property
    def _eos_ids(self) -> list[int]:
        # TRL < 1.15 knows only the tokenizer's EOS; newer releases add the generation config's.
        return getattr(self, "eos_token_ids", [self._tokenizer.eos_token_id])

    # ------------------------------------------------------------------ after TRL's scoring
    def _drop_padded_rows(self, output: dict[str, Any]) -> dict[str, Any]:
        """Remove padded rows, keeping only the masked filler rows that equal micro-batches need.

        Every process keeps the same number of rows (the largest real-row count, rounded up to a multiple of
        `steps_per_generation`), because TRL gathers per-row loss statistics and splits the batch evenly.
        """
        device = self.accelerator.device
        padded = torch.tensor(self._pad_mask)
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

    def _log_budget_metrics(self, kept: list[int], prompt_ids: list, completion_ids: list) -> None:
        device, width = self.accelerator.device, self.args.max_budget
        real = [i for i, pad in enumerate(self._pad_mask) if not pad]
        ks = self.accelerator.gather(torch.tensor(kept, device=device)).float()
        lengths = torch.tensor(_flat(gather_object([[len(completion_ids[i]) for i in real]])), dtype=torch.float)
        eos_and_pad = [*self._eos_ids, self._tokenizer.pad_token_id]
        truncated = torch.tensor(_flat(gather_object([[completion_ids[i][-1] not in eos_and_pad for i in real]])))
        prompt_tokens = sum(gather_object([sum(len(prompt_ids[i]) for i in real)]))
        self.cgrpo_totals["train_rollouts"] += ks.sum().item()
        self.cgrpo_totals["train_tokens"] += lengths.sum().item()
        self.cgrpo_totals["groups"] += len(ks)
        self.budget_histogram.update(int(k) for k in ks.tolist())
        self.state.num_input_tokens_seen += prompt_tokens + int(lengths.sum().item())
        metrics = self._metrics["train"]
        metrics["num_tokens"] = [self.state.num_input_tokens_seen]
        log_length_stats(metrics, lengths, truncated)
        metrics["cgrpo/mean_k"].append(ks.mean().item())
        # Throwaway rows that kept the processes in lockstep were generated too.
        lockstep = self.cgrpo_totals["lockstep_rollouts"] - self._lockstep_before_batch
        generated = int(ks.sum().item() + lockstep)
        metrics["cgrpo/rollout_savings"].append(rollout_savings(generated, len(ks), width))
        metrics["cgrpo/rollouts_generated"].append(generated)
        metrics["cgrpo/lockstep_rollouts"].append(lockstep)
        errors = self.cgrpo_totals["extraction_errors"] + self.cgrpo_totals["verifier_errors"]
        metrics["cgrpo/outcome_errors"].append(errors)
        metrics["cgrpo/tokens_generated"].append(lengths.sum().item())
        if self.stopping_fit is not None:
            self._log_calibration_metrics(metrics)

    def _log_calibration_metrics(self, metrics) -> None:
        # A calibration-free rule has no fit and no calibration: these metrics are left out rather than logged as NaN,
        # which would show in every log line and poison TRL's averages and a tracker's plots.
        if self.thresholds is not None:
            metrics["cgrpo/delta"].append(self.thresholds.delta)
            metrics["cgrpo/calibration_solve_rate"].append(self.thresholds.solve_rate)
        else:
            metrics["cgrpo/delta"].append(self.stopping_fit["delta"])
        if self.cgrpo_state.unlogged_calibration_rollouts is not None:
            metrics["cgrpo/calibration_rollouts"].append(self.cgrpo_state.unlogged_calibration_rollouts)
            self.cgrpo_state.unlogged_calibration_rollouts = None
        metrics["cgrpo/calibration_rollouts_total"].append(
            self._initial_calibration_rollouts + self.cgrpo_totals["calibration_rollouts"]
        )
        for k, qhat in ({} if self.thresholds is None else self.thresholds.qhat).items():
            metrics[f"cgrpo/qhat_{k}"].append(qhat)


# ---------------------------------------------------------------------- helpers
def _check_rewards_readable(rule, args: CGRPOConfig, train_dataset) -> None:
    """A rule that reads rewards needs each training prompt's gold answer for the `"aps"` score."""
    columns = getattr(train_dataset, "column_names", None)
    column = args.calibration_answer_column
    if rule.needs_rewards and args.score == "aps" and columns is not None and column not in columns:
        raise ValueError(
            f"stopping_rule={args.stopping_rule!r} reads each training prompt's reward, but train_dataset has no "
            f"column {column!r} with its gold answer; add it or set calibration_answer_column."
        )


def _flat(parts: list[list]) -> list:
    return [value for part in parts for value in part]
