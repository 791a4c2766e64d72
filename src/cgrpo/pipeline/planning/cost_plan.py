"""The cost plan of a config before anything runs: every GPU job's rollouts and tokens, totals per method, GPU-hours.

The jobs are the ones the workflow plans, found through the pipeline's own planning code: the run names and training
specs of `cgrpo.pipeline.configuration.methods`, the evaluation's samples of `specs.pool_samples`, the calibration
schedule the trainer follows (`cgrpo.costs.calibration_steps`) and compute matching's group size
(`matching.matched_group_size`). What only a run can tell is planned as stated in each job's `basis`: every stopping
rule's training rollouts at the worst case, each prompt drawing the grid's largest budget (or at an expected mean
`mean_k`), DAPO's at the least, one round per generation batch; completions at the configured maximum length (or an
expected mean), prompts at `prompt_tokens` each. Every job that starts a vLLM engine pays its start-up
(`Throughput.startup_s`); throughputs measured on another model are scaled to the planned one by parameter count
(`Throughput.scaled`); the GPU memory of each job is `memory_plan`'s estimate.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

import pandas as pd

from ...config import CGRPOConfig
from ...costs import calibration_steps, generation_span
from ...stopping import get_rule
from ..analysis.matching import matched_group_size
from ..configuration.checks import generation_batch_size
from ..configuration.methods import METHODS, grpo_run_name, static_runs
from ..configuration.run_specs import train_spec
from ..configuration.specs import TrainSpec, calibration_seed, calibration_trainer_options, format_grid, pool_samples
from .memory_plan import memory_jobs, memory_table, memory_warnings
from .model_size import PUBLISHED, ModelSize

__all__ = ["CALIBRATION_SHARE_LIMIT", "Throughput", "TokenCounts", "plan_jobs", "plan_report"]

Config = Mapping[str, Any]

# C-GRPO ties with G = max(grid) where stopping saves as many training rollouts as its calibrations draw: above this
# share of G = max(grid)'s training rollouts, the calibration alone eats most of what a fair stopping rule can save.
CALIBRATION_SHARE_LIMIT = 0.15
# A stopping rule's training job's columns that the per-job table leaves to the calibration share's table.
_RUN_COLUMNS = ["reference_rollouts", "run_calibration_rollouts"]
# The trainer's refit interval where a calibrated stopping rule other than C-GRPO's sets none (the ablations).
_DEFAULT_RECALIBRATE = next(field.default for field in fields(CGRPOConfig) if field.name == "recalibrate_every")


@dataclass(frozen=True)
class TokenCounts:
    """Tokens per rollout: `completion` generated (None: every completion at the configured maximum, an upper bound) and
    `prompt` read by the update besides it (the format_rate table measures both on the base model)."""

    completion: float | None = None
    prompt: float = 0.0


@dataclass(frozen=True)
class Throughput:
    """What the GPU does per second: tokens generated, and tokens (prompt and completion) through the update; and
    the seconds a job takes to start a vLLM engine (loading, compiling and capturing the model)."""

    generation: float
    training: float
    startup_s: float = 0.0

    def hours(self, generated: float, trained: float, engine_starts: float = 0) -> float:
        return (generated / self.generation + trained / self.training + engine_starts * self.startup_s) / 3600

    def scaled(self, measured: ModelSize, planned: ModelSize) -> Throughput:
        """These throughputs, measured on `measured`, on `planned`: inversely proportional to the parameter count,
        as the compute per token is (2 FLOPs a parameter forward, more backward) and so are the bytes of weights a
        memory-bound decoding step reads. Attention's share, which grows with the sequence, is left out."""
        factor = measured.params / planned.params
        return replace(self, generation=self.generation * factor, training=self.training * factor)


# --------------------------------------------------------------------------- jobs


def plan_jobs(config: Config, tokens: TokenCounts = TokenCounts(), mean_k: float | None = None) -> pd.DataFrame:
    """One row per job that loads the policy: `rule`, `job`, `method`, `prompts`, `rollouts` (every completion drawn, as
    the run's record counts them), `calibration_rollouts` (the share of them that calibrates), `generated_tokens`,
    `trained_tokens` and `basis`; a stopping rule's training job adds `reference_rollouts` (G = max(grid)'s training
    rollouts on its prompts) and `run_calibration_rollouts` (every calibration its record will count, C-GRPO's
    calibrate job's included)."""
    training = [_training_job(config, run, tokens, mean_k) for run in static_runs(config)]
    training += _matched_jobs(config, training, tokens)
    evaluations = [_evaluation_job(config, "base", "base", tokens)]
    evaluations += [_evaluation_job(config, row["job"], row["method"], tokens) for row in training]
    rows = [_format_rate_job(config, tokens), *_calibration_jobs(config, tokens), *training, *evaluations]
    return pd.DataFrame(rows)


