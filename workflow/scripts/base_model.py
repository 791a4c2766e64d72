"""Bootstrap the tiny base model, or only record the configured hub id or path (rule base_model)."""

from cgrpo.pipeline.interrupts import report_interrupts

# First, before the imports below (torch's takes seconds): Ctrl-C ends the job with one line, not a traceback.
report_interrupts(snakemake)

import json
from pathlib import Path

from cgrpo.pipeline.configuration.specs import check_model_source
from cgrpo.pipeline.jobs.base_model import bootstrap_base_model
from cgrpo.pipeline.logs import log_to_file

# The bootstrap is deterministic for a given thread count, so pin it to the job's threads.
log_to_file(snakemake.log[0], threads=snakemake.threads)

settings = snakemake.params.settings
record = Path(snakemake.output.record)
if settings["bootstrap"]:
    bootstrap_base_model(record.parent, verbose=True, **settings["options"])
else:
    # Before any job loads it: a missing folder, or a hub id that cannot be downloaded, is one clear error here.
    check_model_source(settings["path"])
record.write_text(json.dumps(settings, indent=1) + "\n")
