"""The dynamic sampler (DAPO): drop the groups whose rewards all agree and refill the batch with new prompts.

A GRPO group whose completions all get the same reward has zero advantage everywhere: it costs its rollouts and its
forward and backward passes, and carries no policy gradient (with a row-normalised loss it even shrinks the gradient
of the other groups). Dynamic sampling, as in DAPO, samples whole groups, drops those without reward variance, and
keeps sampling new prompts until the generation batch holds as many informative groups as it was configured to hold,
or a maximum number of rounds is reached.

Two trainers share the machinery here, `DynamicSampler`:

- `DynamicSamplingGRPOTrainer` (with `DynamicSamplingConfig`, `cgrpo.dapo.trainer`): TRL's `GRPOTrainer` with
  dynamic sampling.
- `CGRPOTrainer` with `CGRPOConfig(drop_unanimous=True)`: the groups C-GRPO stops at unanimity are zero-variance ones
  (unless another reward, say a format reward, still varies within them); they are dropped and refilled instead of
  padded and trained on. A round there is C-GRPO's budget-grid sampling of one generation batch of prompts.

What a *round* is: one generation call over `prompts_per_round` prompts (all processes together, each process its
share), `num_generations` completions each, followed by one reward scoring of those completions. The first round of a
generation batch holds the prompts TRL's dataloader gave for it, plus, when `prompts_per_round` is larger (DAPO's
over-sampling, verl's `gen_batch_size`), further prompts; later rounds hold new prompts only. Prompts beyond the
dataloader's come from a stream over the training set: a seeded permutation per pass (`args.seed`), the same on every
process, each process taking its slice; so a run is deterministic under its seed, and the stream's position is part of
the checkpoint.

Which groups are dropped: a group is *zero-variance* when the reward TRL normalises within groups takes one value on
all its scorable rows (rows where at least one reward function returned a number), that is, when its standard
deviation is within `torch.isclose`'s tolerance of zero, the test behind TRL's own `frac_reward_zero_std`. With
`multi_objective_aggregation="sum_then_normalize"` (TRL's default) that reward is the weighted sum of the reward
functions (`reward_weights`); with `"normalize_then_sum"` it is the weighted sum of each function's reward normalised
within the group. A group with fewer than two scorable rows is zero-variance too. With `filter_metric` naming one reward
function (verl's `algorithm.filter_groups.metric`, the accuracy reward in the DAPO recipe), that function's reward alone
is tested, its rows without a number left out: a group whose correctness varies is kept even when only its format
reward varies not, and one whose correctness agrees is dropped even when its format reward varies.

Once the rounds stop, every process must hold the same number of groups (TRL gathers per-row tensors across
processes): the informative groups found anywhere are shared out evenly, first found first kept, a process with more
than its share handing the surplus to one with fewer (an all-gather of the token ids, texts and rewards of the groups
that move). Each process's share is cut to a multiple of `rows_multiple` rows (TRL splits a generation batch evenly
into `steps_per_generation` micro-batches); informative groups beyond the target, the even share or that cut are
*surplus*, generated but not trained on. When no informative group is left after the cut, the batch is made of the
fewest groups TRL can split, zero-variance ones included: they carry zero advantage, as in plain GRPO.

The kept groups go through TRL's own batch construction, alone: their old-policy and reference log-probs, their
advantages (with `scale_rewards="batch"`, the kept groups' standard deviation) and `num_items_in_batch` are computed
over them, and no row of a dropped or surplus group reaches a forward pass. A batch short of its target (the rounds ran
out, which is an error unless `allow_short_batch`, as verl stops with an error) therefore has fewer rows rather than
masked filler rows, and every loss type is exactly TRL's loss on a generation
batch made of the kept groups: each loss normalises over the rows of a micro-batch or the tokens of the generation
batch it is given, so in a short batch each kept row weighs more than in a full one, as its groups are all there is.
Refill prompts are drawn independently of TRL's dataloader, so within an epoch a prompt can be sampled more than once.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from accelerate.utils import gather_object
from trl import GRPOTrainer

from ..support.base import Generated
from ..support.learning_signal import SIGNAL_KEYS
from ..support.resume import read_state, write_state
from .groups import PromptStream, SharePlan, filter_column, informative_groups, share_plan

logger = logging.getLogger(__name__)

TOTALS_KEYS = (
    "train_rollouts",
    "train_tokens",
    "generation_s",
    "rounds",
    "generation_batches",
    "short_batches",
    "groups_sampled",
    "groups_kept",
    "groups_dropped",
    "groups_surplus",
    "groups_zero_variance_trained",
    "groups_moved",
    "refill_prompts",
    *SIGNAL_KEYS,
)
# The file name of the sampler's per-process state in a checkpoint.
STATE_NAME = "dynamic_sampling"


# ---------------------------------------------------------------------- the sampler
@dataclass
class _Group:
    """One sampled group on this process: its example, its rows in TRL's `_generate` layout, and its rewards."""

    example: dict[str, Any]
    prompt_ids: list
    completion_ids: list
    completions: list
    logprobs: list | None
    padded: list[bool]
    extras: dict[str, list] = field(default_factory=dict)
    rewards: torch.Tensor | None = None  # (rows, reward functions), on the CPU
    informative: bool = False


