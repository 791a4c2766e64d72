"""Short markdown digests of finished results folders, which the README and docs/results.md show
(`scripts/generate_docs.py` writes them between their markers, so that every figure there is a committed table's).

- `by_method_digest`: the main columns of a step-count experiment's `by_method` table;
- `budget_digest`: a budgeted experiment's `budget_comparison`, each method against the best fixed group size;
- `verdict_digest`: one line per budgeted experiment: which method to use at an equal rollout budget, by how much
  (calibration counted and excluded), and the smallest difference the run detects with 80% power;
- `confounds_digest`: the verdict's figures before the confounds' fixes (issue #54) and after them;
- `screen_digest`: the difficulty screen's candidate mixes and each rule's best saving;
- `frontier_digest` and `frontier_at_cgrpo_digest`: a training frontier's points, and every method at C-GRPO's cost;
- `paired_digest`: C-GRPO minus each baseline, seed by seed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

import pandas as pd

from ..configuration.methods import method_label
from .curves import detectable_difference

__all__ = [
    "budget_digest",
    "by_method_digest",
    "confounds_digest",
    "frontier_at_cgrpo_digest",
    "frontier_digest",
    "lr_sweep_digest",
    "paired_digest",
    "screen_digest",
    "verdict_digest",
]

LOW, HIGH = "95% CI low", "95% CI high"


def _number(value: float, digits: int, infinite: str = "inf") -> str:
    """`value` to `digits` decimals with thousands separators; `infinite` for +inf (a target never reached)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if math.isinf(value):
        return infinite if value > 0 else "-inf"
    if digits == 0:
        return f"{value:,.0f}"
    return f"{value:,.{digits}f}"


def _cell(row: Mapping, column: str, digits: int = 3) -> str:
    """`value [low, high]`, or the value alone where its interval is missing or has no width."""
    value = row.get(column)
    low, high = row.get(f"{column} {LOW}"), row.get(f"{column} {HIGH}")
    text = _number(value, digits)
    if text and pd.notna(low) and pd.notna(high) and low != high:
        text += f" [{_number(low, digits)}, {_number(high, digits)}]"
    return text


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    return "\n".join([*lines, *("| " + " | ".join(row) + " |" for row in rows)])


def by_method_digest(folder: Path) -> str:
    """Accuracy and cost per method and setting of a step-count experiment (`by_method.csv`)."""
    table = pd.read_csv(Path(folder) / "by_method.csv")
    header = ["method", "setting", "seeds", "greedy accuracy", "sampled accuracy", "rollouts generated"]
    header += ["wall clock (s)", "CPU time (s)"]
    rows = []
    for row in table.to_dict("records"):
        base = row["method"] == "base"
        rows.append(
            [
                "base model" if base else method_label(row["method"]),
                "" if base else row["setting"],
                str(row["seeds"]),
                _cell(row, "greedy accuracy"),
                _cell(row, "sampled accuracy (mean@k)"),
                _cell(row, "rollouts generated (training + calibration)", 0),
                _cell(row, "wall clock (s, training + calibration)", 1),
                _cell(row, "CPU time (s, training + calibration)", 1),
            ]
        )
    return _table(header, rows)


def budget_digest(folder: Path) -> str:
    """Each method and setting of a budgeted experiment against the best fixed G (`budget_comparison.csv`)."""
    table = pd.read_csv(Path(folder) / "budget_comparison.csv")
    header = ["method", "setting", "accuracy at the budget", "minus best fixed G", "AUC minus best fixed G"]
    header += ["rollouts to target", "speed-up to target", "CPU speed-up", "informative groups"]
    rows = [
        [
            row["label"],
            row["setting"],
            _cell(row, "accuracy at budget"),
            _cell(row, "accuracy at budget minus best fixed G"),
            _cell(row, "AUC minus best fixed G"),
            _number(row["rollouts to target"], 0, "not reached"),
            _cell(row, "speed-up to target over best fixed G", 2),
            _cell(row, "CPU speed-up to target over best fixed G", 2),
            _number(row["informative_group_share"], 2),
        ]
        for row in table.to_dict("records")
    ]
    return _table(header, rows)


def _best_other(table: pd.DataFrame, method_filter) -> Mapping | None:
    """The most accurate setting at the budget among the rows `method_filter` keeps (None if it keeps none)."""
    rows = table[method_filter(table["method"])]
    return None if rows.empty else rows.loc[rows["accuracy at budget"].idxmax()]


def _to_target(row: Mapping) -> str:
    """Rollouts and CPU seconds a row needed to reach the target, that it never did on the mean curve, or that there
    is no target (the best fixed G gained nothing)."""
    if math.isnan(row["rollouts to target"]):
        return "no target"
    if math.isinf(row["rollouts to target"]):
        return "not reached"
    return f"{_number(row['rollouts to target'], 0)} rollouts, {_number(row['CPU seconds to target'], 0)} CPU s"


