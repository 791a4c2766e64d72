"""Training methods by name: one record per method, from which the pipeline derives everything method-specific.

A record says how the method's runs are named (and parsed back), which runs a config asks for, what its training spec
holds beyond the common fields, which trainer builds it (`cgrpo.pipeline.jobs.trainers`), how a run's setting reads in the
tables, and whether it starts from the pipeline's initial calibration (rule `train_cgrpo`) or not (rule `train`).
Adding a method is one record here plus its trainer builder; `cgrpo.pipeline.configuration.run_specs` builds a run's
specs from its record.

Run names, and the spelling of grids and deltas in them, are built and parsed here and nowhere else.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...stopping import get_rule, rule_names
from .specs import (
    evaluation_grid,
    format_delta,
    format_grid,
    method_trainer,
    parse_delta,
    parse_grid,
)

__all__ = [
    "METHODS",
    "RUN_NAME_PATTERN",
    "Method",
    "RunName",
    "ablation_run_name",
    "cgrpo_run_name",
    "dapo_run_name",
    "grpo_run_name",
    "lr_suffix",
    "method_label",
    "method_learning_rate",
    "add_methods",
    "add_rule_methods",
    "method_order",
    "parse_run_name",
    "run_pattern",
    "setting_label",
    "static_runs",
]

Config = Mapping[str, Any]


@dataclass(frozen=True)
class RunName:
    """What a run name says: the method (a key of `METHODS`, or ``"base"``) and its settings."""

    method: str
    seed: int | None = None
    budget_grid: tuple[int, ...] | None = None
    delta: str | float | None = None
    recalibrate_every: int | None = None
    num_generations: int | None = None
    compute_matched: bool = False
    stop_setting: float | None = None
    group_weighting: str = "tokens"
    lr_factor: float = 1.0


@dataclass(frozen=True)
class Method:
    """Everything the pipeline needs to know about one training method.

    Attributes:
        name: the run-name prefix and the `method` field of its records.
        label: its name in tables and plots.
        section: the config section whose `trainer` options update `training` for its runs.
        pattern: the regular expression of its run names, with named groups.
        parse: the `RunName` fields of a match of `pattern`.
        runs: the names of the runs a config asks for before any training (one per seed and setting).
        spec_fields: the `TrainSpec` fields beyond the common ones, from the config, the parsed name and the initial
            calibration's path (None for a method without one); a `trainer` among them replaces the method's
            `training` + `<section>.trainer` options.
        trainer: the name of its builder in `cgrpo.pipeline.jobs.trainers`.
        setting: how a run record's setting reads, shared by all its seeds.
        calibrated: whether its runs start from the pipeline's initial calibration of their grid.
    """

    name: str
    label: str
    section: str
    pattern: str
    parse: Callable[[re.Match], dict[str, Any]]
    runs: Callable[[Config], list[str]]
    spec_fields: Callable[[Config, RunName, str | None], dict[str, Any]]
    trainer: str
    setting: Callable[[Mapping[str, Any]], str]
    calibrated: bool = False


# --------------------------------------------------------------------------- C-GRPO


# The run-name suffix of a run whose prompt groups weigh the same in the loss (`cgrpo.group_weightings`); a run of TRL's
# token weighting has none, as every run had before the option existed.
_WEIGHTING_SUFFIX = {"tokens": "", "equal": "_weq"}
_WEIGHTING = r"(?P<weighting>_weq)?"


def _weighting(match: re.Match) -> str:
    return "equal" if match["weighting"] else "tokens"


def _group_weightings(config: Config) -> list[str]:
    return list(config["cgrpo"].get("group_weightings", ["tokens"]))


def _weighting_options(options: Mapping[str, Any], weighting: str) -> dict[str, Any]:
    """C-GRPO's trainer options with the run's group weighting, set only where it is not TRL's (unchanged specs)."""
    return dict(options) if weighting == "tokens" else {**options, "group_weighting": weighting}


def _weighting_label(record: Mapping[str, Any]) -> str:
    return ", equal group weights" if record.get("group_weighting") == "equal" else ""


