"""Sample every milestone model of one run, or the base model, on the eval split (rule curve)."""

from cgrpo.pipeline.configuration.plugins import import_plugins
from cgrpo.pipeline.jobs.curves import evaluate_curve
from cgrpo.pipeline.logs import log_to_file

log_to_file(snakemake.log[0], threads=snakemake.threads)
# Each job is a fresh process: the tasks and stopping rules the config's plugins register must be imported again.
import_plugins(snakemake.config["plugins"])

evaluate_curve(snakemake.params.spec, snakemake.output[0])
