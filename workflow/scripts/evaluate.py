"""Evaluate one trained model, or the base model, on the eval split (rule evaluate)."""

from cgrpo.pipeline.evaluation import evaluate_model
from cgrpo.pipeline.logs import log_to_file

log_to_file(snakemake.log[0], threads=snakemake.threads)

evaluate_model(snakemake.params.spec, snakemake.output[0])