def cgrpo_run_name(
    seed: int, grid: Sequence[int], delta: Any, recalibrate_every: int, weighting: str = "tokens"
) -> str:
    """``cgrpo_s<seed>_g<grid>_d<delta>_r<recalibrate_every>``, with ``_weq`` for equal group weights."""
    name = f"cgrpo_s{int(seed)}_g{format_grid(grid)}_d{format_delta(delta)}_r{int(recalibrate_every)}"
    return name + _WEIGHTING_SUFFIX[weighting]


def _cgrpo_fields(match: re.Match) -> dict[str, Any]:
    return {
        "budget_grid": tuple(parse_grid(match["grid"])),
        "delta": parse_delta(match["delta"]),
        "recalibrate_every": int(match["recal"]),
        "group_weighting": _weighting(match),
    }


def _cgrpo_runs(config: Config) -> list[str]:
    cgrpo = config["cgrpo"]
    return [
        cgrpo_run_name(seed, grid, delta, recal, weighting)
        for weighting in _group_weightings(config)
        for grid in cgrpo["budget_grids"]
        for delta in cgrpo["deltas"]
        for recal in cgrpo["recalibrate_every"]
        for seed in config["seeds"]
    ]


def _cgrpo_spec(config: Config, name: RunName, calibration: str | None) -> dict[str, Any]:
    return {
        "reference_budget": max(name.budget_grid),
        "budget_grid": list(name.budget_grid),
        "delta": name.delta,
        "recalibrate_every": name.recalibrate_every,
        "cgrpo": _weighting_options(config["cgrpo"]["options"], name.group_weighting),
        "initial_calibration": calibration,
    }


def _cgrpo_setting(record: Mapping[str, Any]) -> str:
    drop = ", drop unanimous" if record.get("drop_unanimous") else ""
    setting = (
        f"grid {record['budget_grid']}, delta {format_delta(record['delta'])}, recal {record['recalibrate_every']}"
    )
    return setting + drop + _weighting_label(record)


# --------------------------------------------------------------------------- fixed-group GRPO


def grpo_run_name(seed: int, group_size: int, matched: bool = False) -> str:
    """``grpo_s<seed>_G<group_size>``, with ``_matched`` for a compute-matched baseline."""
    return f"grpo_s{int(seed)}_G{int(group_size)}" + ("_matched" if matched else "")


def _group_size_fields(match: re.Match) -> dict[str, Any]:
    fields = {"num_generations": int(match["G"])}
    if "matched" in match.re.groupindex:
        fields["compute_matched"] = match["matched"] is not None
    return fields


def _grpo_runs(config: Config) -> list[str]:
    return [grpo_run_name(seed, size) for size in config["grpo"]["num_generations"] for seed in config["seeds"]]


def _same_prompts_per_step(config: Config, section: str, group_size: int) -> dict[str, Any]:
    """A baseline's trainer options, with the batch that trains C-GRPO's prompts per step at its own G.

    C-GRPO's micro-batch of R rows holds R / max(grid) prompts (the first grid's); the baseline's holds as many, in
    R x G / max(grid) rows, so that every method trains the same prompts for the same steps. A baseline whose own
    section sets `per_device_train_batch_size` keeps it.
    """
    trainer = method_trainer(config, section)
    if "per_device_train_batch_size" in config[section]["trainer"]:
        return trainer
    # The schema gives `training.per_device_train_batch_size` a default, so a validated config always has it.
    rows = int(method_trainer(config, METHODS["cgrpo"].section)["per_device_train_batch_size"])
    largest = max(evaluation_grid(config))
    if rows * group_size % largest:
        raise ValueError(
            f"{section}.num_generations has group size {group_size}, but C-GRPO trains {rows}/{largest} prompts per "
            f"micro-batch ({rows} rows of groups of {largest}), which groups of {group_size} cannot match in whole "
            f"rows; choose another group size or set {section}.trainer.per_device_train_batch_size."
        )
    trainer["per_device_train_batch_size"] = rows * group_size // largest
    return trainer


