"""Train one run of any method (rules train_cgrpo and train)."""

from pathlib import Path

from cgrpo.pipeline.logs import log_to_file
from cgrpo.pipeline.runs import train_run
from cgrpo.pipeline.vllm_backend import prepare_vllm_job

log_to_file(snakemake.log[0], threads=snakemake.threads)
prepare_vllm_job(snakemake.params.spec)

train_run(snakemake.params.spec, Path(snakemake.output.run).parent)
