rule calibrate:
    input:
        base_model=base_model_record,
        splits="results/{exp}/splits/manifest.json",
        spec=spec_file("results/{exp}/specs/calibrate/{grid}/s{calseed}.json", calibrate_spec),
    output:
        thresholds="results/{exp}/calibration/{grid}/s{calseed}/thresholds.json",
        table=report(
            "results/{exp}/calibration/{grid}/s{calseed}/thresholds.csv",
            caption="../report/initial_thresholds.rst",
            category="Calibration",
            labels={"budget grid": "{grid}", "seed": "{calseed}"},
        ),
    log:
        "results/{exp}/logs/calibrate/{grid}/s{calseed}.log",
    benchmark:
        "results/{exp}/benchmarks/calibrate/{grid}/s{calseed}.tsv"
    # C-GRPO runs gate the compute-matched baselines, so their chain goes first.
    priority: 2
    conda:
        "../envs/cgrpo.yaml"
    threads: 1
    resources:
        mem_mb=8000,
        runtime=120,
    params:
        spec=calibrate_spec,
    script:
        "../scripts/calibrate.py"
