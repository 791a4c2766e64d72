"""The exact replay frontier: every registered stopping rule at a sweep of its setting, on an evaluated model's pools.

Evaluation keeps ``max(grid)`` samples per calibration and eval prompt (their outcomes and gold answers, the record's
``pools``) for the replay's grid (``replay.budget_grid``, by default the training grid). Outcomes are nested prefixes,
so the budget a rule stops a prompt at, and the group it would have trained on, can be read off these samples exactly,
without training. Calibrated rules are cross-fitted: the pooled prompts are
split in two folds at random, each rule is fitted on one fold and replayed on the other and the other way round, and
this is repeated ``resplits`` times; every prompt's metrics are averaged over its replays.

Per prompt and setting the replay records the rollouts drawn (the stopping budget), whether the prompt is informative
(its ``max(grid)`` rewards differ) and whether the stopped group kept that signal (its own rewards differ too), the
rollouts that carry a non-zero GRPO advantage (the whole group when its rewards differ, none otherwise) and whether the
stopped group's majority answer is the full pool's. Fixed group sizes (rule ``fixed`` at every budget of the grid) are
the reference line. Intervals are percentile bootstraps over prompts, paired across rules (the same resampled prompts
for every setting), and each rule's frontier is interpolated at C-GRPO's rollouts (the conformal rule at the config's
first delta, automatic or fixed) to compare the rules at equal cost.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from ...stopping import Pools, StoppingRule, correct_flags, get_rule, rule_names, stopping_budget
from ..configuration.plugins import import_plugins
from ..metrics.accuracy import majority_answer
from ..metrics.statistics import purpose_seed

__all__ = [
    "ReplaySpec",
    "frontier_at_reference",
    "pools_of_record",
    "replay_frontier",
    "replay_table",
    "rule_settings",
    "run_replay",
]

# The per-prompt measures, averaged over prompts and divided as the table's columns say.
MEASURES = ("rollouts", "informative", "kept", "signal_rows", "kept_rollouts", "agrees")
REFERENCE_RULE = "conformal"


@dataclass(frozen=True)
class ReplaySpec:
    """What the replay rule needs: the evaluated models' records, the grid and score, the replay's settings, and the
    modules registering further rules."""

    records: list[str]
    grid: list[int]
    score: str
    resplits: int
    seed: int
    resamples: int
    settings: dict[str, list]
    options: dict[str, dict]
    plugins: list[str]
    # C-GRPO's delta, which every rule is paired against (None: the automatic delta).
    reference: float | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ReplaySpec:
        return cls(**data)


def rule_settings(
    grid: Sequence[int],
    settings: Mapping[str, list],
    options: Mapping[str, dict],
    score: str,
    reference: float | None = None,
):
    """Every (rule name, setting, rule object) the replay runs: each registered rule at each value of its sweep, and
    the conformal rule at C-GRPO's delta `reference` too."""
    chosen = []
    for name in rule_names():
        cls = get_rule(name)
        values = list(settings.get(name, cls.sweep_for(grid))) if cls.parameter else [None]
        if name == REFERENCE_RULE and reference not in values:
            values.append(reference)
        for value in values:
            extra = {} if cls.parameter is None else {cls.parameter: value}
            chosen.append((name, value, cls(score, **{**options.get(name, {}), **extra})))
    return chosen


def _prompt_measures(grid: list[int], k: int, outcomes: Sequence, rewards: Sequence[float]) -> np.ndarray:
    full, stopped = set(rewards[: grid[-1]]), set(rewards[:k])
    kept = len(full) > 1 and len(stopped) > 1
    agrees = majority_answer(list(outcomes), k) == majority_answer(list(outcomes), grid[-1])
    return np.array([k, len(full) > 1, kept, k if len(stopped) > 1 else 0, k * kept, agrees], dtype=float)


def _replay_fold(rule: StoppingRule, pools: Pools, fit_fold, replay_fold, rng: random.Random) -> dict[int, np.ndarray]:
    fit = rule.fit(pools.subset(fit_fold, rng)) if rule.calibrated else None
    measures = {}
    for i in replay_fold:
        k = stopping_budget(rule, fit, pools.grid, pools.outcomes[i], pools.rewards[i], rng)
        measures[i] = _prompt_measures(pools.grid, k, pools.outcomes[i], pools.rewards[i])
    return measures


