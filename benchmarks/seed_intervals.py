"""Rewrite a finished results folder's interval tables with the intervals of the current code, from its summary.

With 5 seeds or fewer, an accuracy's interval is Student's t over the seeds' means (paired for differences), not the
bootstrap over seeds and prompts that earlier code drew (`cgrpo.pipeline.analysis.comparison.FEW_SEEDS`). Those t
intervals need one value per run, which `summary.csv` holds, so the committed reference folders are brought up to date
without training again:

    python benchmarks/seed_intervals.py results/reference/long results/reference/with_dapo

For each folder, every interval table it holds among by_method, paired, over_base, frontier, frontier_at_cgrpo and
delta_sweep is written again (CSV and markdown) from `summary.csv` (and `conformal.csv` and `calibrations.csv` for
delta_sweep, which is left as it is where they are missing). The base model, a single run, has no seeds: its intervals are a bootstrap over its eval prompts, which
the summary does not hold, so its rows keep the values the pipeline wrote. A folder of more than 5 seeds is refused:
its bootstrap needs the eval records' per-prompt accuracies; run the pipeline's aggregate rule instead.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from cgrpo.pipeline.analysis.comparison import (
    BY_METHOD_METRICS,
    FEW_SEEDS,
    PAIRED_METRICS,
    PER_PROMPT_COLUMNS,
    Resampling,
    by_method_table,
    over_base_table,
    paired_table,
)
from cgrpo.pipeline.analysis.frontier import frontier_at_cgrpo, frontier_points
from cgrpo.pipeline.analysis.reporting import delta_sweep_table, write_table


def read_summary(folder: Path) -> pd.DataFrame:
    summary = pd.read_csv(folder / "summary.csv", keep_default_na=True)
    summary["compute_matched"] = summary["compute_matched"].map(
        {True: True, False: False, "True": True, "False": False}
    )
    # Seeds as integers for the trained runs (the base model has none), as the pipeline's summary holds them.
    summary["seed"] = summary["seed"].astype("Int64").astype(object).where(summary["seed"].notna(), None)
    return summary


def matched_records(summary: pd.DataFrame) -> list[dict]:
    """The compute-matching records the paired table needs: every compute-matched group size, matched to the one
    C-GRPO setting a reference folder holds."""
    cgrpo = summary.loc[summary["method"] == "cgrpo", "setting"].unique()
    matched = summary[summary["compute_matched"].fillna(False).astype(bool)]
    if matched.empty:
        return []
    if len(cgrpo) != 1:
        raise ValueError("compute-matched runs beside several C-GRPO settings: their matching records are needed.")
    return [{"setting": cgrpo[0], "num_generations": int(g)} for g in matched["num_generations"].unique()]


def keep_base_rows(new: pd.DataFrame, old: pd.DataFrame) -> pd.DataFrame:
    """`new` with the base model's row as the pipeline wrote it (its intervals need the eval prompts)."""
    base = old[old["method"] == "base"]
    if base.empty:
        return new
    new = new.copy()
    index = new.index[new["method"] == "base"]
    for column in base.columns.intersection(new.columns):
        new.loc[index, column] = base[column].to_numpy()
    return new


def rewrite(folder: Path, resamples: int, seed: int) -> list[str]:
    summary = read_summary(folder)
    seeds = summary.groupby(["method", "setting"])["seed"].count().max()
    if seeds > FEW_SEEDS:
        raise SystemExit(f"{folder} has {seeds} seeds, more than {FEW_SEEDS}: rerun its aggregate rule instead.")
    per_prompt = {
        row["run"]: {column: [row[column]] for column in PER_PROMPT_COLUMNS if pd.notna(row.get(column))}
        for _, row in summary.iterrows()
    }
    resampling = Resampling(per_prompt, resamples, seed)
    # A folder written by earlier code may lack a metric measured since (CPU time): its tables leave it out.
    by_method = {column: name for column, name in BY_METHOD_METRICS.items() if column in summary}
    paired = {column: name for column, name in PAIRED_METRICS.items() if column in summary}
    builders = {
        "by_method": lambda: keep_base_rows(
            by_method_table(summary, resampling, by_method), pd.read_csv(folder / "by_method.csv")
        ),
        "paired": lambda: paired_table(summary, resampling, matched_records(summary), paired),
        "over_base": lambda: over_base_table(summary, resampling),
        "frontier": lambda: frontier_points(summary, resampling),
        "frontier_at_cgrpo": lambda: frontier_at_cgrpo(summary, resampling),
        "delta_sweep": lambda: delta_sweep_table(
            summary, pd.read_csv(folder / "conformal.csv"), pd.read_csv(folder / "calibrations.csv"), resampling
        ),
    }
    # delta_sweep reads each run's eval coverage and chosen delta, in conformal.csv and calibrations.csv.
    needs = {"delta_sweep": ("conformal.csv", "calibrations.csv")}
    written = []
    for name, build in builders.items():
        inputs = [folder / f"{name}.csv", *(folder / extra for extra in needs.get(name, ()))]
        if all(path.is_file() for path in inputs):
            write_table(build(), folder / f"{name}.csv", folder / f"{name}.md")
            written.append(name)
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folders", nargs="+", type=Path, help="results folders holding summary.csv")
    parser.add_argument("--resamples", type=int, default=2000, help="statistics.bootstrap_resamples of the config")
    parser.add_argument("--seed", type=int, default=0, help="statistics.seed of the config")
    args = parser.parse_args()
    for folder in args.folders:
        print(f"{folder}: rewrote {', '.join(rewrite(folder, args.resamples, args.seed))}")


if __name__ == "__main__":
    main()