def _grpo_spec(config: Config, name: RunName, calibration: str | None) -> dict[str, Any]:
    # Savings are measured against G = max(first grid), the group C-GRPO's largest budget fills.
    return {
        "trainer": _same_prompts_per_step(config, "grpo", name.num_generations),
        "reference_budget": max(evaluation_grid(config)),
        "num_generations": name.num_generations,
        "compute_matched": name.compute_matched,
    }


def _grpo_setting(record: Mapping[str, Any]) -> str:
    matched = " (compute-matched)" if record.get("compute_matched") else ""
    return f"G={record['num_generations']}{matched}"


# --------------------------------------------------------------------------- DAPO


def dapo_run_name(seed: int, group_size: int) -> str:
    """``dapo_s<seed>_G<group_size>``: GRPO with DAPO's dynamic sampling."""
    return f"dapo_s{int(seed)}_G{int(group_size)}"


def _dapo_runs(config: Config) -> list[str]:
    return [dapo_run_name(seed, size) for size in config["dapo"]["num_generations"] for seed in config["seeds"]]


def _dapo_spec(config: Config, name: RunName, calibration: str | None) -> dict[str, Any]:
    dapo = config["dapo"]
    return {
        "trainer": _same_prompts_per_step(config, "dapo", name.num_generations),
        "reference_budget": max(evaluation_grid(config)),
        "num_generations": name.num_generations,
        "dynamic": {
            key: dapo[key] for key in ("prompts_per_round", "max_sampling_rounds", "filter_metric", "allow_short_batch")
        },
    }


# --------------------------------------------------------------------------- other stopping rules


def ablation_run_name(
    rule: str, seed: int, grid: Sequence[int], setting: float | None = None, weighting: str = "tokens"
) -> str:
    """``<rule>_s<seed>_g<grid>``, with ``_t<setting>`` for a rule with a parameter (``share``'s tau, say) and
    ``_weq`` for equal group weights."""
    name = f"{rule}_s{int(seed)}_g{format_grid(grid)}"
    return (name if setting is None else f"{name}_t{setting:g}") + _WEIGHTING_SUFFIX[weighting]


def _ablation_settings(config: Config, rule: str) -> list:
    """The settings of `rule`'s runs: `ablations.settings[rule]`, else `stop_share` for share, else its default."""
    ablations = config["cgrpo"]["ablations"]
    parameter = get_rule(rule).parameter
    if parameter is None:
        return [None]
    if rule in ablations.get("settings", {}):
        return list(ablations["settings"][rule])
    return [ablations["stop_share"] if rule == "share" else get_rule(rule).defaults[parameter]]


def _ablation_fields(rule: str) -> Callable[[re.Match], dict[str, Any]]:
    def parse(match: re.Match) -> dict[str, Any]:
        fields = {"budget_grid": tuple(parse_grid(match["grid"])), "group_weighting": _weighting(match)}
        if "setting" in match.re.groupindex:
            parameter = get_rule(rule).parameter
            fields["stop_setting"] = type(get_rule(rule).defaults[parameter])(float(match["setting"]))
        return fields

    return parse


def _ablation_runs(rule: str) -> Callable[[Config], list[str]]:
    def runs(config: Config) -> list[str]:
        if rule not in config["cgrpo"]["ablations"]["rules"]:
            return []
        grid = evaluation_grid(config)
        return [
            ablation_run_name(rule, seed, grid, setting, weighting)
            for weighting in _group_weightings(config)
            for setting in _ablation_settings(config, rule)
            for seed in config["seeds"]
        ]

    return runs


