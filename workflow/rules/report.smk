rule aggregate:
    input:
        runs=run_files("run.json"),
        matched_runs=run_files("run.json", matched=True),
        steps=run_files("steps.csv"),
        matched_steps=run_files("steps.csv", matched=True),
        evals=evaluation_files(),
        matched_evals=evaluation_files(matched=True),
        matched=matched_setting_files,
        spec=spec_file("results/{exp}/specs/aggregate.json", statistics_spec),
    output:
        summary=report(
            "results/{exp}/tables/summary.csv",
            caption="../report/summary.rst",
            category="Tables",
            labels={"table": "summary"},
        ),
        summary_md="results/{exp}/tables/summary.md",
        by_method=report(
            "results/{exp}/tables/by_method.csv",
            caption="../report/by_method.rst",
            category="Tables",
            labels={"table": "by method"},
        ),
        by_method_md="results/{exp}/tables/by_method.md",
        paired=report(
            "results/{exp}/tables/paired.csv",
            caption="../report/paired.rst",
            category="Tables",
            labels={"table": "paired"},
        ),
        paired_md="results/{exp}/tables/paired.md",
        over_base=report(
            "results/{exp}/tables/over_base.csv",
            caption="../report/over_base.rst",
            category="Tables",
            labels={"table": "gain over the base model"},
        ),
        over_base_md="results/{exp}/tables/over_base.md",
        coverage=report(
            "results/{exp}/tables/coverage.csv",
            caption="../report/coverage_table.rst",
            category="Tables",
            labels={"table": "coverage"},
        ),
        coverage_md="results/{exp}/tables/coverage.md",
        coverage_splits=report(
            "results/{exp}/tables/coverage_splits.csv",
            caption="../report/coverage_splits.rst",
            category="Tables",
            labels={"table": "coverage over re-splits"},
        ),
        coverage_splits_md="results/{exp}/tables/coverage_splits.md",
        conformal=report(
            "results/{exp}/tables/conformal.csv",
            caption="../report/conformal.rst",
            category="Tables",
            labels={"table": "conformal"},
        ),
        conformal_md="results/{exp}/tables/conformal.md",
        delta_sweep=in_report(
            several_deltas(),
            "results/{exp}/tables/delta_sweep.csv",
            caption="../report/delta_sweep_table.rst",
            category="Tables",
            labels={"table": "delta sweep"},
        ),
        delta_sweep_md="results/{exp}/tables/delta_sweep.md",
        frontier=report(
            "results/{exp}/tables/frontier.csv",
            caption="../report/frontier_table.rst",
            category="Tables",
            labels={"table": "training frontier"},
        ),
        frontier_md="results/{exp}/tables/frontier.md",
        frontier_at_cgrpo=report(
            "results/{exp}/tables/frontier_at_cgrpo.csv",
            caption="../report/frontier_at_cgrpo.rst",
            category="Tables",
            labels={"table": "training frontier at C-GRPO's cost"},
        ),
        frontier_at_cgrpo_md="results/{exp}/tables/frontier_at_cgrpo.md",
        steps="results/{exp}/tables/steps.csv",
        calibrations="results/{exp}/tables/calibrations.csv",
    log:
        "results/{exp}/logs/aggregate.log",
    benchmark:
        "results/{exp}/benchmarks/aggregate.tsv"
    conda:
        "../envs/cgrpo.yaml"
    threads: 1
    resources:
        mem_mb=2000,
        runtime=10,
    params:
        statistics=config["statistics"],
    script:
        "../scripts/aggregate.py"


rule plots:
    input:
        summary="results/{exp}/tables/summary.csv",
        steps="results/{exp}/tables/steps.csv",
        calibrations="results/{exp}/tables/calibrations.csv",
        coverage="results/{exp}/tables/coverage.csv",
        delta_sweep="results/{exp}/tables/delta_sweep.csv",
        by_method="results/{exp}/tables/by_method.csv",
        frontier="results/{exp}/tables/frontier.csv",
    output:
        pareto=report(
            "results/{exp}/plots/pareto.png",
            caption="../report/pareto.rst",
            category="Plots",
            labels={"figure": "accuracy vs rollouts"},
        ),
        training_curves=report(
            "results/{exp}/plots/training_curves.png",
            caption="../report/training_curves.rst",
            category="Plots",
            labels={"figure": "training curves"},
        ),
        thresholds=report(
            "results/{exp}/plots/thresholds.png",
            caption="../report/thresholds.rst",
            category="Plots",
            labels={"figure": "conformal thresholds"},
        ),
        coverage=report(
            "results/{exp}/plots/coverage.png",
            caption="../report/coverage.rst",
            category="Plots",
            labels={"figure": "coverage"},
        ),
        delta_sweep=in_report(
            several_deltas(),
            "results/{exp}/plots/delta_sweep.png",
            caption="../report/delta_sweep.rst",
            category="Plots",
            labels={"figure": "C-GRPO against delta"},
        ),
        frontier=report(
            "results/{exp}/plots/frontier.png",
            caption="../report/frontier.rst",
            category="Plots",
            labels={"figure": "training frontier"},
        ),
    log:
        "results/{exp}/logs/plots.log",
    benchmark:
        "results/{exp}/benchmarks/plots.tsv"
    conda:
        "../envs/cgrpo.yaml"
    threads: 1
    resources:
        mem_mb=2000,
        runtime=10,
    script:
        "../scripts/plots.py"
