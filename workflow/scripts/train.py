"""Train one run of any method (rules train_cgrpo and train)."""

from pathlib import Path

from cgrpo.pipeline.configuration.plugins import import_plugins
from cgrpo.pipeline.jobs.runs import train_run
from cgrpo.pipeline.jobs.vllm_backend import prepare_vllm_job
from cgrpo.pipeline.logs import log_to_file

log_to_file(snakemake.log[0], threads=snakemake.threads)
prepare_vllm_job(snakemake.params.spec)
# Each job is a fresh process: the tasks and stopping rules the config's plugins register must be imported again.
import_plugins(snakemake.config["plugins"])

train_run(snakemake.params.spec, Path(snakemake.output.run).parent)
