rule evaluate:
    input:
        unpack(evaluation_inputs),
    output:
        "results/{exp}/eval/{run}.json",
    log:
        "results/{exp}/logs/evaluate/{run}.log",
    benchmark:
        "results/{exp}/benchmarks/evaluate/{run}.tsv"
    conda:
        "../envs/cgrpo.yaml"
    threads: 1
    resources:
        mem_mb=8000,
        runtime=240,
    params:
        spec=evaluate_spec,
    script:
        "../scripts/evaluate.py"