def _ablation_spec(rule: str) -> Callable[[Config, RunName, str | None], dict[str, Any]]:
    def spec_fields(config: Config, name: RunName, calibration: str | None) -> dict[str, Any]:
        # C-GRPO's options, trainer and grid; only the stopping rule differs. A calibrated rule calibrates itself in
        # the trainer; nothing is held out.
        options = {**config["cgrpo"]["options"], "stopping_rule": rule, "calibration_holdout": 0}
        # The rule's own trainer options (Reinforce-Ada's balanced group, say), set only where the config lists them.
        options.update(config["cgrpo"]["ablations"].get("options", {}).get(rule, {}))
        if rule == "share":
            options["stop_share"] = name.stop_setting
        elif name.stop_setting is not None:
            options["stopping_options"] = {get_rule(rule).parameter: name.stop_setting}
        recalibrate = _ablation_recalibration(config)
        if get_rule(rule).calibrated and recalibrate is not None:
            options["recalibrate_every"] = recalibrate
        return {
            "reference_budget": max(name.budget_grid),
            "budget_grid": list(name.budget_grid),
            "cgrpo": _weighting_options(options, name.group_weighting),
        }

    return spec_fields


def _ablation_recalibration(config: Config) -> int | None:
    """How often a calibrated rule fits itself again: `ablations.recalibrate_every`, else once where a rollout budget
    counts every calibration, else None (the trainer's default; left out of the spec, which stays as it was)."""
    recalibrate = config["cgrpo"]["ablations"].get("recalibrate_every")
    if recalibrate is None and (config.get("budget") or {}).get("rollouts") is not None:
        return 0
    return recalibrate


def _ablation_setting(record: Mapping[str, Any]) -> str:
    rule = record["stopping_rule"]
    setting = record.get("stop_setting", record.get("stop_share"))
    value = "" if setting is None else f" {setting:g}"
    return f"grid {record['budget_grid']}, stop at {rule}{value}" + _weighting_label(record)


def _rule_method(rule: str) -> Method:
    """The pipeline method of a registered stopping rule other than the conformal one: C-GRPO with that rule."""
    cls = get_rule(rule)
    setting = r"_t(?P<setting>[0-9.]+)" if cls.parameter else ""
    return Method(
        name=rule,
        label=cls.label,
        section="cgrpo",
        pattern=rule + _SEED + r"_g(?P<grid>\d+(?:-\d+)*)" + setting + _WEIGHTING,
        parse=_ablation_fields(rule),
        runs=_ablation_runs(rule),
        spec_fields=_ablation_spec(rule),
        trainer="ablation_trainer",
        setting=_ablation_setting,
    )


# --------------------------------------------------------------------------- the registry

_SEED = r"_s(?P<seed>\d+)"

METHODS: dict[str, Method] = {
    method.name: method
    for method in (
        Method(
            name="cgrpo",
            label="C-GRPO",
            section="cgrpo",
            pattern=r"cgrpo"
            + _SEED
            + r"_g(?P<grid>\d+(?:-\d+)*)_d(?P<delta>auto|[0-9.]+(?:e-?[0-9]+)?)_r(?P<recal>\d+)"
            + _WEIGHTING,
            parse=_cgrpo_fields,
            runs=_cgrpo_runs,
            spec_fields=_cgrpo_spec,
            trainer="cgrpo_trainer",
            setting=_cgrpo_setting,
            calibrated=True,
        ),
        Method(
            name="grpo",
            label="GRPO",
            section="grpo",
            pattern=r"grpo" + _SEED + r"_G(?P<G>\d+)(?P<matched>_matched)?",
            parse=_group_size_fields,
            runs=_grpo_runs,
            spec_fields=_grpo_spec,
            trainer="grpo_trainer",
            setting=_grpo_setting,
        ),
        Method(
            name="dapo",
            label="DAPO",
            section="dapo",
            pattern=r"dapo" + _SEED + r"_G(?P<G>\d+)",
            parse=_group_size_fields,
            runs=_dapo_runs,
            spec_fields=_dapo_spec,
            trainer="dapo_trainer",
            setting=lambda record: f"G={record['num_generations']}, dynamic sampling",
        ),
    )
}

_COMPILED: dict[str, re.Pattern] = {}


# The run-name suffix of a run trained at a multiple of its method's learning rate (`learning_rates.sweep`); a run at
# the method's own rate has none, as every run had before the sweep existed.
_LR = r"(?:_lrx(?P<lr>[0-9.]+))?"


def lr_suffix(factor: float) -> str:
    """``_lrx<factor>`` for a run at `factor` times its method's learning rate; empty at 1."""
    return "" if factor == 1 else f"_lrx{factor:g}"


