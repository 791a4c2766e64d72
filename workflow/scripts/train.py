"""Train one run of any method (rules train_cgrpo and train)."""

from cgrpo.pipeline.interrupts import report_interrupts

# First, before the imports below (torch's takes seconds): Ctrl-C ends the job with one line, not a traceback.
report_interrupts(snakemake)

import os

from cgrpo.pipeline.jobs.devices import claim_devices, log_claim

# Before the imports below, any of which may initialize CUDA, which reads CUDA_VISIBLE_DEVICES once: this job's own GPU
# where the run hands them out (cgrpo.pipeline.jobs.devices).
os.environ.update(claim_devices(snakemake.resources.get("gpu", 0)))

from pathlib import Path

from cgrpo.pipeline.configuration.plugins import import_plugins
from cgrpo.pipeline.jobs.runs import train_run
from cgrpo.pipeline.jobs.vllm_backend import prepare_vllm_job
from cgrpo.pipeline.logs import log_to_file

log_to_file(snakemake.log[0], threads=snakemake.threads)
log_claim()
prepare_vllm_job(snakemake.params.spec)
# Each job is a fresh process: the tasks and stopping rules the config's plugins register must be imported again.
import_plugins(snakemake.config["plugins"])

train_run(snakemake.params.spec, Path(snakemake.output.run).parent)
