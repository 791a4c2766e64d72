import json
import re
from pathlib import Path

from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

from cgrpo.pipeline import methods, specs
from cgrpo.pipeline.config_checks import ConfigError, check_config
from cgrpo.pipeline.specs import format_delta, format_grid

##### config validation #####


validate(config, schema="../schemas/config.schema.yaml")


try:
    check_config(config)
except ConfigError as error:
    raise WorkflowError(str(error)) from None


##### wildcards and run names #####


wildcard_constraints:
    exp=re.escape(config["experiment"]),
    grid=r"\d+(?:-\d+)*",
    delta=r"auto|[0-9.]+(?:e-?[0-9]+)?",
    recal=r"\d+",
    run=methods.RUN_NAME_PATTERN,


def cgrpo_settings():
    """Wildcard values (grid, delta, recal) of every configured C-GRPO setting."""
    return [
        {"grid": format_grid(grid), "delta": format_delta(delta), "recal": str(recal)}
        for grid in config["cgrpo"]["budget_grids"]
        for delta in config["cgrpo"]["deltas"]
        for recal in config["cgrpo"]["recalibrate_every"]
    ]


def cgrpo_runs(setting):
    """Names of the C-GRPO runs of one setting (wildcards or dict)."""
    return [
        methods.cgrpo_run_name(
            seed,
            specs.parse_grid(setting["grid"]),
            specs.parse_delta(setting["delta"]),
            setting["recal"],
        )
        for seed in config["seeds"]
    ]


def fixed_group_sizes_pattern():
    """Regex matching exactly the configured fixed group sizes (grpo.num_generations)."""
    # "(?!)" matches nothing, for a config without fixed group sizes.
    return "|".join(str(size) for size in config["grpo"]["num_generations"]) or "(?!)"


def static_runs():
    """Training runs known before any training: every method's runs, by the registry."""
    return methods.static_runs(config)


def matched_setting_files(wildcards):
    """The match_compute checkpoint's output of every C-GRPO setting."""
    if not config["grpo"]["compute_matched"]:
        return []
    return [
        f"results/{wildcards.exp}/matched/g{s['grid']}_d{s['delta']}_r{s['recal']}.json"
        for s in cgrpo_settings()
    ]


def matched_runs(wildcards):
    """Compute-matched GRPO runs; their group sizes are known once match_compute has run."""
    if not config["grpo"]["compute_matched"]:
        return []
    sizes = set()
    for setting in cgrpo_settings():
        matched = checkpoints.match_compute.get(
            exp=wildcards.exp, **setting
        ).output.matched
        sizes.add(json.loads(Path(matched).read_text())["num_generations"])
    return [
        methods.grpo_run_name(seed, size, matched=True)
        for size in sorted(sizes)
        for seed in config["seeds"]
    ]


def run_files(filename, matched=False):
    """Input function giving `filename` of every static training run, or of every matched one.

    The two groups are separate inputs so that waiting for the checkpoint does not hold back the
    static runs.
    """

    def files(wildcards):
        runs = matched_runs(wildcards) if matched else static_runs()
        return [f"results/{wildcards.exp}/runs/{run}/{filename}" for run in runs]

    return files


def evaluation_files(matched=False):
    """Input function giving the eval record of the base model and every static (or matched) run."""

    def files(wildcards):
        runs = matched_runs(wildcards) if matched else ["base", *static_runs()]
        return [f"results/{wildcards.exp}/eval/{run}.json" for run in runs]

    return files


def cgrpo_setting_records(wildcards):
    """run.json of every seed of the C-GRPO setting in the wildcards."""
    return [
        f"results/{wildcards.exp}/runs/{run}/run.json" for run in cgrpo_runs(wildcards)
    ]


TABLES = ["summary", "by_method", "paired", "coverage", "coverage_splits", "conformal", "delta_sweep"]
PLOTS = ["pareto", "training_curves", "thresholds", "coverage", "delta_sweep"]


def final_outputs():
    """The targets of the workflow, the tables (csv and markdown) and the plots."""
    exp = config["experiment"]
    return [
        *(f"results/{exp}/tables/{t}.{ext}" for t in TABLES for ext in ("csv", "md")),
        *(f"results/{exp}/plots/{p}.png" for p in PLOTS),
    ]


##### specs handed to the library #####


def base_model_location(record):
    """Where the base model loads from: the bootstrapped folder holding `record`, or the
    configured hub id or path."""
    if config["base_model"]["bootstrap"]:
        return str(Path(record).parent)
    return specs.base_model_path(config)


def base_model_record(wildcards):
    """The base_model rule's record, an input of every rule that loads the base model."""
    return f"results/{wildcards.exp}/base_model/source.json"


def base_model_params(wildcards):
    """What the base_model rule records, and the bootstrap settings when it trains the model."""
    bootstrap = config["base_model"]["bootstrap"]
    return {
        "bootstrap": bootstrap,
        "path": config["base_model"]["path"] if bootstrap else specs.base_model_path(config),
        "options": config["base_model"]["options"] if bootstrap else {},
    }


def split_params(wildcards):
    """Task, sizes and seed of the split rule."""
    return {
        "task": specs.task_spec(config),
        "sizes": config["splits"]["sizes"],
        "seed": config["splits"]["seed"],
        "eval_source_split": config["splits"]["eval_source_split"],
        "drop_overlap": config["splits"]["drop_overlap"],
    }


def calibrate_spec(wildcards, input):
    """Spec of cgrpo.pipeline.runs.calibrate_initial for the grid in the wildcards."""
    model = base_model_location(input.base_model)
    splits = str(Path(input.splits).parent)
    return specs.calibration_spec(config, wildcards.grid, model, splits).to_dict()


def initial_calibration(wildcards):
    """The initial calibration a run starts from: its grid's, for a method that has one."""
    name = methods.parse_run_name(wildcards.run)
    return f"results/{wildcards.exp}/calibration/{format_grid(name.budget_grid)}/thresholds.json"


def train_spec(wildcards, input):
    """Spec of cgrpo.pipeline.runs.train_run for the run in the wildcards."""
    model = base_model_location(input.base_model)
    splits = str(Path(input.splits).parent)
    calibration = input.get("calibration")
    return methods.train_spec(config, wildcards.run, model, splits, calibration).to_dict()


def evaluation_inputs(wildcards):
    """The model to evaluate (a run's model folder, or the base model's record) and the splits."""
    model = (
        base_model_record(wildcards)
        if wildcards.run == "base"
        else f"results/{wildcards.exp}/runs/{wildcards.run}/model"
    )
    return {"model": model, "splits": f"results/{wildcards.exp}/splits/manifest.json"}


def evaluate_spec(wildcards, input):
    """Spec of cgrpo.pipeline.evaluation.evaluate_model for one run (or the base model)."""
    run = wildcards.run
    model = base_model_location(input.model) if run == "base" else input.model
    splits = str(Path(input.splits).parent)
    return methods.evaluation_spec(config, run, model, splits).to_dict()
