"""Copy a fixed-G GRPO run as the compute-matched run of the same group size (rule reuse_grpo_run)."""

from cgrpo.pipeline.interrupts import report_interrupts

# First, before the imports below (torch's takes seconds): Ctrl-C ends the job with one line, not a traceback.
report_interrupts(snakemake)

from pathlib import Path

from cgrpo.pipeline.jobs.runs import reuse_compute_matched
from cgrpo.pipeline.logs import log_to_file

log_to_file(snakemake.log[0])

reuse_compute_matched(Path(snakemake.input.run).parent, Path(snakemake.output.run).parent)