def _size(config: Config, split: str) -> int:
    size = config["splits"]["sizes"][split]
    if size is None:
        raise ValueError(
            f"splits.sizes.{split} is null (whatever the source leaves), which is unknown before the split job runs; "
            f"set it to a number to plan the cost."
        )
    return int(size)


def _row(rule, job, method, prompts, rollouts, calibration, completion, tokens, trained, basis, starts, **extra):
    return {
        "rule": rule,
        "job": job,
        "method": method,
        "prompts": prompts,
        "rollouts": rollouts,
        "calibration_rollouts": calibration,
        "generated_tokens": round(rollouts * completion),
        "trained_tokens": round(trained * (completion + tokens.prompt)),
        "engine_starts": starts,
        "basis": basis,
        **extra,
    }


def _colocated_engine(trainer: Mapping[str, Any]) -> int:
    """1 where a job with `trainer` options starts a vLLM engine of its own (colocate mode), else 0."""
    return int(bool(trainer.get("use_vllm")) and trainer.get("vllm_mode", "colocate") == "colocate")


def _evaluation_engine(config: Config) -> int:
    return int(config["evaluation"]["backend"] == "vllm")


def _format_rate_job(config: Config, tokens: TokenCounts) -> dict[str, Any]:
    check = config["format_check"]
    completion = _completion(config, tokens, config["evaluation"]["max_new_tokens"])
    train = config["splits"]["sizes"]["train"]
    prompts = min(check["prompts"], train) if train else check["prompts"]
    samples = prompts * check["samples"]
    starts = _evaluation_engine(config)
    return _row("format_rate", "format_rate", "base", prompts, samples, 0, completion, tokens, 0, "exact", starts)


def _completion(config: Config, tokens: TokenCounts, length: int | None) -> float:
    if tokens.completion is not None:
        return float(tokens.completion)
    # Unset lengths resolve as the evaluation's do (`specs.evaluation_settings`): training's, else 64.
    return float(length or config["training"].get("max_completion_length", 64))


def _calibration_examples(config: Config, options: Mapping[str, Any]) -> int:
    return int(options.get("num_calibration_samples") or _size(config, "calibration") - options["calibration_holdout"])


def _calibration_jobs(config: Config, tokens: TokenCounts) -> list[dict[str, Any]]:
    options = config["cgrpo"]["options"]
    completion = _completion(config, tokens, config["training"].get("max_completion_length"))
    seeds = sorted({calibration_seed(config, seed) for seed in config["seeds"]})
    examples = _calibration_examples(config, options)
    starts = _colocated_engine(calibration_trainer_options(config))
    rows = []
    for grid in config["cgrpo"]["budget_grids"]:
        rollouts = examples * max(grid)
        for seed in seeds:
            job = f"calibration/{format_grid(grid)}/s{seed}"
            rows.append(
                _row("calibrate", job, "cgrpo", examples, rollouts, rollouts, completion, tokens, 0, "exact", starts)
            )
    return rows


def _shape(spec: TrainSpec) -> tuple[int, int, int]:
    """Steps, training prompts and the generation span (optimizer steps) of a run."""
    trainer = spec.trainer
    steps = trainer.get("max_steps")
    if not steps or steps < 1:
        raise ValueError(
            "training.max_steps is unset, so the training steps depend on the train split's size, unknown before the "
            "split job runs; set training.max_steps to plan the cost."
        )
    width = spec.num_generations or max(spec.budget_grid)
    accumulation = int(trainer.get("gradient_accumulation_steps", 1))
    rows_per_step = int(trainer.get("per_device_train_batch_size", 8)) * accumulation
    per_generation = generation_batch_size(trainer) // int(trainer.get("per_device_train_batch_size", 8))
    span = generation_span(per_generation, int(trainer.get("num_iterations", 1)), accumulation)
    return int(steps), int(steps) * rows_per_step // width, span