COUNTED = "accuracy at budget minus best fixed G"
EXCLUDED = "accuracy at budget minus best fixed G at equal training rollouts"
DETECTABLE = "detectable at 80% power"
# What the verdict table's terms mean, printed under it so that it reads without another page.
VERDICT_TERMS = """\
- **Rollout**: one sampled completion. Every method stops at the same number of rollouts, its calibration's included.
- **Best fixed G**: the GRPO group size most accurate at the budget, on the prompts named beside it: validation
  prompts, which the reported accuracies (eval prompts) never choose, or in a run before them the eval prompts.
- **Minus it, calibration counted**: the method's accuracy at the budget minus the best fixed G's, both having drawn
  the same rollouts. **Calibration excluded**: minus the best fixed G's at the rollouts the method trained on, as in a
  long run where one calibration amortizes.
- **Accuracy**: the share of right answers among 8 samples per eval prompt, averaged over the seeds and prompts; in
  brackets, a 95% bootstrap interval over seeds and prompts, paired between methods.
- **Detectable (80% power)**: the smallest difference the run finds four times in five; a difference inside it may
  still exist.
- **ESC** stops a prompt once its latest answers agree; the **signal rule** stops where the whole group would likely
  hold no signal (rewards all equal)."""


def _difference(row: Mapping, column: str) -> str:
    """`difference (low to high)`, with a real minus sign; a table that predates the column says so."""
    if column not in row:
        return "not measured (a run before this comparison)"
    value, low, high = row[column], row[f"{column} {LOW}"], row[f"{column} {HIGH}"]
    return f"{_signed(value)} ({_signed(low)} to {_signed(high)})"


def _signed(value: float) -> str:
    return f"{value:.3f}".replace("-", "−")


VERDICT_HEADER = [
    "task, budget",
    "best fixed G",
    "C-GRPO minus it, calibration counted",
    "C-GRPO minus it, calibration excluded",
    "best other method minus it, calibration counted",
    "method to use",
    "detectable (80% power)",
]


def verdict_digest(folders: Mapping[str, Path]) -> str:
    """Per budgeted experiment (`{description: folder}`): the best fixed G and the prompts that chose it, C-GRPO's and
    the best other method's difference to it with calibration counted and excluded, the method to use, and the
    smallest difference the run detects with 80% power (the mean over the methods' paired differences); then the
    terms, one line each. A folder whose table predates a column (a run before the comparison measured it) says so."""
    rows = [_verdict_row(description, _comparison(folder)) for description, folder in folders.items()]
    return _table(VERDICT_HEADER, rows) + "\n\n" + VERDICT_TERMS


def _comparison(folder: Path) -> pd.DataFrame:
    return pd.read_csv(Path(folder) / "budget_comparison.csv")


def _verdict_row(description: str, table: pd.DataFrame) -> list[str]:
    """One budgeted experiment's cells of the verdict table (`table`, its `budget_comparison`), in `VERDICT_HEADER`'s
    order."""
    first = table.iloc[0]
    best = table[(table["method"] == "grpo") & (table["setting"] == first["best fixed G"])].iloc[0]
    cgrpo = _best_other(table, lambda m: m == "cgrpo")
    other = _best_other(table, lambda m: ~m.isin(["cgrpo", "grpo"]))
    beats = table[(table[f"{COUNTED} {LOW}"] > 0) & (table["method"] != "grpo")]
    use = f"GRPO {best['setting']}" if beats.empty else f"{beats.iloc[0]['label']} {beats.iloc[0]['setting']}"
    chosen_on = first.get("best fixed G chosen on", "eval prompts")
    return [
        f"{description}, {_number(first['budget'], 0)} rollouts",
        f"GRPO {best['setting']} (chosen on {chosen_on}): {_cell(best, 'accuracy at budget')}",
        "not run" if cgrpo is None else f"{_difference(cgrpo, COUNTED)}, {cgrpo['setting']}",
        "not run" if cgrpo is None else _difference(cgrpo, EXCLUDED),
        "not run" if other is None else f"{other['label']}: {_difference(other, COUNTED)}",
        use,
        f"±{_number(_detectable(table), 3)}",
    ]


def confounds_digest(before: Mapping[str, Path], after: Mapping[str, Path]) -> str:
    """The verdict's figures per budgeted experiment before the confounds' fixes and after them (`{description:
    folder}` each, the same descriptions): one row per figure, so that what the fixes moved reads across."""
    if before.keys() != after.keys():
        raise ValueError(f"the runs before and after the fixes name different experiments: {set(before) ^ set(after)}")
    rows = []
    for description in before:
        old = _verdict_row(description, _comparison(before[description]))
        new = _verdict_row(description, _comparison(after[description]))
        rows += [[old[0] if i == 1 else "", VERDICT_HEADER[i], old[i], new[i]] for i in range(1, len(VERDICT_HEADER))]
    return _table(["task, budget", "figure", "before the fixes", "after them"], rows)


