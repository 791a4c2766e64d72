from snakemake.utils import min_version

min_version("9.0")


configfile: "config/config.yaml"


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/model.smk"
include: "workflow/rules/splits.smk"
include: "workflow/rules/format_rate.smk"
include: "workflow/rules/calibration.smk"
include: "workflow/rules/training.smk"
include: "workflow/rules/evaluation.smk"
include: "workflow/rules/replay.smk"
include: "workflow/rules/curves.smk"
include: "workflow/rules/report.smk"


rule all:
    input:
        final_outputs(),
