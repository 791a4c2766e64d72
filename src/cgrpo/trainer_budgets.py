"""`CGRPOTrainer`'s sampling in budget increments: each prompt of a generation batch drawn along the budget grid, in
rounds of generation calls or streamed into vLLM, until its stopping rule holds; the groups padded to TRL's width,
and the batch's budget metrics logged.

Kept apart from `cgrpo.trainer` as a mixin, so that the trainer module stays about TRL's hooks and the state; the
methods read the trainer's state (`args`, `accelerator`, `cgrpo_state`, `stopping_rule`, `_batch_examples`,
`_pad_mask`) and TRL's `_generate` through `super()`.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable
from typing import Any

import torch
from accelerate.utils import broadcast_object_list, gather_object

from .allocation.batch import PLANNED_KEY
from .costs import rollout_savings
from .padding import log_length_stats
from .stopping import correct_flags, next_budget
from .support.base import Generated
from .support.user_code import completion_text, normalise_answer, verify
from .trainer_checks import check_extractions
from .vllm_streaming import BudgetStream, ServerEngine, colocate_rows, final_only, replaced, server_rows

logger = logging.getLogger(__name__)


class BudgetSamplingMixin:
    """The budget-increment sampling of `CGRPOTrainer` (see its docstring)."""

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
        self._group_outcomes = outcomes
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
        self._group_outcomes = plan[0].outcomes
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
        """The budget a prompt with these outcomes draws up to in its next round (at most its planned rollouts)."""
        grid = self.args.budget_grid
        if not self.args.skip_impossible_budgets:
            budget = next(k for k in grid if k > len(outcomes))
        else:
            rewards = self._rewards(outcomes, example) if self.stopping_rule.needs_rewards else None
            budget = next_budget(self.stopping_rule, self.stopping_fit, grid, outcomes, rewards)
        return min(budget, example.get(PLANNED_KEY, budget))

    def _common_step(self, steps) -> int:
        """The largest number that divides every process's increments: the group width TRL lays the call out in."""
        local = math.gcd(*steps)
        return math.gcd(*self.accelerator.gather(torch.tensor([local], device=self.accelerator.device)).tolist())

    def _stops(self, k: int, outcomes: list, example: dict[str, Any]) -> bool:
        """Whether a prompt stops at budget `k`: its planned rollouts are drawn, or its stopping rule holds."""
        if k >= example.get(PLANNED_KEY, self.args.max_budget):
            return True
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


def _flat(parts: list[list]) -> list:
    return [value for part in parts for value in part]
