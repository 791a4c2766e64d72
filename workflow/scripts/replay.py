"""Replay every registered stopping rule on the evaluated models' samples (rule replay)."""

from cgrpo.pipeline.interrupts import report_interrupts

# First, before the imports below (torch's takes seconds): Ctrl-C ends the job with one line, not a traceback.
report_interrupts(snakemake)

from cgrpo.pipeline.analysis.replay import run_replay
from cgrpo.pipeline.logs import log_to_file

log_to_file(snakemake.log[0])
run_replay(snakemake.params.spec, dict(snakemake.output.items()))
