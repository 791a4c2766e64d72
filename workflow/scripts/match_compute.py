"""Find the fixed group size matching one C-GRPO setting's generated rollouts (checkpoint match_compute)."""

from cgrpo.pipeline.interrupts import report_interrupts

# First, before the imports below (torch's takes seconds): Ctrl-C ends the job with one line, not a traceback.
report_interrupts(snakemake)

import json
import logging
from pathlib import Path

from cgrpo.pipeline.analysis.matching import match_group_size
from cgrpo.pipeline.logs import log_to_file

log_to_file(snakemake.log[0])

matched = match_group_size(snakemake.input.runs)
logging.getLogger("cgrpo.pipeline").info("compute-matched group size: %s", matched)
Path(snakemake.output.matched).write_text(json.dumps(matched, indent=1) + "\n")
