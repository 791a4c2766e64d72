rule train_cgrpo:
    input:
        base_model=base_model_record,
        splits="results/{exp}/splits/manifest.json",
        calibration=initial_calibration,
        spec=spec_file("results/{exp}/specs/train/{run}.json", train_spec),
    output:
        run="results/{exp}/runs/{run}/run.json",
        steps="results/{exp}/runs/{run}/steps.csv",
        model=directory("results/{exp}/runs/{run}/model"),
    wildcard_constraints:
        run=methods.run_pattern(calibrated=True),
    log:
        "results/{exp}/logs/train/{run}.log",
    benchmark:
        "results/{exp}/benchmarks/train/{run}.tsv"
    # C-GRPO runs gate the compute-matched baselines, so their chain goes first.
    priority: 2
    conda:
        "../envs/cgrpo.yaml"
    threads: 1
    resources:
        mem_mb=8000,
        runtime=480,
    params:
        spec=train_spec,
    script:
        "../scripts/train.py"


# Every method without an initial calibration (cgrpo.pipeline.configuration.methods): GRPO, DAPO, ...
rule train:
    input:
        base_model=base_model_record,
        splits="results/{exp}/splits/manifest.json",
        spec=spec_file("results/{exp}/specs/train/{run}.json", train_spec),
    output:
        run="results/{exp}/runs/{run}/run.json",
        steps="results/{exp}/runs/{run}/steps.csv",
        model=directory("results/{exp}/runs/{run}/model"),
    wildcard_constraints:
        run=methods.run_pattern(calibrated=False),
    log:
        "results/{exp}/logs/train/{run}.log",
    benchmark:
        "results/{exp}/benchmarks/train/{run}.tsv"
    # Training before evaluation keeps the cores busy with what later jobs wait for.
    priority: 1
    conda:
        "../envs/cgrpo.yaml"
    threads: 1
    resources:
        mem_mb=8000,
        runtime=480,
    params:
        spec=train_spec,
    script:
        "../scripts/train.py"


checkpoint match_compute:
    input:
        runs=cgrpo_setting_records,
    output:
        matched="results/{exp}/matched/g{grid}_d{delta}_r{recal}.json",
    log:
        "results/{exp}/logs/match_compute/g{grid}_d{delta}_r{recal}.log",
    benchmark:
        "results/{exp}/benchmarks/match_compute/g{grid}_d{delta}_r{recal}.tsv"
    # C-GRPO runs gate the compute-matched baselines, so their chain goes first.
    priority: 2
    conda:
        "../envs/cgrpo.yaml"
    threads: 1
    resources:
        mem_mb=1000,
        runtime=10,
    script:
        "../scripts/match_compute.py"


# A compute-matched group size equal to a configured fixed G would train the same deterministic run
# again; the finished fixed-G run is copied instead.
rule reuse_grpo_run:
    input:
        run="results/{exp}/runs/grpo_s{seed}_G{G}/run.json",
        steps="results/{exp}/runs/grpo_s{seed}_G{G}/steps.csv",
        model="results/{exp}/runs/grpo_s{seed}_G{G}/model",
    output:
        run="results/{exp}/runs/grpo_s{seed}_G{G}_matched/run.json",
        steps="results/{exp}/runs/grpo_s{seed}_G{G}_matched/steps.csv",
        model=directory("results/{exp}/runs/grpo_s{seed}_G{G}_matched/model"),
    wildcard_constraints:
        seed=r"\d+",
        G=fixed_group_sizes_pattern(),
    log:
        "results/{exp}/logs/train/grpo_s{seed}_G{G}_matched.log",
    conda:
        "../envs/cgrpo.yaml"
    threads: 1
    resources:
        mem_mb=1000,
        runtime=10,
    script:
        "../scripts/reuse_run.py"


ruleorder: reuse_grpo_run > train
