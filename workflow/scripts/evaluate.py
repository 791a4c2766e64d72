"""Evaluate one trained model, or the base model, on the eval split (rule evaluate)."""

from cgrpo.evaluation import evaluate_model
from cgrpo.logs import log_to_file

log_to_file(snakemake.log[0], threads=snakemake.threads)

evaluate_model(snakemake.params.spec, snakemake.output[0])
