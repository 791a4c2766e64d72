"""Draw the report figures from the aggregated tables (rule plots)."""

from cgrpo.pipeline.interrupts import report_interrupts

# First, before the imports below (torch's takes seconds): Ctrl-C ends the job with one line, not a traceback.
report_interrupts(snakemake)

import pandas as pd

from cgrpo.pipeline.analysis.plots import plot_all
from cgrpo.pipeline.configuration.plugins import import_plugins
from cgrpo.pipeline.logs import log_to_file

log_to_file(snakemake.log[0])
# Each job is a fresh process: the tasks and stopping rules the config's plugins register must be imported again.
import_plugins(snakemake.config["plugins"])

tables = {name: pd.read_csv(path) for name, path in snakemake.input.items()}
plot_all(tables, dict(snakemake.output.items()))
