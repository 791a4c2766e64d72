"""The learning-curve tables and figure of a budgeted experiment (rule learning_curves)."""

from cgrpo.pipeline.interrupts import report_interrupts

# First, before the imports below (torch's takes seconds): Ctrl-C ends the job with one line, not a traceback.
report_interrupts(snakemake)

from cgrpo.pipeline.analysis.curves import write_budget_outputs
from cgrpo.pipeline.logs import log_to_file

log_to_file(snakemake.log[0])

write_budget_outputs(
    snakemake.input.runs, snakemake.input.curves, snakemake.params.spec, dict(snakemake.output.items())
)
