"""The experiment pipeline built on the C-GRPO trainer, in rooms by job, each importing only the rooms before it:

- `sandbox`: running model-written programs contained, for the code task;
- `tasks`: the data (answer formats, rewards, the arithmetic, GSM8K and code tasks) and the disjoint splits;
- `metrics`: accuracy, coverage and intervals on extracted answers;
- `configuration`: the workflow config's checks, every job's typed spec, the method registry, provenance;
- `jobs`: what a Snakemake job runs (base model, calibration, training, evaluation);
- `analysis`: tables, figures and the replay, from the records the jobs wrote.
- `planning`: what a config's run will cost, on the GPU and in its memory, before anything runs.

`logs` sets up every job's log. Nothing in `cgrpo` itself imports this package: `from cgrpo import CGRPOConfig,
CGRPOTrainer` loads the trainer library alone.
"""
