rule split:
    input:
        spec=spec_file("results/{exp}/specs/split.json", split_params),
    output:
        train="results/{exp}/splits/train.jsonl",
        calibration="results/{exp}/splits/calibration.jsonl",
        eval="results/{exp}/splits/eval.jsonl",
        manifest="results/{exp}/splits/manifest.json",
    log:
        "results/{exp}/logs/split.log",
    benchmark:
        "results/{exp}/benchmarks/split.tsv"
    conda:
        "../envs/cgrpo.yaml"
    threads: 1
    resources:
        mem_mb=2000,
        runtime=30,
    params:
        split=split_params,
    script:
        "../scripts/split.py"