def _training_job(config: Config, run: str, tokens: TokenCounts, mean_k: float | None) -> dict[str, Any]:
    spec = train_spec(config, run, "model", "splits", "initial-calibration")
    steps, prompts, span = _shape(spec)
    completion = _completion(config, tokens, spec.trainer.get("max_completion_length"))
    epochs = int(spec.trainer.get("num_iterations", 1))
    rule = "train_cgrpo" if METHODS[spec.method].calibrated else "train"
    starts = _colocated_engine(spec.trainer)
    if spec.budget_grid is None:
        rollouts, basis = _fixed_group_rollouts(spec, steps, prompts, span)
        # DAPO trains on as many groups as GRPO; the groups it drops were drawn, not trained on.
        trained = prompts * spec.num_generations * epochs
        return _row(rule, run, spec.method, prompts, rollouts, 0, completion, tokens, trained, basis, starts)
    largest = max(spec.budget_grid)
    training, basis = (round(prompts * mean_k), f"mean k {mean_k:g}") if mean_k else (prompts * largest, "worst case")
    if spec.cgrpo.get("drop_unanimous"):
        basis += ", one sampling round per generation batch (drop_unanimous may refill more)"
    fit = _calibration_examples(config, spec.cgrpo) * largest
    calibration = _in_run_calibrations(spec, steps, span) * fit
    # The run's record counts C-GRPO's initial calibration, drawn by its calibrate job, as the run's cost too.
    initial = fit if spec.method == "cgrpo" else 0
    return _row(
        rule,
        run,
        spec.method,
        prompts,
        training + calibration,
        calibration,
        completion,
        tokens,
        training * epochs,
        basis,
        starts,
        reference_rollouts=prompts * largest,
        run_calibration_rollouts=calibration + initial,
    )


