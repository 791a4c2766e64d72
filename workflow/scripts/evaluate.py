"""Evaluate one trained model, or the base model, on the eval split (rule evaluate)."""

from cgrpo.pipeline.evaluation import evaluate_model
from cgrpo.pipeline.logs import log_to_file
from cgrpo.pipeline.vllm_backend import prepare_vllm_job

log_to_file(snakemake.log[0], threads=snakemake.threads)
prepare_vllm_job(snakemake.params.spec)

evaluate_model(snakemake.params.spec, snakemake.output[0])
