rule replay:
    input:
        records=replay_records,
        spec=spec_file("results/{exp}/specs/replay.json", replay_spec),
    output:
        table=report(
            "results/{exp}/tables/replay.csv",
            caption="../report/replay_table.rst",
            category="Replay frontier",
            labels={"table": "replay"},
        ),
        table_md="results/{exp}/tables/replay.md",
        at_cgrpo=report(
            "results/{exp}/tables/replay_at_cgrpo.csv",
            caption="../report/replay_at_cgrpo.rst",
            category="Replay frontier",
            labels={"table": "replay at C-GRPO's rollouts"},
        ),
        at_cgrpo_md="results/{exp}/tables/replay_at_cgrpo.md",
        plot=report(
            "results/{exp}/plots/replay.png",
            caption="../report/replay.rst",
            category="Replay frontier",
            labels={"figure": "replay frontier"},
        ),
    log:
        "results/{exp}/logs/replay.log",
    benchmark:
        "results/{exp}/benchmarks/replay.tsv"
    conda:
        "../envs/cgrpo.yaml"
    threads: 1
    resources:
        mem_mb=2000,
        runtime=30,
    params:
        spec=replay_spec,
    script:
        "../scripts/replay.py"
