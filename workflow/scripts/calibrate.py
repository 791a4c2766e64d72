"""Fit the initial policy's conformal thresholds for one budget grid (rule calibrate)."""

from pathlib import Path

from cgrpo.pipeline.logs import log_to_file
from cgrpo.pipeline.runs import calibrate_initial

log_to_file(snakemake.log[0], threads=snakemake.threads)

calibrate_initial(snakemake.params.spec, Path(snakemake.output.thresholds).parent)
