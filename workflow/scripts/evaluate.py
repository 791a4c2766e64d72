"""Evaluate one trained model, or the base model, on the eval split (rule evaluate)."""

from cgrpo.pipeline.configuration.plugins import import_plugins
from cgrpo.pipeline.jobs.evaluation import evaluate_model
from cgrpo.pipeline.jobs.vllm_backend import prepare_vllm_job
from cgrpo.pipeline.logs import log_to_file

log_to_file(snakemake.log[0], threads=snakemake.threads)
prepare_vllm_job(snakemake.params.spec)
# Each job is a fresh process: the tasks and stopping rules the config's plugins register must be imported again.
import_plugins(snakemake.config["plugins"])

evaluate_model(snakemake.params.spec, snakemake.output[0])
