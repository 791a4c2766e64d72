"""The support layer of the project's `GRPOTrainer` subclasses (C-GRPO, DAPO's dynamic sampling, the timed GRPO
baseline): the checks they make before TRL builds anything, the vLLM weight sync, TRL's `_generate` tuple by name,
their common generation totals and the hooks that put their own state into a checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, NamedTuple

import torch
from trl import GRPOConfig, GRPOTrainer

from .learning_signal import equal_group_scales, record_learning_signal
from .model_card import rewrite_card
from .renames import quiet_trl_renames
from .vllm_colocate import eager_cpu_engine, use_reloading_weight_sync

# Keys every trainer's `generation_totals` holds: rollouts and completion tokens generated in training (all
# processes) and the seconds this process spent generating them. Evaluation-time generation is left out.
GENERATION_TOTALS_KEYS = ("train_rollouts", "train_tokens", "generation_s")


class Generated(NamedTuple):
    """TRL's `_generate` return tuple (the same eight entries in TRL 1.12 to 1.16), by name."""

    prompt_ids: list
    completion_ids: list
    tool_mask: list | None
    completions: list
    logprobs: list | None  # the sampling log-probs, from vLLM only
    extra_fields: dict
    images: Any
    tool_images: list

    @classmethod
    def of_rows(cls, prompt_ids: list, completion_ids: list, completions: list, logprobs: list | None) -> Generated:
        """Rows generated without tools, images or extra fields, as C-GRPO's padding and the sampler's replay are."""
        return cls(prompt_ids, completion_ids, None, completions, logprobs, {}, None, [])


