"""Configuration of the C-GRPO trainer: TRL's `GRPOConfig` plus the conformal budget options."""

from __future__ import annotations

from dataclasses import dataclass, field

from trl import GRPOConfig

from .allocation import get_allocator
from .allocation.config_checks import validate_allocation, validate_balanced_group
from .calibration import SCORES, training_grid
from .conformal import DELTA_MARGIN
from .dapo.config import validate_dynamic_sampling
from .stopping import get_rule, rule_names
from .support.config_checks import check_whole_groups, refuse_ignore_data_skip
from .support.renames import quiet_trl_renames
from .support.user_code import VERIFIER_TIMEOUT_S

# Loss types TRL normalises by tokens: masked filler rows leave them exact as they are. The others (grpo, sapo,
# luspo, dr_grpo) normalise by rows, and the trainer reweights them (see `CGRPOTrainer.compute_loss`).
TOKEN_NORMALIZED_LOSSES = ("dapo", "bnpo", "cispo", "vespo")
# Those whose normaliser is the generation batch's token count: equal group weights are exact for them.
BATCH_TOKEN_LOSSES = ("dapo", "cispo", "vespo")
GROUP_WEIGHTINGS = ("tokens", "equal")


@dataclass
class CGRPOConfig(GRPOConfig):
    r"""
    Configuration class for [`CGRPOTrainer`].

    Every [`~trl.GRPOConfig`] option keeps its meaning. C-GRPO adds:

    Parameters:
        budget_grid (`list[int]`, *optional*, defaults to `[2, 4, 8, 16, 32]`):
            Strictly increasing per-prompt sampling budgets, at least two of them, the smallest at least 2. Each
            prompt is sampled in increments along this grid and stops at the first budget where the stopping rule
            holds (by default, whose conformal prediction set is a singleton). A grid out of order or with one budget
            (no prompt could stop early) is an error.
        stopping_rule (`str`, *optional*, defaults to `"conformal"`):
            When a prompt stops: any rule registered in `cgrpo.stopping` (`cgrpo.stopping.rule_names()`).
            `"conformal"` is C-GRPO's rule, with thresholds fitted on the calibration set. `"signal"` is calibrated
            too: it stops a prompt whose full group would likely carry no GRPO signal, losing at most a share
            `delta` of the informative groups (it reads each training prompt's gold answer for the `"aps"` score).
            The calibration-free rules on the same grid: `"unanimous"` (all outcomes so far agree), `"share"` (the
            most frequent answer holds at least `stop_share` of the outcomes so far), `"esc"` (the latest `window`
            outcomes agree), `"adaptive"` (the posterior probability that the leading answer is the majority reaches
            `confidence`) and `"fixed"` (every prompt stops at `size`). Failed extractions count in the denominator
            only; for the execution scores the agreeing outcome is a pass. A calibration-free rule needs no
            `calibration_dataset`, runs no calibration, counts no calibration cost and leaves `thresholds` None.
        stopping_options (`dict` or `None`, *optional*, defaults to `None`):
            Options of the stopping rule, by name (each rule's `defaults`): `{"window": 2}` for `"esc"`,
            `{"confidence": 0.9}` for `"adaptive"`, `{"delta": 0.1, "mixed_stop": 8}` for `"signal"`, `{"size": 8}`
            for `"fixed"`, `{"tau": 0.9}` for `"share"` (overrides `stop_share`). The conformal rule takes its
            options from `conformal_delta`, `delta_margin` and `split_delta`.
        prompt_allocator (`str` or `None`, *optional*, defaults to `None`):
            A prompt allocator registered in `cgrpo.allocation` (`"greso"`, `"knapsack"`), which before each
            generation batch plans every prompt's rollouts from its history: 0 skips it (a new prompt from the training
            set takes its place), a budget of the grid caps its draws, and the stopping rule may stop it earlier. It
            reads each training prompt's gold answer for the `"aps"` score. `None` plans nothing.
        allocator_options (`dict` or `None`, *optional*, defaults to `None`):
            Options of the prompt allocator by name (its `defaults`), e.g. `{"floor": 0.05}` for `"greso"`.
        allocation_rollouts_per_prompt (`float` or `None`, *optional*, defaults to `None`):
            A generation batch's total for the prompt allocator: this many rollouts per prompt of the batch, between
            the grid's smallest and largest budgets; `None` is the largest (no prompt is held below it by the total).
        balanced_group_size (`int` or `None`, *optional*, defaults to `None`):
            Reinforce-Ada's fixed-size group (with `stopping_rule="balanced"`, its exit): of each prompt's answers,
            train on this many, half right and half wrong where they allow (the short side filled from the other),
            the others generated and counted but left out of the loss; every answer's advantage is its reward minus
            the mean reward of all the prompt's answers, so `scale_rewards` must be `"none"`. `None` trains on every
            answer, as GRPO.
        balanced_weighting (`str`, *optional*, defaults to `"none"`):
            With `balanced_group_size`, a factor on each prompt's advantages from its answers' success rate `p`:
            `"none"` (Reinforce-Ada's algorithm), `"inverse_rate"` (`1 / p`, its text's estimator) or
            `"inverse_sqrt_rate"`.
        skip_impossible_budgets (`bool`, *optional*, defaults to `True`):
            Draw each prompt straight up to the next budget where its stopping rule could still stop, given the
            outcomes so far (`StoppingRule.could_stop`), in one generation round, instead of visiting every budget of
            the grid. The rule decides the same on the same outcomes, and a prompt draws as many rollouts; only the
            rounds (generation calls) are fewer. The completions differ from a run without it, because a generation
            call's random draws depend on its rows.
        stream_increments (`bool`, *optional*, defaults to `True`):
            With vLLM in colocate mode (tensor parallel size 1, no tools, no `rollout_func`), submit each prompt's
            next increment to the engine as soon as its previous one is finished and decided, instead of sampling in
            rounds that wait for every prompt (`cgrpo.vllm_streaming`). The rule decides the same on the same
            outcomes; the draws differ from rounds, as the engine's batches do. Elsewhere it has no effect.
        stop_share (`float`, *optional*, defaults to `0.75`):
            The share tau of the `"share"` rule, in (0, 1]; `1` is the unanimous rule. Any tau above 1/2 stops the
            first budget of the default grid (2) only on two agreeing answers, as the other rules do, so the rules
            differ at the larger budgets, where 0.75 tolerates one dissenting answer in 4, 2 in 8 and 4 in 16: a clear
            majority, never a split vote.
        num_generations (`int` or `None`, *optional*, defaults to `None`):
            Group width seen by TRL. `None` means `max(budget_grid)`; any other value must equal it.
        conformal_delta (`float` or `None`, *optional*, defaults to `None`):
            Miscoverage level of the conformal sets, in (0, 1). `None` chooses it automatically at every calibration
            from the calibration solve rate. (Named `conformal_delta` because TRL's `delta` is the two-sided clipping
            bound of the policy loss.)
        delta_margin (`float`, *optional*, defaults to `0.05`):
            Margin added to `1 - solve_rate` when the delta is chosen automatically.
        split_delta (`bool`, *optional*, defaults to `False`):
            With automatic delta, choose delta on the first half of the calibration set and fit the thresholds on the
            second half, so the thresholds are not fitted on the data that chose delta.
        score (`str`, *optional*, defaults to `"aps"`):
            Nonconformity score: `"aps"` (answer agreement; needs `answer_extractor`), `"first_success"` or
            `"pass_rate"` (execution scores; need `verifier`).
        verifier_timeout_s (`float` or `None`, *optional*, defaults to `300.0`):
            Seconds one verifier call (one prompt's completions) may take; after that its completions count as fails
            (in `cgrpo_totals["verifier_errors"]`) and training goes on. The hung call is abandoned in a daemon
            thread, which Python cannot kill, so a verifier that runs programs should also bound them itself, as the
            code task's sandbox does. `None` waits forever.
        recalibrate_every (`int`, *optional*, defaults to `50`):
            Refit the thresholds with the current policy every this many optimizer steps; `0` calibrates once, before
            the first step. Calibration runs when a generation batch starts: under TRL's schedule (one generation
            batch per optimizer step) at steps 0, N, 2N, ...; with a generation batch shared by S optimizer steps
            (`min_generation_prompts`, `steps_per_generation`, `num_iterations`), batches start at steps 0, S, 2S,
            ..., and a refit happens at the first of them at least N steps after the previous calibration.
        num_calibration_samples (`int` or `None`, *optional*, defaults to `None`):
            Number of calibration examples used at each calibration (the first ones); `None` uses them all (all but
            the held-out ones with `calibration_holdout`).
        calibration_holdout (`int`, *optional*, defaults to `0`):
            A diagnostic of the training calibrations, not part of the method: this many calibration-dataset examples
            after the calibration examples are scored with the same policy at every calibration, and its history
            record gets the coverage of the thresholds just fitted on them (`holdout`: per-k share of held-out scores
            <= qhat_k, and their count). `0` turns it off. Its rollouts, wall and CPU seconds are counted apart, in
            `cgrpo_totals` (`holdout_rollouts`, `holdout_tokens`, `holdout_s`, `holdout_cpu_s`), never in the
            calibration or training costs; the run's wall clock includes them. Needs the `"conformal"` rule.
        min_generation_prompts (`int` or `None`, *optional*, defaults to `None`):
            `None` keeps TRL's generation schedule: `steps_per_generation` as `GRPOConfig` sets it (one generation
            batch per optimizer step), so training is as on-policy as with `GRPOTrainer`. An integer shares one
            generation batch over several optimizer steps, for speed: C-GRPO makes one generation call per budget of
            the grid for all prompts of a generation batch still sampling, and a call's cost on small batches is its
            latency, not its rows, so covering many prompts keeps every call full. `steps_per_generation` then
            becomes the smallest multiple of `gradient_accumulation_steps` whose generation batch holds at least this
            many whole groups (per process). The cost is staleness: every step of a generation batch but the first
            trains on completions of an older policy, which TRL's importance ratios correct only up to their
            clipping. An explicit `steps_per_generation` or `generation_batch_size` takes precedence. The training set
            must hold at least one generation batch of prompts, or the trainer refuses to start.
        calibration_batch_size (`int` or `None`, *optional*, defaults to `None`):
            Calibration prompts per generation call. `None` means the prompts of one generation batch,
            `per_device_train_batch_size * steps_per_generation // max(budget_grid)` (at least 1), so a calibration
            call has as many rows as a full training round.
        calibration_answer_column (`str`, *optional*, defaults to `"answer"`):
            Column of the calibration dataset holding the gold answer (used by the `"aps"` score).
        per_device_train_batch_size (`int`, *optional*, defaults to `32`):
            Rows per device and micro-batch, as in TRL; the default holds one full group of `max(budget_grid)`.
        group_weighting (`str`, *optional*, defaults to `"tokens"`):
            How much each prompt's group weighs in the loss. `"tokens"`, TRL's loss as it is: every completion
            token weighs the same, so a group that grew to 32 rollouts weighs up to 16 times one that stopped at 2,
            and a stopping rule also reweights prompts. `"equal"`: every group of a generation batch weighs the same
            (its rows' advantages scaled by the batch's tokens per group over the group's own tokens), so that what
            stopping changes is only which rollouts are drawn. Needs a loss that averages over the generation
            batch's tokens (`loss_type` `"dapo"`, `"cispo"` or `"vespo"`); the KL term is not reweighted.
        drop_unanimous (`bool`, *optional*, defaults to `False`):
            Dynamic sampling (DAPO): drop the groups whose rewards all agree instead of training on them (groups
            stopped at unanimity are such groups, unless another reward, say a format reward, still varies) and
            refill the generation batch with groups of new prompts, in rounds of one generation batch of prompts
            each, until it holds as many informative groups as prompts it started with (see
            `cgrpo.dapo.trainer`). Counts are in `trainer.dynamic_totals` and the `dynamic/*` metrics.
        max_sampling_rounds (`int`, *optional*, defaults to `10`):
            With `drop_unanimous`, most rounds (budget-grid sampling of `prompts_per_round` prompts) per generation
            batch, the first included; DAPO's default (`DynamicSamplingConfig`, verl's `max_num_gen_batches`).
        prompts_per_round (`int` or `None`, *optional*, defaults to `None`):
            With `drop_unanimous`, prompts sampled per round, all processes together; `None` means one generation
            batch of prompts. Unlike DAPO's default (three), C-GRPO does not over-sample by default: its point is to
            spend fewer rollouts, and the informative groups an over-sampled round finds beyond the batch are
            generated for nothing, while refill rounds already fill the batch.
        filter_metric (`str` or `None`, *optional*, defaults to `None`):
            With `drop_unanimous`, the reward function (as TRL names it) whose rewards alone decide which groups are
            informative; `None` tests the combined reward (see `DynamicSamplingConfig.filter_metric`).
        allow_short_batch (`bool`, *optional*, defaults to `False`):
            With `drop_unanimous`, train on the informative groups found when the rounds are spent short of a full
            batch, instead of stopping with an error (DAPO's default, as verl).
    """

    budget_grid: list[int] = field(
        default_factory=lambda: [2, 4, 8, 16, 32],
        metadata={
            "help": "Strictly increasing per-prompt sampling budgets, at least two, the smallest at least 2; a prompt "
            "stops at the first budget whose conformal prediction set is a singleton."
        },
    )
    stopping_rule: str = field(
        default="conformal",
        metadata={
            "help": "When a prompt stops: a rule registered in cgrpo.stopping: 'conformal' (calibrated thresholds), "
            "'signal' (calibrated on GRPO's signal), or the calibration-free 'unanimous', 'share', 'esc', "
            "'adaptive' and 'fixed'."
        },
    )
    stopping_options: dict | None = field(
        default=None,
        metadata={
            "help": "Options of the stopping rule by name, e.g. {'window': 2} for 'esc' or {'delta': 0.1} for "
            "'signal'; None keeps the rule's defaults."
        },
    )
    prompt_allocator: str | None = field(
        default=None,
        metadata={
            "help": "A prompt allocator registered in cgrpo.allocation ('greso', 'knapsack') that plans each prompt's "
            "rollouts from its history before every generation batch (0 skips it); None plans nothing."
        },
    )
    allocator_options: dict | None = field(
        default=None,
        metadata={"help": "Options of the prompt allocator by name, e.g. {'floor': 0.05} for 'greso'."},
    )
    allocation_rollouts_per_prompt: float | None = field(
        default=None,
        metadata={
            "help": "A generation batch's total for the prompt allocator, in rollouts per prompt, between the grid's "
            "smallest and largest budgets; None is the largest."
        },
    )
    balanced_group_size: int | None = field(
        default=None,
        metadata={
            "help": "Reinforce-Ada's fixed-size balanced group: train on this many of each prompt's answers, half "
            "right and half wrong where they allow, with the pool's mean reward as baseline (scale_rewards='none'); "
            "None trains on every answer."
        },
    )
    balanced_weighting: str = field(
        default="none",
        metadata={
            "help": "With balanced_group_size, a factor on each prompt's advantages from its success rate p: 'none', "
            "'inverse_rate' (1/p) or 'inverse_sqrt_rate'."
        },
    )
    skip_impossible_budgets: bool = field(
        default=True,
        metadata={
            "help": "Draw each prompt straight up to the next budget where its stopping rule could still stop, in one "
            "generation round: the same decisions and rollouts, fewer rounds."
        },
    )
    stream_increments: bool = field(
        default=True,
        metadata={
            "help": "With colocated vLLM, submit each prompt's next increment as soon as its previous one is decided, "
            "instead of in rounds that wait for every prompt."
        },
    )
    stop_share: float = field(
        default=0.75,
        metadata={
            "help": "Share tau in (0, 1] of the outcomes so far the most frequent answer must hold for the "
            "'share' rule to stop a prompt."
        },
    )
    num_generations: int | None = field(
        default=None,
        metadata={"help": "Group width seen by TRL. None means max(budget_grid); any other value must equal it."},
    )
    conformal_delta: float | None = field(
        default=None,
        metadata={
            "help": "Miscoverage level of the conformal sets in (0, 1); None chooses it automatically from the "
            "calibration solve rate at every calibration."
        },
    )
    delta_margin: float = field(
        default=DELTA_MARGIN,
        metadata={"help": "Margin added to 1 - solve_rate when the delta is chosen automatically."},
    )
    split_delta: bool = field(
        default=False,
        metadata={
            "help": "With automatic delta, choose delta on the first half of the calibration set and fit the "
            "thresholds on the second half."
        },
    )
    score: str = field(
        default="aps",
        metadata={
            "help": "Nonconformity score: 'aps' (answer agreement), 'first_success' or 'pass_rate' (execution "
            "scores from a verifier)."
        },
    )
    verifier_timeout_s: float | None = field(
        default=VERIFIER_TIMEOUT_S,
        metadata={
            "help": "Seconds one verifier call (one prompt's completions) may take before its completions count "
            "as fails; None waits forever. A call that times out is abandoned in a background thread."
        },
    )
    recalibrate_every: int = field(
        default=50,
        metadata={
            "help": "Refit the thresholds every this many optimizer steps (at the first generation batch due); 0 "
            "calibrates once before training."
        },
    )
    num_calibration_samples: int | None = field(
        default=None,
        metadata={"help": "Number of calibration examples used at each calibration; None uses the whole set."},
    )
    calibration_holdout: int = field(
        default=0,
        metadata={
            "help": "Calibration-dataset examples after the calibration examples on which each calibration's "
            "thresholds are checked (coverage per k, a diagnostic costed apart); 0 turns it off."
        },
    )
    min_generation_prompts: int | None = field(
        default=None,
        metadata={
            "help": "None keeps TRL's schedule (one generation batch per optimizer step). An integer shares one "
            "generation batch of at least this many prompts per process over several optimizer steps, so "
            "that each budget round's generation call stays full (faster), at the cost of training the "
            "later steps on completions of an older policy; it sets steps_per_generation when neither it "
            "nor generation_batch_size is given."
        },
    )
    calibration_batch_size: int | None = field(
        default=None,
        metadata={
            "help": "Calibration prompts per generation call; None means the prompts of one generation batch, "
            "per_device_train_batch_size * steps_per_generation // max(budget_grid), at least 1."
        },
    )
    calibration_answer_column: str = field(
        default="answer",
        metadata={"help": "Calibration dataset column holding the gold answer (used by the 'aps' score)."},
    )
    per_device_train_batch_size: int = field(
        default=32,
        metadata={"help": "Rows per device and micro-batch; the default holds one full group of max(budget_grid)."},
    )
    drop_unanimous: bool = field(
        default=False,
        metadata={
            "help": "Drop the groups whose rewards all agree (such as those stopped at unanimity) instead of "
            "training on them, and refill the generation batch with new prompts (dynamic sampling)."
        },
    )
    max_sampling_rounds: int = field(
        default=10,
        metadata={"help": "With drop_unanimous, most generation rounds per generation batch, the first included."},
    )
    group_weighting: str = field(
        default="tokens",
        metadata={
            "help": "Each prompt group's weight in the loss: 'tokens' (TRL's token mean, a larger group weighs "
            "more) or 'equal' (every group of a generation batch weighs the same; loss_type dapo, cispo or vespo)."
        },
    )
    prompts_per_round: int | None = field(
        default=None,
        metadata={
            "help": "With drop_unanimous, prompts sampled per round, all processes together; None means one "
            "generation batch of prompts."
        },
    )
    filter_metric: str | None = field(
        default=None,
        metadata={
            "help": "With drop_unanimous, the reward function (as TRL names it) whose rewards alone decide which "
            "groups are informative; None tests the combined reward."
        },
    )
    allow_short_batch: bool = field(
        default=False,
        metadata={
            "help": "With drop_unanimous, train on the informative groups found when the rounds are spent short "
            "of a full batch, instead of stopping with an error."
        },
    )

    def __post_init__(self):
        self._validate_budget_grid()
        if self.num_generations is None:
            self.num_generations = self.max_budget
        elif self.num_generations != self.max_budget:
            raise ValueError(
                f"num_generations ({self.num_generations}) must equal max(budget_grid) ({self.max_budget}); "
                "leave it unset (None) to take it from the grid."
            )
        self._validate_conformal_options()
        if self.steps_per_generation is None and self.generation_batch_size is None:
            if self.min_generation_prompts is None:
                self._check_trl_schedule_holds_whole_groups()
            else:
                self.steps_per_generation = self._steps_per_generation_for(self.min_generation_prompts)
        with quiet_trl_renames():
            super().__post_init__()
        refuse_ignore_data_skip(self, "C-GRPO's saved state (thresholds, calibration, totals, random streams)")
        if self.steps_per_generation % self.gradient_accumulation_steps:
            raise ValueError(
                f"steps_per_generation ({self.steps_per_generation}) must be a multiple of gradient_accumulation_steps "
                f"({self.gradient_accumulation_steps}), so that each optimizer step's micro-batches come from one "
                "generation batch; change one of them."
            )
        check_whole_groups(
            self.per_device_train_batch_size,
            self.steps_per_generation,
            "steps_per_generation",
            self.max_budget,
            "max(budget_grid)",
            "adjust the batch size",
        )
        validate_dynamic_sampling(self, 1)
        validate_allocation(self)
        validate_balanced_group(self)
        if self.calibration_batch_size is None:
            generation_rows = self.per_device_train_batch_size * self.steps_per_generation
            self.calibration_batch_size = max(1, generation_rows // self.max_budget)

    @property
    def calibrated(self) -> bool:
        """Whether the stopping rule is fitted on the calibration set (`"conformal"` and `"signal"` are)."""
        return get_rule(self.stopping_rule).calibrated

    def build_stopping_rule(self):
        """The `cgrpo.stopping.StoppingRule` these options ask for."""
        return get_rule(self.stopping_rule).from_config(self)

    def build_allocator(self):
        """The `cgrpo.allocation.PromptAllocator` these options ask for (None without `prompt_allocator`)."""
        if self.prompt_allocator is None:
            return None
        return get_allocator(self.prompt_allocator)(self.budget_grid, **(self.allocator_options or {}))

    @property
    def max_budget(self) -> int:
        """The largest budget of the grid, which is also TRL's group width `num_generations`."""
        return self.budget_grid[-1]

    def _steps_per_generation_for(self, prompts: int) -> int:
        """Smallest multiple of the accumulation steps whose generation batch holds `prompts` whole groups."""
        steps = self.gradient_accumulation_steps
        while (self.per_device_train_batch_size * steps) % self.max_budget or (
            self.per_device_train_batch_size * steps < prompts * self.max_budget
        ):
            steps += self.gradient_accumulation_steps
        return steps

    def _check_trl_schedule_holds_whole_groups(self) -> None:
        check_whole_groups(
            self.per_device_train_batch_size,
            self.gradient_accumulation_steps,
            "gradient_accumulation_steps",
            self.max_budget,
            "max(budget_grid)",
            "raise per_device_train_batch_size to a multiple of it for TRL's one generation batch per "
            "step, or set min_generation_prompts to share a generation batch over several steps",
        )

    def _validate_budget_grid(self) -> None:
        budgets = training_grid(self.budget_grid)
        # Refused rather than sorted: the grid is the order in which budgets grow, the docs and the pipeline's config
        # check say so, and a grid typed out of order is more likely a mistake than a wish.
        if list(self.budget_grid) != budgets:
            raise ValueError(
                f"budget_grid {list(self.budget_grid)} is not increasing; list the budgets in increasing order, e.g. "
                f"{budgets}."
            )
        self.budget_grid = budgets

    def _validate_conformal_options(self) -> None:
        if self.verifier_timeout_s is not None and not self.verifier_timeout_s > 0:
            raise ValueError(f"verifier_timeout_s must be positive or None, got {self.verifier_timeout_s}.")
        if self.conformal_delta is not None and not 0.0 < self.conformal_delta < 1.0:
            raise ValueError(
                f"conformal_delta must lie in (0, 1) or be None for automatic, got {self.conformal_delta}."
            )
        if self.delta is not None and self.delta <= 1.0:
            raise ValueError(
                f"delta={self.delta} is TRL's two-sided clipping bound of the loss (it must exceed 1 + epsilon); "
                "set the conformal miscoverage level with conformal_delta instead."
            )
        if not 0.0 <= self.delta_margin < 1.0:
            raise ValueError(f"delta_margin must lie in [0, 1), got {self.delta_margin}.")
        if self.split_delta and self.conformal_delta is not None:
            raise ValueError(
                "split_delta only applies to the automatic delta; set conformal_delta=None or drop split_delta."
            )
        if not isinstance(self.stopping_rule, str) or self.stopping_rule not in rule_names():
            raise ValueError(
                f"stopping_rule must be one of {', '.join(rule_names())}, got {self.stopping_rule!r}; register a new "
                "rule with cgrpo.stopping.register."
            )
        if self.group_weighting not in GROUP_WEIGHTINGS:
            raise ValueError(
                f"group_weighting must be one of {', '.join(GROUP_WEIGHTINGS)}, got {self.group_weighting!r}."
            )
        if self.group_weighting == "equal" and self.loss_type not in BATCH_TOKEN_LOSSES:
            raise ValueError(
                f"group_weighting='equal' reweights a token mean over the generation batch, which loss_type "
                f"{self.loss_type!r} is not; use loss_type {', '.join(BATCH_TOKEN_LOSSES)} or group_weighting='tokens'."
            )
        if not (isinstance(self.stop_share, (int, float)) and 0.0 < self.stop_share <= 1.0):
            raise ValueError(f"stop_share must lie in (0, 1], got {self.stop_share!r}.")
        if not isinstance(self.calibration_holdout, int) or self.calibration_holdout < 0:
            raise ValueError(
                f"calibration_holdout must be a non-negative integer (0 turns it off), got "
                f"{self.calibration_holdout!r}."
            )
        if self.calibration_holdout and self.stopping_rule != "conformal":
            raise ValueError(
                f"calibration_holdout checks conformal thresholds, which stopping_rule="
                f"{self.stopping_rule!r} has none of; set calibration_holdout=0 or use the conformal rule."
            )
        if self.score not in SCORES:
            raise ValueError(f"score must be one of {', '.join(SCORES)}, got {self.score!r}.")
        if self.stopping_options is not None and not isinstance(self.stopping_options, dict):
            raise ValueError(f"stopping_options must be a dict or None, got {self.stopping_options!r}.")
        # Building the rule checks its options before any model is loaded.
        self.build_stopping_rule()
        if self.recalibrate_every < 0:
            raise ValueError(f"recalibrate_every must be >= 0 (0 calibrates once), got {self.recalibrate_every}.")
        if self.num_calibration_samples is not None and self.num_calibration_samples < 1:
            raise ValueError(
                f"num_calibration_samples must be a positive integer or None, got {self.num_calibration_samples}."
            )
        if self.min_generation_prompts is not None and self.min_generation_prompts < 1:
            raise ValueError(
                f"min_generation_prompts must be a positive integer, or None for TRL's schedule, got "
                f"{self.min_generation_prompts}."
            )
        if self.calibration_batch_size is not None and self.calibration_batch_size < 1:
            raise ValueError(
                f"calibration_batch_size must be a positive integer or None, got {self.calibration_batch_size}."
            )