GenerateRound = Callable[[list[dict[str, Any]]], tuple[tuple, Sequence[bool] | None]]  # TRL's tuple, pad flags


class DynamicSampler:
    """Runs the generation rounds of one generation batch, keeps the informative groups and replays them to TRL.

    The trainer that owns it calls `sample(inputs, generate_round)` at the start of `_generate_and_score_completions`
    and passes the returned examples to TRL's `_generate_and_score_completions`; its `_generate` then returns
    `take_replay()` (the kept groups' generations) and its `_calculate_rewards` returns `take_rewards()` (their rewards,
    computed once, in the round that sampled them), so TRL builds the batch from the kept groups alone.

    Args:
        trainer: the `GRPOTrainer` subclass that owns it (its accelerator, train set, reward functions, weights and
            metrics). Its `args` carry the options: `prompts_per_round` (all processes together), `max_sampling_rounds`,
            `filter_metric` and `allow_short_batch` (see `DynamicSamplingConfig`).
        rows_multiple: every process keeps a multiple of this many rows (the kept groups times `num_generations`).

    Attributes:
        totals (`dict[str, float]`): running totals over the run (all processes unless said): `train_rollouts` and
            `train_tokens` (every rollout and completion token generated in training, dropped and surplus groups
            included; padded C-GRPO rows excluded), `generation_s` (seconds in generation calls, this process),
            `rounds`, `generation_batches`, `short_batches` (generation batches that ended with fewer informative
            groups than the target), `groups_sampled`, `groups_kept` (informative groups trained on),
            `groups_dropped` (zero-variance groups not trained on), `groups_surplus` (informative groups not trained
            on), `groups_zero_variance_trained` (zero-variance groups trained on when no informative group was left),
            `groups_moved` (groups handed from one process to another) and `refill_prompts` (prompts drawn beyond the
            dataloader's). `groups_sampled` is the sum of the four kinds of groups.
    """

    def __init__(self, trainer: GRPOTrainer, rows_multiple: int = 1):
        args = trainer.args
        self.trainer = trainer
        self.group_size = trainer.num_generations
        # Kept groups per process come in multiples of this, so that they fill `rows_multiple`-row multiples.
        self.unit = rows_multiple // math.gcd(rows_multiple, self.group_size)
        self.prompts_per_round = args.prompts_per_round
        self.max_rounds = args.max_sampling_rounds
        self.allow_short_batch = args.allow_short_batch
        self.filter_column = filter_column(trainer.reward_func_names, args.filter_metric)
        self.totals: dict[str, float] = dict.fromkeys(TOTALS_KEYS, 0.0)
        dataset = trainer.train_dataset
        refills = self.max_rounds > 1 or self.prompts_per_round > args.generation_batch_size // self.group_size
        if refills and (dataset is None or not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__")):
            raise NotImplementedError(
                "Dynamic sampling refills the batch with prompts drawn from train_dataset by index, which an iterable "
                "dataset does not allow; pass a map-style datasets.Dataset, or set max_sampling_rounds=1 and "
                "prompts_per_round to one generation batch of prompts."
            )
        self.stream = PromptStream(len(dataset), trainer.args.seed, "dynamic-sampling") if refills else None
        self._replay: Generated | None = None
        self._rewards: torch.Tensor | None = None

    # ------------------------------------------------------------------ what the trainer's hooks call
    def take_replay(self) -> Generated | None:
        """The kept groups' generations in TRL's `_generate` layout, once; None when nothing is pending."""
        replay, self._replay = self._replay, None
        return replay

    def take_rewards(self) -> torch.Tensor | None:
        """The kept groups' rewards, gathered over processes as TRL's `_calculate_rewards` returns them, once."""
        rewards, self._rewards = self._rewards, None
        return None if rewards is None else self.trainer.accelerator.gather(rewards)

    def clear(self) -> None:
        self._replay = self._rewards = None

    # ------------------------------------------------------------------ the rounds
    def sample(self, inputs: list[dict[str, Any]], generate_round: GenerateRound) -> tuple[list[dict], list[bool]]:
        """Sample rounds until the batch holds its informative groups; return the kept rows' examples and pad flags.

        `inputs` is this process's generation batch from TRL's dataloader (each example repeated `num_generations`
        times). `generate_round(examples)` generates one round for these rows and returns TRL's `_generate` tuple and
        the rows' pad flags (None when no row is padded).
        """
        trainer, width = self.trainer, self.group_size
        accelerator = trainer.accelerator
        processes, rank = accelerator.num_processes, accelerator.process_index
        if len(inputs) % width:
            raise ValueError(
                f"The generation batch holds {len(inputs)} rows, not whole groups of {width}; make "
                "per_device_train_batch_size * steps_per_generation a multiple of num_generations."
            )
        local_target = len(inputs) // width
        target = local_target * processes
        per_round = self.prompts_per_round // processes
        weights = trainer.reward_weights
        aggregation = getattr(trainer, "multi_objective_aggregation", "sum_then_normalize")
        groups: list[_Group] = []
        flags: list[torch.Tensor] = []  # per round: (processes, groups per process) informative flags
        reward_sum, reward_rows = 0.0, 0
        rows_tokens = torch.zeros(2, dtype=torch.float64)
        rounds = refill = 0
        while True:
            rounds += 1
            examples = list(inputs) if rounds == 1 else []
            extra = per_round - len(examples) // width
            if extra:
                rows = self.stream.rows(self.trainer.train_dataset, extra, processes, rank, list(inputs[0]))
                examples += [dict(row) for row in rows for _ in range(self.group_size)]
                refill += extra * processes
            start = time.perf_counter()
            output, pad_mask = generate_round(examples)
            generated = Generated(*output)
            self.totals["generation_s"] += time.perf_counter() - start
            pad = [False] * len(examples) if pad_mask is None else [bool(p) for p in pad_mask]
            prompts = [example["prompt"] for example in examples]
            rewards = trainer._calculate_rewards(examples, prompts, generated.completions, generated.completion_ids)
            extras = self._pop_pending_extras(len(examples))
            informative = self._informative(rewards, weights, aggregation)
            flags.append(informative.view(processes, per_round).cpu())
            combined = (rewards * weights.to(rewards.device)).nansum(dim=1)
            scorable = ~torch.isnan(rewards).all(dim=1)
            reward_sum += combined[scorable].sum().item()
            reward_rows += int(scorable.sum().item())
            local = rewards[rank * len(examples) : (rank + 1) * len(examples)].cpu()
            groups.extend(self._split_groups(examples, generated, pad, extras, local, informative, rank, per_round))
            rows_tokens += torch.tensor(
                [sum(not p for p in pad), sum(len(ids) for ids, p in zip(generated.completion_ids, pad) if not p)],
                dtype=torch.float64,
            )
            found = int(torch.stack(flags).sum().item())
            if found >= target or rounds >= self.max_rounds:
                break
        if found < target and not self.allow_short_batch:
            raise RuntimeError(
                f"Dynamic sampling found {found} informative groups of the {target} the batch needs after {rounds} "
                f"rounds (max_sampling_rounds={self.max_rounds}, prompts_per_round={self.prompts_per_round}); raise "
                "max_sampling_rounds or prompts_per_round, or set allow_short_batch=True to train on the groups found."
            )
        counts = torch.stack(flags).sum(dim=(0, 2)).tolist()  # informative groups per process
        kept, plan = self._share_out(groups, [int(c) for c in counts], local_target, rank)
        self._record(plan, rounds, refill, target, rows_tokens, reward_sum / max(reward_rows, 1))
        return self._set_replay(kept)

    def _informative(self, rewards: torch.Tensor, weights: torch.Tensor, aggregation: str) -> torch.Tensor:
        """The groups `informative_groups` keeps, on the combined reward or on the `filter_metric` reward alone."""
        if self.filter_column is None:
            return informative_groups(rewards, weights, self.group_size, aggregation)
        column = rewards[:, self.filter_column : self.filter_column + 1]
        return informative_groups(column, torch.ones(1), self.group_size)

    def _pop_pending_extras(self, rows: int) -> dict[str, list]:
        """Columns the reward functions logged for the completion table in this round (one value per row)."""
        pending = getattr(self.trainer, "_pending_extra_logs", None)
        if not pending:
            return {}
        extras = {
            column: [values[i] if i < len(values) else None for i in range(rows)] for column, values in pending.items()
        }
        pending.clear()
        return extras

    def _split_groups(
        self, examples, generated: Generated, pad, extras, rewards, informative, rank, per_round
    ) -> list[_Group]:
        width = self.group_size
        logprobs = generated.logprobs
        groups = []
        for g in range(per_round):
            rows = slice(g * width, (g + 1) * width)
            group = _Group(
                example=examples[g * width],
                prompt_ids=list(generated.prompt_ids[rows]),
                completion_ids=list(generated.completion_ids[rows]),
                completions=list(generated.completions[rows]),
                logprobs=None if logprobs is None else list(logprobs[rows]),
                padded=pad[rows],
                extras={column: values[rows] for column, values in extras.items()},
                rewards=rewards[rows].clone(),  # its own storage: a moved group pickles only its rows
                informative=bool(informative[rank * per_round + g]),
            )
            groups.append(group)
        return groups

    # ------------------------------------------------------------------ sharing the groups out over processes
    def _share_out(self, groups: list[_Group], counts: list[int], local_target: int, rank: int):
        """This process's kept groups following `share_plan` (the same plan on every process), and the plan."""
        plan = share_plan(counts, local_target, self.unit)
        mine = [g for g in groups if g.informative]
        kept = mine[: plan.share]
        if plan.moves:
            outgoing = {j: mine[j] for src, j, _ in plan.moves if src == rank}
            arriving = {}
            for k, part in enumerate(gather_object([outgoing])):
                arriving.update({(k, j): group for j, group in part.items()})
            kept += [arriving[(src, j)] for src, j, dst in plan.moves if dst == rank]
        kept += [g for g in groups if not g.informative][: plan.zero_variance[rank]]
        return kept, plan

    def _record(
        self, plan: SharePlan, rounds: int, refill: int, target: int, rows_tokens: torch.Tensor, sampled_reward: float
    ) -> None:
        trainer = self.trainer
        device = trainer.accelerator.device
        rollouts, tokens = trainer.accelerator.gather(rows_tokens.to(device).unsqueeze(0)).sum(dim=0).tolist()
        sampled = rounds * self.prompts_per_round
        found, kept, zero_variance = plan.found, plan.kept, sum(plan.zero_variance)
        surplus = found - kept
        dropped = sampled - found - zero_variance
        short = kept < target
        for key, value in (
            ("train_rollouts", rollouts),
            ("train_tokens", tokens),
            ("rounds", rounds),
            ("generation_batches", 1),
            ("short_batches", int(short)),
            ("groups_sampled", sampled),
            ("groups_kept", kept),
            ("groups_dropped", dropped),
            ("groups_surplus", surplus),
            ("groups_zero_variance_trained", zero_variance),
            ("groups_moved", len(plan.moves)),
            ("refill_prompts", refill),
        ):
            self.totals[key] += value
        metrics = trainer._metrics["train"]
        for name, value in (
            ("rollouts_generated", rollouts),
            ("tokens_generated", tokens),
            ("rounds", rounds),
            ("groups_sampled", sampled),
            ("groups_dropped", dropped),
            ("groups_surplus", surplus),
            ("informative_groups", kept),
            ("informative_rate", found / sampled),
            ("short_batch", float(short)),
            ("sampled_reward_mean", sampled_reward),
        ):
            metrics[f"dynamic/{name}"].append(float(value))
        if short and trainer.accelerator.is_main_process:
            what = (
                f"training on {kept} informative groups"
                if not plan.fallback
                else f"too few for a batch, so training on {plan.share} groups per process, {zero_variance} of them "
                "zero-variance (zero advantage)"
            )
            logger.warning(
                "Dynamic sampling: %d informative groups of the %d the batch needs after %d rounds "
                "(max_sampling_rounds=%d, %d groups sampled, %d dropped); %s.",
                found,
                target,
                rounds,
                self.max_rounds,
                sampled,
                dropped,
                what,
            )

    def _set_replay(self, kept: list[_Group]) -> tuple[list[dict], list[bool]]:
        """Stage the kept groups for TRL's pass and return their rows' examples and pad flags."""
        trainer = self.trainer
        examples = [dict(g.example) for g in kept for _ in range(self.group_size)]
        logprobs = None if kept[0].logprobs is None else [lp for g in kept for lp in g.logprobs]
        self._replay = Generated.of_rows(
            [ids for g in kept for ids in g.prompt_ids],
            [ids for g in kept for ids in g.completion_ids],
            [c for g in kept for c in g.completions],
            logprobs,
        )
        self._rewards = torch.cat([g.rewards for g in kept]).to(trainer.accelerator.device)
        self._restore_pending_extras(kept)
        return examples, [p for g in kept for p in g.padded]

    def _restore_pending_extras(self, kept: list[_Group]) -> None:
        """Put back the completion-table columns of the kept rows, for TRL to flush with the kept batch."""
        pending = getattr(self.trainer, "_pending_extra_logs", None)
        if pending is None:
            return
        local = sorted({column for g in kept for column in g.extras})
        columns = sorted({c for part in gather_object([local]) for c in part})
        for column in columns:
            pending[column].extend(value for g in kept for value in g.extras.get(column, [None] * self.group_size))

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        return {"totals": dict(self.totals), "stream_position": None if self.stream is None else self.stream.position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.totals.update(state["totals"])
        if self.stream is not None and state.get("stream_position") is not None:
            self.stream.position = int(state["stream_position"])

    def save(self, folder: str | Path) -> None:
        write_state(folder, STATE_NAME, self.trainer.accelerator.process_index, self.state_dict())

    def load(self, folder: str | Path) -> None:
        index = self.trainer.accelerator.process_index
        self.load_state_dict(read_state(folder, STATE_NAME, index, "dynamic sampling state"))
