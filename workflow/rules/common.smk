import json
import re
from pathlib import Path

from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

from cgrpo.pipeline.configuration import methods, provenance, run_specs, specs
from cgrpo.pipeline.configuration.checks import ConfigError, check_config
from cgrpo.pipeline.configuration.plugins import import_plugins
from cgrpo.pipeline.configuration.schema_errors import validate_config
from cgrpo.pipeline.configuration.specs import format_delta, format_grid
from cgrpo.pipeline.jobs.devices import offer_devices
from cgrpo.pipeline.jobs.vllm_backend import check_vllm_installed

##### config validation #####

# Absolute, for the onstart hook too, which runs where Snakemake no longer knows this file's folder.
SCHEMA = workflow.source_path("../schemas/config.schema.yaml")


def check_resources():
    """Refuse resources no job can run with (Snakemake would wait for them forever), before anything is planned."""
    given = workflow.resource_settings
    for flag, value in (("--cores", given.cores), ("--jobs", given.nodes), ("--local-cores", given.local_cores)):
        if value is not None and value < 1:
            raise WorkflowError(
                f"{flag} {value} leaves no room for any job, which Snakemake would wait for forever; give {flag} 1 "
                "or more."
            )


check_resources()
try:
    validate_config(config, SCHEMA)
    # Plugins register stopping rules and tasks, which the config check and the run names must know.
    import_plugins(config["plugins"])
    check_config(config)
except (ConfigError, ValueError) as error:
    raise WorkflowError(str(error)) from None


##### one results folder, one config (cgrpo.pipeline.configuration.provenance) #####


def schema_defaults(record):
    """Give a recorded config the defaults of keys the schema gained since it was written."""
    try:
        validate(record, schema=SCHEMA)
    except WorkflowError:
        # A key the schema has dropped since fails validation; the comparison then shows it as a change.
        pass


def claim_results_folder(record):
    """Check that results/<experiment>/ holds this config's results, and with `record` write that it does."""
    try:
        provenance.claim_experiment_folder(f"results/{config['experiment']}", config, schema_defaults, record)
    except ConfigError as error:
        raise WorkflowError(str(error)) from None


def executing():
    """Whether this call runs jobs (a run, --touch), not only looks at the plan (-n, --dag, --rulegraph, --summary,
    --report, --lint, --list-rules), which must leave results/ as it found it."""
    return workflow.executor_plugin is not None and not workflow.dryrun


# Every call refuses another config's folder before planning; only a run, about to start its jobs, claims it.
claim_results_folder(record=False)


onstart:
    try:
        check_vllm_installed(config)
        # Before the first job starts: each GPU job of a local run claims one of the offered devices for itself.
        offer_devices(workflow)
    except ValueError as error:
        raise WorkflowError(str(error)) from None
    claim_results_folder(record=True)


##### wildcards and run names #####


wildcard_constraints:
    exp=re.escape(config["experiment"]),
    grid=r"\d+(?:-\d+)*",
    delta=r"auto|[0-9.]+(?:e-?[0-9]+)?",
    recal=r"\d+",
    calseed=r"\d+",
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


TABLES = [
    "summary",
    "by_method",
    "paired",
    "over_base",
    "coverage",
    "coverage_splits",
    "conformal",
    "delta_sweep",
    "frontier",
    "frontier_at_cgrpo",
]
PLOTS = ["pareto", "training_curves", "thresholds", "coverage", "delta_sweep", "frontier"]
REPLAY_TABLES = ["replay", "replay_at_cgrpo"]
BASE_MODEL_TABLES = ["format_rate"]


BUDGET_TABLES = [
    "learning_curve",
    "budget_comparison",
    "budget_curve",
    "budget_calibrations",
    "budget_mechanisms",
    "lr_sweep",
]


def budgeted():
    """Whether a rollout budget ends every run (`budget.rollouts`), whose learning curves are then the comparison."""
    return (config.get("budget") or {}).get("rollouts") is not None


