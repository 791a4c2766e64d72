"""Fit the initial policy's conformal thresholds for one budget grid (rule calibrate)."""

from pathlib import Path

from cgrpo.pipeline.logs import log_to_file
from cgrpo.pipeline.runs import calibrate_initial
from cgrpo.pipeline.vllm_backend import prepare_vllm_job

log_to_file(snakemake.log[0], threads=snakemake.threads)
prepare_vllm_job(snakemake.params.spec)

calibrate_initial(snakemake.params.spec, Path(snakemake.output.thresholds).parent)
