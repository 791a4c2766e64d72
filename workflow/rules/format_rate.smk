rule format_rate:
    input:
        base_model=base_model_record,
        splits="results/{exp}/splits/manifest.json",
        spec=spec_file("results/{exp}/specs/format_rate.json", format_rate_spec),
    output:
        table=report(
            "results/{exp}/tables/format_rate.csv",
            caption="../report/format_rate.rst",
            category="Base model",
            labels={"table": "format rate"},
        ),
        table_md="results/{exp}/tables/format_rate.md",
    log:
        "results/{exp}/logs/format_rate.log",
    benchmark:
        "results/{exp}/benchmarks/format_rate.tsv"
    # Seconds of sampling that a user wants to read before the training jobs start.
    priority: 3
    conda:
        "../envs/cgrpo.yaml"
    threads: 1
    resources:
        mem_mb=4000,
        runtime=30,
    params:
        spec=format_rate_spec,
    script:
        "../scripts/format_rate.py"
