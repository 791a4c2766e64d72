"""Build the comparison tables from every run, eval and compute-matching record (rule aggregate)."""

from cgrpo.pipeline.interrupts import report_interrupts

# First, before the imports below (torch's takes seconds): Ctrl-C ends the job with one line, not a traceback.
report_interrupts(snakemake)

from cgrpo.pipeline.analysis.reporting import build_tables, write_table
from cgrpo.pipeline.configuration.plugins import import_plugins
from cgrpo.pipeline.logs import log_to_file

log_to_file(snakemake.log[0])
# Each job is a fresh process: the tasks and stopping rules the config's plugins register must be imported again.
import_plugins(snakemake.config["plugins"])

tables = build_tables(
    runs=[*snakemake.input.runs, *snakemake.input.matched_runs],
    steps=[*snakemake.input.steps, *snakemake.input.matched_steps],
    evals=[*snakemake.input.evals, *snakemake.input.matched_evals],
    matched=snakemake.input.matched,
    resamples=snakemake.params.statistics["bootstrap_resamples"],
    seed=snakemake.params.statistics["seed"],
)
for name, table in tables.items():
    write_table(table, snakemake.output[name], snakemake.output.get(f"{name}_md"))
