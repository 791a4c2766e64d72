# Learning curves at an equal rollout budget (config `budget`, cgrpo.pipeline.analysis.curves): every milestone model
# of every run sampled on the eval prompts, then the tables and the figure that compare the methods along the budget.


rule curve:
    input:
        unpack(curve_inputs),
    output:
        "results/{exp}/curves/{run}.json",
    log:
        "results/{exp}/logs/curve/{run}.log",
    benchmark:
        "results/{exp}/benchmarks/curve/{run}.tsv"
    conda:
        "../envs/cgrpo.yaml"
    threads: 1
    resources:
        mem_mb=8000,
        runtime=240,
    params:
        spec=curve_job_spec,
    script:
        "../scripts/curve.py"


rule learning_curves:
    input:
        runs=run_files("run.json"),
        curves=curve_files,
        spec=spec_file("results/{exp}/specs/learning_curves.json", learning_curves_spec),
    output:
        learning_curve=report(
            "results/{exp}/tables/learning_curve.csv",
            caption="../report/learning_curve.rst",
            category="Learning curves",
            labels={"table": "learning curve"},
        ),
        learning_curve_md="results/{exp}/tables/learning_curve.md",
        budget_comparison=report(
            "results/{exp}/tables/budget_comparison.csv",
            caption="../report/budget_comparison.rst",
            category="Learning curves",
            labels={"table": "comparison at an equal budget"},
        ),
        budget_comparison_md="results/{exp}/tables/budget_comparison.md",
        budget_curve=report(
            "results/{exp}/tables/budget_curve.csv",
            caption="../report/budget_curve.rst",
            category="Learning curves",
            labels={"table": "mean curves and paired differences"},
        ),
        budget_curve_md="results/{exp}/tables/budget_curve.md",
        budget_calibrations=report(
            "results/{exp}/tables/budget_calibrations.csv",
            caption="../report/budget_calibrations.rst",
            category="Learning curves",
            labels={"table": "calibrations"},
        ),
        budget_calibrations_md="results/{exp}/tables/budget_calibrations.md",
        budget_mechanisms=report(
            "results/{exp}/tables/budget_mechanisms.csv",
            caption="../report/budget_mechanisms.rst",
            category="Learning curves",
            labels={"table": "mechanisms"},
        ),
        budget_mechanisms_md="results/{exp}/tables/budget_mechanisms.md",
        lr_sweep=report(
            "results/{exp}/tables/lr_sweep.csv",
            caption="../report/lr_sweep.rst",
            category="Learning curves",
            labels={"table": "learning-rate sweep"},
        ),
        lr_sweep_md="results/{exp}/tables/lr_sweep.md",
        plot=report(
            "results/{exp}/plots/learning_curves.png",
            caption="../report/learning_curves.rst",
            category="Learning curves",
            labels={"figure": "learning curves"},
        ),
    log:
        "results/{exp}/logs/learning_curves.log",
    benchmark:
        "results/{exp}/benchmarks/learning_curves.tsv"
    conda:
        "../envs/cgrpo.yaml"
    threads: 1
    resources:
        mem_mb=4000,
        runtime=30,
    params:
        spec=learning_curves_spec,
    script:
        "../scripts/learning_curves.py"