def replay_frontier(
    pools: Pools, rules: Sequence[tuple[str, Any, StoppingRule]], resplits: int, seed: int
) -> tuple[list[tuple[str, Any]], np.ndarray]:
    """Per-prompt measures of every rule setting, averaged over the cross-fitted re-splits.

    Returns the (rule, setting) keys and an array of shape (settings, prompts, measures) in :data:`MEASURES` order.
    """
    n = len(pools.outcomes)
    if n < 4:
        raise ValueError(
            f"The replay needs at least 4 prompts with pools to cross-fit, got {n}; evaluate more prompts."
        )
    result = np.zeros((len(rules), n, len(MEASURES)))
    # disable=None: no bar where stderr is no terminal (the replay job's log file).
    for r in tqdm(range(resplits), desc="replay re-splits", leave=False, disable=None):
        order = np.random.default_rng(purpose_seed(seed, f"replay-split-{r}")).permutation(n)
        folds = (order[: n // 2].tolist(), order[n // 2 :].tolist())
        for s, (name, value, rule) in enumerate(rules):
            rng = random.Random(purpose_seed(seed, f"replay-{name}-{value}-{r}"))
            for fit_fold, replay_fold in (folds, folds[::-1]):
                for i, measures in _replay_fold(rule, pools, fit_fold, replay_fold, rng).items():
                    result[s, i] += measures
    return [(name, value) for name, value, _ in rules], result / resplits


def _ratios(means: np.ndarray) -> dict[str, np.ndarray]:
    """The table's columns from mean measures over prompts (last axis: :data:`MEASURES`)."""
    rollouts, informative, kept, signal_rows, kept_rollouts, agrees = np.moveaxis(means, -1, 0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return {
            "rollouts_per_prompt": rollouts,
            "informative_kept": kept / informative,
            "signal_per_rollout": signal_rows / rollouts,
            "informative_group_size": kept_rollouts / kept,
            "majority_agreement": agrees,
        }


def _resampled_means(measures: np.ndarray, resamples: int, seed: int) -> np.ndarray:
    """Mean measures over prompts for each bootstrap resample: shape (resamples, settings, measures)."""
    n = measures.shape[1]
    draws = np.random.default_rng(purpose_seed(seed, "replay-bootstrap")).integers(0, n, size=(resamples, n))
    counts = np.stack([np.bincount(row, minlength=n) for row in draws]).astype(float)
    return np.einsum("bp,spm->bsm", counts, measures) / n


def replay_table(keys, measures: np.ndarray, resamples: int, seed: int, labels: Mapping[str, str]) -> pd.DataFrame:
    """One row per rule setting: each column's mean over prompts with a 95% percentile bootstrap interval."""
    point = _ratios(measures.mean(axis=1))
    boot = _ratios(_resampled_means(measures, resamples, seed))
    rows = []
    for s, (name, value) in enumerate(keys):
        parameter = get_rule(name).parameter
        setting = _setting(value) if parameter else ""
        row = {"rule": name, "label": labels[name], "parameter": parameter or "", "setting": setting}
        for column, values in point.items():
            low, high = np.nanpercentile(boot[column][:, s], [2.5, 97.5]) if column in _INTERVALS else (None, None)
            row[column] = values[s]
            if column in _INTERVALS:
                row[f"{column}_low"], row[f"{column}_high"] = low, high
        row["prompts"] = measures.shape[1]
        rows.append(row)
    return pd.DataFrame(rows)


_INTERVALS = ("rollouts_per_prompt", "informative_kept", "signal_per_rollout")


def _setting(value: Any) -> str:
    # The conformal rule's None is its automatic delta; a rule without a parameter has the one setting "".
    return "auto" if value is None else f"{value:g}"


def frontier_at_reference(
    keys, measures: np.ndarray, resamples: int, seed: int, labels, reference: float | None = None
) -> pd.DataFrame:
    """Each rule against C-GRPO (the conformal rule at delta `reference`, None for the automatic delta), paired over
    bootstrap resamples of prompts.

    Three comparisons per rule, each a point estimate and a 95% percentile interval:

    * ``*_at_equal_rollouts``: its frontier interpolated at C-GRPO's rollouts per prompt, minus C-GRPO's value, for the
      informative prompts kept and the signal per rollout;
    * ``rollouts_at_equal_kept``: the rollouts per prompt its frontier needs to keep C-GRPO's share of informative
      prompts, minus C-GRPO's rollouts;
    * ``closest_*``: its setting closest to C-GRPO's rollouts, as is, so that a rule whose whole frontier lies on one
      side of C-GRPO's cost (where interpolation would be extrapolation, and is left empty) is still compared.

    Resamples where a frontier does not bracket the target are left out of an interval; a point estimate that is not
    bracketed leaves the interpolated columns empty.
    """
    reference = keys.index((REFERENCE_RULE, reference))
    samples = [_ratios(measures.mean(axis=1)), *(_ratios(b) for b in _resampled_means(measures, resamples, seed))]
    rows = []
    for name in dict.fromkeys(key[0] for key in keys):
        if name == REFERENCE_RULE:
            continue
        indices = [s for s, key in enumerate(keys) if key[0] == name]
        point = samples[0]["rollouts_per_prompt"]
        closest = min(indices, key=lambda s: abs(point[s] - point[reference]))
        row = {
            "rule": name,
            "label": labels[name],
            "settings": len(indices),
            "cgrpo_rollouts_per_prompt": point[reference],
            "cgrpo_informative_kept": samples[0]["informative_kept"][reference],
            "closest_setting": _setting(keys[closest][1]) if get_rule(name).parameter else "",
        }
        values = pd.DataFrame([_comparisons(sample, indices, closest, reference) for sample in samples])
        for column in values.columns:
            column_values = values[column].to_numpy(dtype=float)
            finite = column_values[1:][np.isfinite(column_values[1:])]
            point_value = column_values[0]
            interval = np.percentile(finite, [2.5, 97.5]) if np.isfinite(point_value) and len(finite) else (np.nan,) * 2
            row[f"{column}_diff"], row[f"{column}_diff_low"], row[f"{column}_diff_high"] = point_value, *interval
        rows.append(row)
    return pd.DataFrame(rows)


def _comparisons(sample: Mapping[str, np.ndarray], indices, closest: int, reference: int) -> dict[str, float]:
    """One resample's differences of a rule from C-GRPO (see :func:`frontier_at_reference`)."""
    return {
        "informative_kept_at_equal_rollouts": _at(
            sample, indices, reference, "rollouts_per_prompt", "informative_kept"
        ),
        "signal_per_rollout_at_equal_rollouts": _at(
            sample, indices, reference, "rollouts_per_prompt", "signal_per_rollout"
        ),
        "rollouts_at_equal_kept": _at(sample, indices, reference, "informative_kept", "rollouts_per_prompt"),
        **{
            f"closest_{column}": sample[column][closest] - sample[column][reference]
            for column in ("rollouts_per_prompt", "informative_kept", "signal_per_rollout")
        },
    }


def _at(sample: Mapping[str, np.ndarray], indices, reference: int, along: str, column: str) -> float:
    """``column`` of a rule's frontier interpolated at C-GRPO's value of ``along``, minus C-GRPO's ``column``; NaN
    where the rule's settings do not bracket that value."""
    x, y, target = sample[along][indices], sample[column][indices], sample[along][reference]
    if len(indices) < 2 or not np.all(np.isfinite(x)) or not x.min() <= target <= x.max():
        return np.nan
    order = np.argsort(x, kind="stable")
    return float(np.interp(target, x[order], y[order]) - sample[column][reference])


def run_replay(spec: ReplaySpec | Mapping[str, Any], outputs: Mapping[str, str]) -> None:
    """Replay every registered rule on each record's pools; write the frontier and the equal-cost tables and plot."""
    from .plots import plot_replay
    from .reporting import write_table

    spec = spec if isinstance(spec, ReplaySpec) else ReplaySpec.from_dict(spec)
    # A job is a fresh process: the rules the config's plugins register must be imported again.
    import_plugins(spec.plugins)
    labels = {name: get_rule(name).label for name in rule_names()}
    tables, differences = [], []
    for path in spec.records:
        record = json.loads(Path(path).read_text())
        pools = pools_of_record(record, spec.score, spec.grid)
        rules = rule_settings(spec.grid, spec.settings, spec.options, spec.score, spec.reference)
        keys, measures = replay_frontier(pools, rules, spec.resplits, spec.seed)
        model = {"model": record["run"], "resplits": spec.resplits}
        tables.append(replay_table(keys, measures, spec.resamples, spec.seed, labels).assign(**model))
        at_reference = frontier_at_reference(keys, measures, spec.resamples, spec.seed, labels, spec.reference)
        differences.append(at_reference.assign(**model))
    table, at_reference = pd.concat(tables), pd.concat(differences)
    write_table(_model_first(table), outputs["table"], outputs.get("table_md"))
    write_table(_model_first(at_reference), outputs["at_cgrpo"], outputs.get("at_cgrpo_md"))
    plot_replay(table, outputs["plot"])


def _model_first(table: pd.DataFrame) -> pd.DataFrame:
    return table[["model", *[c for c in table.columns if c != "model"]]]


def pools_of_record(record: Mapping[str, Any], score: str, grid: Sequence[int]) -> Pools:
    """The calibration and eval prompts' samples an evaluation record keeps (``pools``), as one set of pools."""
    if "pools" not in record:
        raise ValueError(
            f"The evaluation record of {record.get('run')!r} keeps no samples ('pools'); it predates the replay: "
            "delete it so that the evaluate rule writes it again."
        )
    outcomes, golds = [], []
    for split in ("calibration", "eval"):
        outcomes.extend(record["pools"][split]["outcomes"])
        golds.extend(record["pools"][split]["golds"] or [None] * len(record["pools"][split]["outcomes"]))
    drawn = min(len(row) for row in outcomes)
    if drawn < max(grid):
        raise ValueError(
            f"The evaluation record of {record.get('run')!r} keeps {drawn} samples per prompt, fewer than the replay "
            f"grid's largest budget {max(grid)}: list the run under replay.models so that its evaluation draws them."
        )
    rewards = [correct_flags(score, row, gold) for row, gold in zip(outcomes, golds)]
    return Pools(score, sorted(grid), outcomes, rewards, golds if score == "aps" else None, random.Random(0))
