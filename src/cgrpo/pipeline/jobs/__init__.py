"""The pipeline's jobs: building or recording the base model (`base_model`), the initial calibration and the
training runs (`runs`, with one trainer builder per method in `trainers`, the timed GRPO baseline in `timing` and a
killed job's resume in `checkpoints`), and the evaluation of a model (`evaluation`, sampling with HF generate or vLLM
in `sampling` and `vllm_backend`).

Each Snakemake script calls one function here with its job's spec (`cgrpo.pipeline.configuration.specs`).
"""
