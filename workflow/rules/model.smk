rule base_model:
    input:
        spec=spec_file("results/{exp}/specs/base_model.json", base_model_params),
    output:
        record="results/{exp}/base_model/source.json",
    log:
        "results/{exp}/logs/base_model.log",
    benchmark:
        "results/{exp}/benchmarks/base_model.tsv"
    conda:
        "../envs/cgrpo.yaml"
    # Nothing else can run before the base model exists, so it takes both cores of the default machine
    # (Snakemake lowers it to --cores when fewer are given).
    threads: 2
    resources:
        mem_mb=4000,
        runtime=120,
    params:
        settings=base_model_params,
    script:
        "../scripts/base_model.py"