def _detectable(table: pd.DataFrame) -> float:
    """The mean over the methods other than GRPO of the difference to the best fixed G detectable with 80% power:
    the table's column, or for a table that predates it the same 1.43 half-widths of its intervals."""
    rows = table[table["method"] != "grpo"]
    if f"{COUNTED} {DETECTABLE}" in table:
        return float(rows[f"{COUNTED} {DETECTABLE}"].mean())
    return float(detectable_difference(rows[f"{COUNTED} {LOW}"], rows[f"{COUNTED} {HIGH}"]).mean())


def lr_sweep_digest(folder: Path) -> str:
    """Each method and setting at each learning rate of a sweep, with its validation accuracy at the budget and
    whether its method's rate was chosen there (`lr_sweep.csv`)."""
    table = pd.read_csv(Path(folder) / "lr_sweep.csv")
    header = ["method", "setting", "learning rate", "validation accuracy at the budget", "method's mean", "chosen"]
    rows = [
        [
            row["label"],
            row["setting"],
            f"{row['learning rate']:.2g} (x{row['learning rate multiple']:g})",
            _cell(row, "validation accuracy at budget"),
            _number(row["method's mean over its settings"], 3),
            "yes" if row["chosen"] else "",
        ]
        for row in table.to_dict("records")
    ]
    return _table(header, rows)


def screen_digest(path: Path) -> str:
    """Per candidate mix of the difficulty screen: its shares of prompts and each rule's best saving."""
    table = pd.read_csv(path)
    rules = list(dict.fromkeys(table["rule"]))
    header = ["mix", "trivial", "hopeless", "mixed", "base accuracy", *(f"{rule} saving" for rule in rules)]
    rows = []
    for mix, group in table.groupby("mix", sort=False):
        first = group.iloc[0]
        best = group.groupby("rule")["saving"].max()
        shares = [_number(first[name], 2) for name in ("trivial", "hopeless", "mixed", "accuracy")]
        rows.append([mix, *shares, *(_number(best.get(rule, math.nan), 2) for rule in rules)])
    return _table(header, rows)


def frontier_digest(folder: Path) -> str:
    """Each method and setting of a training frontier (`frontier.csv`): its costs and sampled accuracy."""
    table = pd.read_csv(Path(folder) / "frontier.csv")
    header = ["method", "setting", "training rollouts per prompt", "calibration rollouts per prompt", "CPU time (s)"]
    header += ["sampled accuracy", "interval"]
    rows = [
        [
            row["label"],
            row["setting"],
            _cell(row, "training rollouts per prompt (calibration excluded)", 1),
            _number(row["calibration rollouts per prompt"], 1),
            _cell(row, "CPU time (s, training + calibration)", 1),
            _cell(row, "sampled accuracy (mean@k)"),
            row["interval"],
        ]
        for row in table.to_dict("records")
    ]
    return _table(header, rows)


def frontier_at_cgrpo_digest(folder: Path) -> str:
    """Every method's frontier at each C-GRPO setting's cost, minus C-GRPO (`frontier_at_cgrpo.csv`)."""
    table = pd.read_csv(Path(folder) / "frontier_at_cgrpo.csv")
    header = ["C-GRPO setting", "cost", "C-GRPO's cost", "C-GRPO's accuracy", "method", "its accuracy there"]
    header += ["difference", "in range"]
    rows = [
        [
            row["C-GRPO setting"],
            row["cost"],
            _number(row["C-GRPO cost"], 1),
            _number(row["C-GRPO sampled accuracy"], 3),
            row["label"],
            _number(row["sampled accuracy at C-GRPO's cost"], 3),
            _cell(row, "difference"),
            _number(row["resamples within range"], 2),
        ]
        for row in table.to_dict("records")
    ]
    return _table(header, rows)


def paired_digest(folder: Path) -> str:
    """C-GRPO minus each baseline, paired by seed (`paired.csv`): accuracies, rollouts and CPU time."""
    table = pd.read_csv(Path(folder) / "paired.csv")
    header = ["C-GRPO setting", "minus", "greedy accuracy", "sampled accuracy", "rollouts generated", "CPU time (s)"]
    cpu = "CPU time (s, training + calibration) difference"
    rows = [
        [
            row["C-GRPO setting"],
            row["baseline"],
            _cell(row, "greedy accuracy difference"),
            _cell(row, "sampled accuracy (mean@k) difference"),
            _cell(row, "rollouts generated difference", 0),
            _cell(row, cpu, 1) if cpu in row else "",
        ]
        for row in table.to_dict("records")
    ]
    return _table(header, rows)