def add_rule_methods() -> None:
    """Add a method for every registered stopping rule that has none yet (call it after importing plugins)."""
    add_methods({rule: _rule_method(rule) for rule in rule_names() if rule != "conformal" and rule not in METHODS})


def add_methods(methods: Mapping[str, Method]) -> None:
    """Add these methods to the registry (those whose name it holds already stay) and to the run-name patterns."""
    global RUN_NAME_PATTERN
    for name, method in methods.items():
        METHODS.setdefault(name, method)
    _COMPILED.update({name: re.compile(method.pattern + _LR) for name, method in METHODS.items()})
    RUN_NAME_PATTERN = "base|" + run_pattern()


def _unnamed(pattern: str) -> str:
    return re.sub(r"\(\?P<\w+>", "(?:", pattern)


def run_pattern(calibrated: bool | None = None) -> str:
    """The run names of the methods that start from an initial calibration (or not; all for None), as one regex.

    Without group names, for Snakemake's wildcard constraints.
    """
    chosen = [m.pattern + _LR for m in METHODS.values() if calibrated is None or m.calibrated == calibrated]
    return "|".join(f"(?:{_unnamed(pattern)})" for pattern in chosen)


# Every run name, the base model's included, for the `run` wildcard.
RUN_NAME_PATTERN = "base|" + run_pattern()
add_rule_methods()


def parse_run_name(name: str) -> RunName:
    """What the run name `name` says (``"base"`` for the base model)."""
    if name == "base":
        return RunName("base")
    for method, pattern in _COMPILED.items():
        match = pattern.fullmatch(name)
        if match is not None:
            factor = float(match["lr"]) if match["lr"] else 1.0
            return RunName(method, int(match["seed"]), **METHODS[method].parse(match), lr_factor=factor)
    raise ValueError(f"{name!r} is not a run name; expect base, cgrpo_s0_g2-4-8_dauto_r50, grpo_s0_G8 or dapo_s0_G8.")


def static_runs(config: Config) -> list[str]:
    """Every training run the config asks for before any training (compute-matched runs come later), by method, at
    every multiple of its learning rate that `learning_rates.sweep` lists."""
    factors = (config.get("learning_rates") or {}).get("sweep", [1])
    return [run + lr_suffix(factor) for method in METHODS.values() for run in method.runs(config) for factor in factors]


def method_learning_rate(config: Config, method: str, factor: float = 1.0) -> float | None:
    """The peak learning rate of `method`'s runs at `factor` times its own: `learning_rates.by_method`, else its
    section's trainer options over `training`; None where neither sets one (TRL's default)."""
    by_method = (config.get("learning_rates") or {}).get("by_method", {})
    rate = by_method.get(method, method_trainer(config, METHODS[method].section).get("learning_rate"))
    return None if rate is None else float(rate) * factor


def method_order(method: str) -> int:
    """Position of `method` in tables: the base model first, then the registry's order."""
    return 0 if method == "base" else 1 + list(METHODS).index(method)


def method_label(method: str) -> str:
    """The name of `method` in tables and plots."""
    return "base" if method == "base" else METHODS[method].label


def setting_label(record: Mapping[str, Any]) -> str:
    """The setting a run record belongs to, shared by all its seeds (``"base model"`` for the base model).

    C-GRPO: ``"grid 2-4-8-16-32, delta auto, recal 10"``, with ``", drop unanimous"`` for a run with
    `drop_unanimous`; GRPO: ``"G=32"``, or ``"G=6 (compute-matched)"`` for a compute-matched baseline; DAPO:
    ``"G=32, dynamic sampling"``.
    """
    method = record["method"]
    if method == "base":
        return "base model"
    if method not in METHODS:
        raise ValueError(
            f"Unknown method {method!r} in run {record.get('run')!r}; expected one of {', '.join(METHODS)}."
        )
    factor = record.get("learning_rate_factor", 1.0)
    return METHODS[method].setting(record) + ("" if factor == 1 else f", lr x{factor:g}")
