"""Every job's wall-clock and CPU seconds of a finished results folder, from Snakemake's benchmark files:

    python benchmarks/job_times.py results/budget results/reference/budget/job_times.csv

writes one row per job (`job`, `wall_s`, `cpu_s`, `mean_cpu_percent`, as Snakemake's `s`, `cpu_time` and
`mean_load` read) and prints the totals by rule.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd


def job_times(results: Path) -> pd.DataFrame:
    rows = []
    for path in sorted(results.glob("benchmarks/**/*.tsv")):
        benchmark = pd.read_csv(path, sep="\t").iloc[0]
        job = str(path.relative_to(results / "benchmarks").with_suffix(""))
        rows.append({"job": job, "wall_s": benchmark["s"], "cpu_s": benchmark["cpu_time"]})
        rows[-1]["mean_cpu_percent"] = benchmark["mean_load"]
    return pd.DataFrame(rows, columns=["job", "wall_s", "cpu_s", "mean_cpu_percent"])


if __name__ == "__main__":
    table = job_times(Path(sys.argv[1]))
    table.to_csv(sys.argv[2], index=False)
    rules = table.assign(rule=table["job"].str.split("/").str[0]).groupby("rule")[["wall_s", "cpu_s"]].sum()
    print(
        rules.round(1).to_string(), f"\ntotal: {table['wall_s'].sum():.0f} s of jobs, {table['cpu_s'].sum():.0f} CPU s"
    )
