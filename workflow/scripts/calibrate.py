"""Fit the initial policy's conformal thresholds for one budget grid (rule calibrate)."""

from pathlib import Path

from cgrpo.pipeline.configuration.plugins import import_plugins
from cgrpo.pipeline.jobs.runs import calibrate_initial
from cgrpo.pipeline.jobs.vllm_backend import prepare_vllm_job
from cgrpo.pipeline.logs import log_to_file

log_to_file(snakemake.log[0], threads=snakemake.threads)
prepare_vllm_job(snakemake.params.spec)
# Each job is a fresh process: the tasks and stopping rules the config's plugins register must be imported again.
import_plugins(snakemake.config["plugins"])

calibrate_initial(snakemake.params.spec, Path(snakemake.output.thresholds).parent)
