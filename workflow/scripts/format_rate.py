"""Measure the prompt's format rate on the base model, before training (rule format_rate)."""

from cgrpo.pipeline.configuration.plugins import import_plugins
from cgrpo.pipeline.jobs.format_rate import measure_format_rate
from cgrpo.pipeline.jobs.vllm_backend import prepare_vllm_job
from cgrpo.pipeline.logs import log_to_file

log_to_file(snakemake.log[0], threads=snakemake.threads)
prepare_vllm_job(snakemake.params.spec)
# Each job is a fresh process: the tasks and stopping rules the config's plugins register must be imported again.
import_plugins(snakemake.config["plugins"])

measure_format_rate(snakemake.params.spec, snakemake.output.table, snakemake.output.table_md)