def final_outputs():
    """The targets of the workflow, the tables (csv and markdown) and the plots: the learning curves' where a rollout
    budget ends the runs, the step-count comparison's otherwise, and the replay's and the format check's in both."""
    exp = config["experiment"]
    tables, plots = (BUDGET_TABLES, ["learning_curves"]) if budgeted() else (TABLES, PLOTS)
    return [
        *(
            f"results/{exp}/tables/{t}.{ext}"
            for t in tables + REPLAY_TABLES + BASE_MODEL_TABLES
            for ext in ("csv", "md")
        ),
        *(f"results/{exp}/plots/{p}.png" for p in plots + ["replay"]),
    ]


##### specs handed to the library #####


def spec_file(pattern, spec):
    """Input function: the job's spec file (`pattern` with the job's wildcards), holding `spec(wildcards)`.

    A run rewrites it only when the spec changes, so that a changed setting reruns the jobs whose spec holds it; a
    command that only looks writes nothing under results/ (`cgrpo.pipeline.configuration.provenance.planned_spec`).
    """

    def path(wildcards):
        return provenance.planned_spec(pattern.format(**dict(wildcards.items())), spec(wildcards), executing())

    return path


def base_model_location(record):
    """Where the base model loads from: the bootstrapped folder holding `record`, or the
    configured hub id or path."""
    if config["base_model"]["bootstrap"]:
        return str(Path(record).parent)
    return specs.base_model_path(config)


def base_model_record(wildcards):
    """The base_model rule's record, an input of every rule that loads the base model."""
    return f"results/{wildcards.exp}/base_model/source.json"


def splits_folder(wildcards):
    """The split rule's folder, which every later step loads its splits from."""
    return f"results/{wildcards.exp}/splits"


# Every spec below is a function of the wildcards alone, so that the job's spec file and its params (canonical, so
# that key order never reads as a change) are the same spec.


def base_model_params(wildcards):
    """What the base_model rule records, and the bootstrap settings when it trains the model."""
    bootstrap = config["base_model"]["bootstrap"]
    return provenance.canonical(
        {
            "bootstrap": bootstrap,
            "path": config["base_model"]["path"] if bootstrap else specs.base_model_path(config),
            "options": config["base_model"]["options"] if bootstrap else {},
        }
    )


def split_params(wildcards):
    """Task, sizes and seed of the split rule."""
    dedupe = config["splits"]["dedupe"]
    return provenance.canonical(
        {
            "task": specs.task_spec(config),
            "sizes": config["splits"]["sizes"],
            "seed": config["splits"]["seed"],
            "eval_source_split": config["splits"]["eval_source_split"],
            "drop_overlap": config["splits"]["drop_overlap"],
            # Only when set: the splits of a config without it keep their spec, and so their results.
            **({"dedupe": dedupe} if dedupe != "text" else {}),
        }
    )


def calibrate_spec(wildcards):
    """Spec of cgrpo.pipeline.jobs.runs.calibrate_initial for the grid and seed in the wildcards."""
    model = base_model_location(base_model_record(wildcards))
    spec = specs.calibration_spec(config, wildcards.grid, wildcards.calseed, model, splits_folder(wildcards))
    return provenance.canonical(spec.to_dict())


def format_rate_spec(wildcards):
    """Spec of cgrpo.pipeline.jobs.format_rate.measure_format_rate: the base model before training."""
    model = base_model_location(base_model_record(wildcards))
    spec = specs.format_rate_spec(config, model, splits_folder(wildcards))
    return provenance.canonical(spec.to_dict())


def initial_calibration(wildcards):
    """The initial calibration a run starts from, for a method that has one: its grid's, drawn with its seed or with
    the split seed (`cgrpo.calibrate_per_seed`)."""
    name = methods.parse_run_name(wildcards.run)
    seed = specs.calibration_seed(config, name.seed)
    return f"results/{wildcards.exp}/calibration/{format_grid(name.budget_grid)}/s{seed}/thresholds.json"