class SupportedGRPOTrainer(GRPOTrainer):
    """`GRPOTrainer` plus what the project's trainers share; subclasses say what applies to them.

    Class attributes:
        unsupported_arguments: `GRPOTrainer` arguments the subclass refuses (`NotImplementedError`), each with why.
        text_only_reason: why the subclass refuses vision-language models; None accepts them.
        generation_batch_fix: the options that size the subclass's generation batch, named when the training set
            cannot fill one (see `check_generation_batch_fits`); None leaves TRL's behaviour.

    Every subclass exposes `generation_totals`, a dict with at least `GENERATION_TOTALS_KEYS`, the one name under
    which the pipeline reads every method's generation cost. The vLLM colocate weight sync survives vLLM's packed CPU
    layers (`cgrpo.support.vllm_colocate`).
    """

    generation_totals: dict[str, float]

    unsupported_arguments: ClassVar[dict[str, str]] = {}
    text_only_reason: ClassVar[str | None] = None
    generation_batch_fix: ClassVar[str | None] = None

    # `more`: `GRPOTrainer`'s further positional arguments (eval_dataset, processing_class, ...), in TRL's order.
    def __init__(self, model, reward_funcs=None, args: GRPOConfig | None = None, train_dataset=None, *more, **kwargs):
        name = type(self).__name__
        for argument, why in self.unsupported_arguments.items():
            if kwargs.get(argument) is not None:
                raise NotImplementedError(f"{name} does not support {argument}: {why}.")
        if self.generation_batch_fix is not None:
            check_generation_batch_fits(args, train_dataset, self.generation_batch_fix)
        with eager_cpu_engine(args):
            super().__init__(model, reward_funcs, args, train_dataset, *more, **kwargs)
        if self.text_only_reason is not None and self._is_vlm:
            raise NotImplementedError(f"{name} supports text-only models: {self.text_only_reason}.")
        # TRL's colocate weight sync fails on vLLM's packed CPU layers (see `cgrpo.support.vllm_colocate`).
        use_reloading_weight_sync(self)

    # Why: TRL's own calls to gradient checkpointing's old names warn on every run (`cgrpo.support.renames`).
    def train(self, *args, **kwargs):
        with quiet_trl_renames():
            return super().train(*args, **kwargs)

    # Why: TRL's card links a base model loaded from a local folder as "[None](https://huggingface.co/None)" and says
    # "trained with GRPO" for every subclass; the card names the folder, and the method with its settings.
    def create_model_card(self, *args, **kwargs) -> None:
        super().create_model_card(*args, **kwargs)
        card = Path(self.args.output_dir) / "README.md"
        if self.is_world_process_zero() and card.is_file():
            card.write_text(rewrite_card(card.read_text(), self))

    # Why: a preempted run resumes from its last checkpoint, and a subclass's own state (thresholds, totals, stream
    # positions) decides the rest of the run as much as TRL's. TRL saves and restores each process's RNG states in
    # these two hooks, on every process, for every resumable checkpoint, right before the first step it resumes.
    def _save_rng_state(self, output_dir: str) -> None:
        super()._save_rng_state(output_dir)
        self.save_own_state(Path(output_dir))

    def _load_rng_state(self, checkpoint: str | None) -> None:
        super()._load_rng_state(checkpoint)
        if checkpoint is not None:
            self.load_own_state(Path(checkpoint))

    # Why: what a batch offers the policy gradient (informative groups, signal per rollout, each prompt's weight in the
    # loss) is known only once TRL has computed the advantages, and with `group_weighting="equal"` (C-GRPO) the
    # advantages must be rescaled before TRL splits the batch into micro-batches. Evaluation passes through untouched.
    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        if self.model.training:
            self._record_signal(output)
        return output

    def _record_signal(self, output: dict[str, Any]) -> None:
        group_ids = self._row_groups(output["advantages"].size(0), output["advantages"].device)
        scales = None
        if getattr(self.args, "group_weighting", "tokens") == "equal":
            scales = equal_group_scales(output["completion_mask"], group_ids, self.accelerator)
            output["advantages"] = output["advantages"] * scales.to(output["advantages"].dtype)
        # The batch's rollouts: all generated in training since the batches already recorded.
        rollouts = self.rollouts_generated(include_calibration=False) - self.generation_totals.get("signal_rollouts", 0)
        record_learning_signal(self, output, group_ids, rollouts, scales)

    def _row_groups(self, rows: int, device) -> torch.Tensor:
        """Each of this process's rows' prompt group: consecutive groups of `num_generations` rows; a subclass that
        pads groups marks its padded rows -1."""
        return torch.arange(rows, device=device) // self.num_generations

    def rollouts_generated(self, include_calibration: bool = True) -> int:
        """Rollouts generated in training so far, all processes, throwaway lockstep rows included; a subclass that
        calibrates adds its calibrations' rollouts when `include_calibration` (`cgrpo.budget.RolloutBudget` reads it)."""
        totals = self.generation_totals
        return int(totals["train_rollouts"] + totals.get("lockstep_rollouts", 0))

    def method_description(self) -> str | None:
        """One paragraph on how this trainer trains, for its model card; None for plain GRPO (TRL's card says it)."""
        return None

    def save_own_state(self, folder: Path) -> None:
        """Write this process's state beyond TRL's into checkpoint `folder`; nothing by default."""

    def load_own_state(self, folder: Path) -> None:
        """Restore what `save_own_state` wrote into checkpoint `folder`; nothing by default."""


def check_generation_batch_fits(args: GRPOConfig, train_dataset, fix: str) -> None:
    """Refuse a generation batch that needs more prompts than `train_dataset` holds.

    TRL's sampler drops an incomplete generation batch, so such a run would stop at step 0 with only transformers'
    warning. `fix` names the options that size the batch. Datasets without a length (iterable) are not checked.
    """
    if train_dataset is None or not hasattr(train_dataset, "__len__"):
        return
    needed = args.generation_batch_size // args.num_generations
    if len(train_dataset) < needed:
        raise ValueError(
            f"train_dataset holds {len(train_dataset)} prompts but one generation batch needs {needed} "
            f"(generation_batch_size {args.generation_batch_size} // num_generations {args.num_generations}), so "
            f"training would stop at step 0; {fix}, or pass more prompts."
        )
