"""Carve disjoint train, calibration and eval splits of the task's data (rule split)."""

from cgrpo.pipeline.interrupts import report_interrupts

# First, before the imports below (torch's takes seconds): Ctrl-C ends the job with one line, not a traceback.
report_interrupts(snakemake)

from pathlib import Path

from cgrpo.pipeline.configuration.checks import needed_splits
from cgrpo.pipeline.configuration.plugins import import_plugins
from cgrpo.pipeline.logs import log_to_file
from cgrpo.pipeline.tasks import get_task
from cgrpo.pipeline.tasks.files import hub_offline
from cgrpo.pipeline.tasks.splits import make_splits

log_to_file(snakemake.log[0])
# Each job is a fresh process: the tasks and stopping rules the config's plugins register must be imported again.
import_plugins(snakemake.config["plugins"])

params = snakemake.params.split
task = get_task(params["task"]["name"], **params["task"]["options"])
if task.source is not None:
    # Planning skipped the hub lookup (the planning machine need not be this one); this is the first job to read.
    task.source.check(needed_splits(params["eval_source_split"]), offline=hub_offline())
eval_pool = task.load(params["eval_source_split"]) if params["eval_source_split"] else None
make_splits(
    task.load("train"),
    Path(snakemake.output.manifest).parent,
    sizes=params["sizes"],
    seed=params["seed"],
    eval_pool=eval_pool,
    drop_overlap=params["drop_overlap"],
    dedupe=params.get("dedupe", "text"),
)