def train_spec(wildcards):
    """Spec of cgrpo.pipeline.jobs.runs.train_run for the run in the wildcards."""
    model = base_model_location(base_model_record(wildcards))
    method = methods.METHODS[methods.parse_run_name(wildcards.run).method]
    calibration = initial_calibration(wildcards) if method.calibrated else None
    spec = run_specs.train_spec(config, wildcards.run, model, splits_folder(wildcards), calibration)
    return provenance.canonical(spec.to_dict())


def evaluated_model(wildcards):
    """The model to evaluate: a run's model folder, or the base model's record."""
    if wildcards.run == "base":
        return base_model_record(wildcards)
    return f"results/{wildcards.exp}/runs/{wildcards.run}/model"


def evaluation_inputs(wildcards):
    """The model to evaluate, the splits and the job's spec file."""
    return {
        "model": evaluated_model(wildcards),
        "splits": f"results/{wildcards.exp}/splits/manifest.json",
        "spec": spec_file("results/{exp}/specs/evaluate/{run}.json", evaluate_spec)(wildcards),
    }


def evaluate_spec(wildcards):
    """Spec of cgrpo.pipeline.jobs.evaluation.evaluate_model for one run (or the base model)."""
    model = evaluated_model(wildcards)
    if wildcards.run == "base":
        model = base_model_location(model)
    spec = run_specs.evaluation_spec(config, wildcards.run, model, splits_folder(wildcards))
    return provenance.canonical(spec.to_dict())


def curve_files(wildcards):
    """The learning curve of the base model and of every static run."""
    return [f"results/{wildcards.exp}/curves/{run}.json" for run in ["base", *static_runs()]]


def curve_inputs(wildcards):
    """What a curve job reads: the run's record (whose milestone models it samples) or the base model's, the splits
    and the job's spec file."""
    model = {"model": base_model_record(wildcards)} if wildcards.run == "base" else {}
    record = {} if wildcards.run == "base" else {"record": f"results/{wildcards.exp}/runs/{wildcards.run}/run.json"}
    return {
        **model,
        **record,
        "splits": f"results/{wildcards.exp}/splits/manifest.json",
        "spec": spec_file("results/{exp}/specs/curve/{run}.json", curve_job_spec)(wildcards),
    }


def curve_job_spec(wildcards):
    """Spec of cgrpo.pipeline.jobs.curves.evaluate_curve for one run (or the base model)."""
    if wildcards.run == "base":
        record, model = None, base_model_location(base_model_record(wildcards))
    else:
        record = f"results/{wildcards.exp}/runs/{wildcards.run}/run.json"
        model = str(Path(record).parent)
    spec = run_specs.curve_spec(config, wildcards.run, record, model, splits_folder(wildcards))
    return provenance.canonical(spec.to_dict())


def learning_curves_spec(wildcards):
    """The settings the learning-curve tables read: the target and how the intervals are drawn."""
    return provenance.canonical(
        {
            "target_share": config["budget"]["target_share"],
            "resamples": config["statistics"]["bootstrap_resamples"],
            "seed": config["statistics"]["seed"],
        }
    )


def replay_records(wildcards):
    """The evaluation records whose samples the replay replays (`replay.models`)."""
    return [f"results/{wildcards.exp}/eval/{run}.json" for run in config["replay"]["models"]]


def replay_spec(wildcards):
    """Spec of cgrpo.pipeline.analysis.replay.run_replay."""
    return provenance.canonical(specs.replay_spec(config, replay_records(wildcards)))


def statistics_spec(wildcards):
    """The config settings that aggregate reads (how its intervals are drawn)."""
    return provenance.canonical(config["statistics"])


##### report entries #####


def in_report(shown, path, **kwargs):
    """`path` as a report entry when `shown`, a plain output otherwise: a plot or table of one point says nothing."""
    return report(path, **kwargs) if shown else path


def several_deltas():
    """Whether C-GRPO runs at more than one delta, so that the delta sweep has more than one point."""
    return len(config["cgrpo"]["deltas"]) > 1