def _fixed_group_rollouts(spec: TrainSpec, steps: int, prompts: int, span: int) -> tuple[int, str]:
    if spec.dynamic is None:
        return prompts * spec.num_generations, "exact"
    # DAPO samples rounds of `prompts_per_round` prompts until a generation batch is full of informative groups: at
    # least one round per batch, at most `max_sampling_rounds`.
    batches = -(-steps // span)
    per_round = spec.dynamic["prompts_per_round"] or 3 * prompts * span // steps
    least = batches * per_round * spec.num_generations
    return least, f"least: one round per generation batch (up to {spec.dynamic['max_sampling_rounds']})"


def _in_run_calibrations(spec: TrainSpec, steps: int, span: int) -> int:
    """Calibrations the training job itself draws: C-GRPO's refits after its calibrate job's, or every fit of another
    calibrated rule (none for a calibration-free one)."""
    if spec.method == "cgrpo":
        return len(calibration_steps(steps, span, spec.recalibrate_every)) - 1
    if not get_rule(spec.cgrpo["stopping_rule"]).calibrated:
        return 0
    return len(calibration_steps(steps, span, _DEFAULT_RECALIBRATE))


def _matched_jobs(config: Config, training: list[dict[str, Any]], tokens: TokenCounts) -> list[dict[str, Any]]:
    """The compute-matched GRPO runs C-GRPO's planned cost asks for, less those that reuse a configured fixed-G run."""
    if not config["grpo"]["compute_matched"]:
        return []
    sizes = {
        matched_group_size(
            row["rollouts"] - row["calibration_rollouts"] + row["run_calibration_rollouts"], row["prompts"]
        )
        for row in training
        if row["method"] == "cgrpo"
    }
    runs = [
        grpo_run_name(seed, size, matched=True)
        for size in sorted(sizes - set(config["grpo"]["num_generations"]))
        for seed in config["seeds"]
    ]
    planned = [_training_job(config, run, tokens, None) for run in runs]
    return [{**row, "basis": "matched to C-GRPO's planned rollouts"} for row in planned]


def _evaluation_job(config: Config, run: str, method: str, tokens: TokenCounts) -> dict[str, Any]:
    evaluated = _size(config, "eval")
    samples = pool_samples(config, run) * (evaluated + _size(config, "calibration"))
    completions = evaluated + samples
    completion = _completion(config, tokens, config["evaluation"]["max_new_tokens"])
    starts = _evaluation_engine(config)
    return _row("evaluate", f"eval/{run}", method, evaluated, completions, 0, completion, tokens, 0, "exact", starts)


# --------------------------------------------------------------------------- totals, shares, warnings and the report


def method_totals(jobs: pd.DataFrame, throughput: Throughput) -> pd.DataFrame:
    """Per method: its training runs, training, calibration and evaluation rollouts, tokens and GPU-hours."""
    jobs = jobs.assign(
        gpu_hours=throughput.hours(jobs["generated_tokens"], jobs["trained_tokens"], jobs["engine_starts"])
    )
    training = jobs["rule"].isin(["train_cgrpo", "train", "calibrate"])
    evaluation = jobs["rule"].isin(["evaluate", "format_rate"])
    return (
        jobs.assign(
            runs=jobs["rule"].isin(["train_cgrpo", "train"]).astype(int),
            training_rollouts=(jobs["rollouts"] - jobs["calibration_rollouts"]).where(training, 0),
            evaluation_completions=jobs["rollouts"].where(evaluation, 0),
            training_gpu_hours=jobs["gpu_hours"].where(training, 0.0),
            evaluation_gpu_hours=jobs["gpu_hours"].where(evaluation, 0.0),
        )
        .groupby("method", sort=False)[
            [
                "runs",
                "training_rollouts",
                "calibration_rollouts",
                "evaluation_completions",
                "generated_tokens",
                "trained_tokens",
                "training_gpu_hours",
                "evaluation_gpu_hours",
                "gpu_hours",
            ]
        ]
        .sum()
        .reset_index()
    )


def calibration_shares(jobs: pd.DataFrame) -> pd.DataFrame:
    """Per calibrated run: every calibration its record will count against G = max(grid)'s training rollouts on the
    same prompts."""
    calibrated = jobs[jobs.get("run_calibration_rollouts", pd.Series(dtype=float)).fillna(0) > 0]
    return pd.DataFrame(
        {
            "job": calibrated["job"],
            "calibration_rollouts": calibrated["run_calibration_rollouts"].astype(int),
            "share": calibrated["run_calibration_rollouts"] / calibrated["reference_rollouts"],
        }
    ).reset_index(drop=True)


def plan_warnings(shares: pd.DataFrame, totals: pd.DataFrame) -> list[str]:
    """Sentences on what would spend the run badly: calibrations above `CALIBRATION_SHARE_LIMIT`, evaluations that
    cost more GPU time than all the training."""
    warnings = []
    high = shares[shares["share"] > CALIBRATION_SHARE_LIMIT]
    for setting, group in high.groupby(high["job"].str.replace(r"_s\d+", "", regex=True), sort=False):
        warnings.append(
            f"{setting}: calibrations draw {group['calibration_rollouts'].max():,.0f} rollouts a run, "
            f"{group['share'].max():.0%} of G = max(grid)'s training rollouts (above {CALIBRATION_SHARE_LIMIT:.0%}), "
            "so it must save that much by stopping just to tie: calibrate fewer prompts "
            "(cgrpo.options.num_calibration_samples) or less often (cgrpo.recalibrate_every)."
        )
    evaluation, training = totals["evaluation_gpu_hours"].sum(), totals["training_gpu_hours"].sum()
    if evaluation > training:
        warnings.append(
            f"The evaluations plan {evaluation:,.1f} GPU-hours against {training:,.1f} for all training and "
            "calibration: bound splits.sizes.eval and splits.sizes.calibration (every evaluation samples both) or "
            "evaluation.max_new_tokens."
        )
    return warnings


def plan_report(
    config: Config,
    throughput: Throughput,
    tokens: TokenCounts = TokenCounts(),
    mean_k: float | None = None,
    model: ModelSize | None = None,
    measured_on: ModelSize | None = None,
    gpu_memory_gib: float = 80.0,
) -> str:
    """The plan as text: how it counts, every job, the totals per method, the calibration shares, each job's GPU
    memory and the warnings. `model` is the size of the config's model (None: unknown, and its memory not estimated);
    throughputs measured on `measured_on` are scaled to it."""
    if measured_on is not None:
        if model is None:
            raise ValueError(
                f"the throughputs were measured on {measured_on.name}, but the size of the config's model is unknown, "
                "so they cannot be scaled to it: give --model-config or --model-params."
            )
        throughput = throughput.scaled(measured_on, model)
    jobs = plan_jobs(config, tokens, mean_k)
    totals = method_totals(jobs, throughput)
    shares = calibration_shares(jobs)
    hours = throughput.hours(jobs["generated_tokens"], jobs["trained_tokens"], jobs["engine_starts"])
    memory, memory_notes = _memory_section(config, model, gpu_memory_gib, tokens.prompt)
    sections = [
        f"Cost plan of experiment {config['experiment']}: {len(jobs)} jobs that load the policy, "
        f"{hours.sum():,.1f} GPU-hours at {throughput.generation:,.0f} generated and {throughput.training:,.0f} "
        f"trained tokens per second and {throughput.startup_s:g} s per vLLM engine start.",
        _assumptions(tokens, mean_k, model, measured_on),
        "## Jobs\n\n" + _markdown(jobs.assign(gpu_hours=hours).drop(columns=_RUN_COLUMNS, errors="ignore")),
        "## Per method\n\n" + _markdown(totals),
        "## Calibration share (of G = max(grid)'s training rollouts on the run's prompts)\n\n"
        + (_markdown(shares) if len(shares) else "No calibrated runs."),
        memory,
    ]
    warnings = plan_warnings(shares, totals) + memory_notes
    sections.append("## Warnings\n\n" + ("\n".join(f"- {line}" for line in warnings) if warnings else "None."))
    return "\n\n".join(sections) + "\n"


def _assumptions(
    tokens: TokenCounts, mean_k: float | None, model: ModelSize | None, measured_on: ModelSize | None
) -> str:
    completion = (
        f"{tokens.completion:g} tokens per completion (expected mean)"
        if tokens.completion is not None
        else "every completion at its maximum length (an upper bound; --completion-tokens sets an expected mean)"
    )
    stopping = (
        f"at an expected mean of {mean_k:g} rollouts per prompt"
        if mean_k
        else "at the worst case, every prompt drawing the grid's largest budget (--mean-k sets an expected mean)"
    )
    if measured_on is None:
        rates = "Throughputs as given, for the config's own model (--measured-on names another they were measured on)"
    else:
        rates = (
            f"Throughputs measured on {measured_on.name} ({measured_on.params:,} parameters), scaled to "
            f"{model.name} ({model.params:,}) by parameter count"
        )
    return (
        f"Counted: {completion}; {tokens.prompt:g} prompt tokens per trained rollout (--prompt-tokens; the format_rate "
        f"table measures both). Stopping rules' training rollouts are unknown before they run: planned {stopping}. "
        f"{rates}. Times include each vLLM engine's start-up (--engine-startup-s), not the loading of the policy."
    )


def _memory_section(
    config: Config, model: ModelSize | None, gpu_gib: float, prompt_tokens: float
) -> tuple[str, list[str]]:
    """The GPU memory section of the report, and its warnings."""
    heading = f"## GPU memory per job (GiB, on a GPU of {gpu_gib:g} GiB)"
    reason = _unestimated(config, model)
    if reason:
        return f"{heading}\n\nNot estimated: {reason}.", []
    jobs = memory_jobs(config, model, gpu_gib, prompt_tokens)
    basis = (
        f"{model.name}: {model.params:,} parameters, {model.kv_bytes_per_token() / 1024:g} KiB of KV cache a token "
        f"in 16 bits ({model.source}). Rows at prompt plus maximum completion tokens (vllm_max_model_length where "
        "--prompt-tokens is not given); CUDA context, fragmentation and vLLM's own activations and CUDA graphs not "
        'counted (docs/clusters.md, "The memory estimate").'
    )
    return f"{heading}\n\n{basis}\n\n{_markdown(memory_table(jobs))}", memory_warnings(jobs, gpu_gib)


def _unestimated(config: Config, model: ModelSize | None) -> str | None:
    """Why the memory of `config`'s jobs cannot be estimated, or None."""
    if config["base_model"]["bootstrap"]:
        return "the workflow bootstraps the base model, whose size is known once it has"
    if config["training"].get("use_cpu"):
        return "training runs on CPU (training.use_cpu)"
    if model is None:
        return (
            f"no config.json of {config['base_model']['path']} was found (in its folder, the Hugging Face cache, or "
            f"among the published ones of {', '.join(PUBLISHED)}): give --model-config"
        )
    if not model.has_shapes:
        return "only the parameter count is known (--model-params): give --model-config for the model's shapes"
    return None


def _markdown(table: pd.DataFrame) -> str:
    return table.to_markdown(index=False, floatfmt=",.3f", intfmt=",")
