"""Time a calibration job's colocated vLLM engine on CPU: its start, and seeded calibration rows drawn through it.

    python benchmarks/colocated_engine.py results/smollm2_power/specs/calibrate/2-4-6-8/s1.json --prompts 4
    python benchmarks/colocated_engine.py results/smollm2_power/specs/calibrate/2-4-6-8/s1.json --prompts 4 --trl-engine

The spec is a calibration job's (written by the pipeline's planning, e.g. a dry run of config/smollm2_power.yaml); the
job's own trainer is built from it, and `--prompts` of its calibration prompts draw their max(grid) seeded samples
each. `--trl-engine` builds the engine as TRL asks (the model's dtype, bfloat16 on vLLM's CPU platform, compiled)
instead of the pipeline's float32 eager one (`cgrpo.support.vllm_colocate.eager_cpu_engine`). It runs in the vLLM
environment (docs/real-model.md) and prints the engine's dtype, its start and the draw in seconds.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("spec", help="a calibration job's spec file")
    parser.add_argument("--prompts", type=int, default=4, help="calibration prompts to draw")
    parser.add_argument("--trl-engine", action="store_true", help="TRL's engine: the model's dtype, compiled")
    args = parser.parse_args()
    from cgrpo.pipeline.jobs.vllm_backend import prepare_vllm_job

    spec = json.loads(open(args.spec).read())
    prepare_vllm_job(spec)
    from cgrpo.pipeline.configuration.specs import CalibrationSpec
    from cgrpo.pipeline.jobs import trainers
    from cgrpo.support import base, vllm_colocate

    if args.trl_engine:
        base.eager_cpu_engine = lambda _: contextlib.nullcontext()
    start = time.perf_counter()
    trainer = trainers.calibration_trainer(CalibrationSpec.from_dict(spec), "/tmp/colocated-engine-benchmark")
    built = time.perf_counter() - start
    examples = trainer._calibration_examples[: args.prompts]
    budget = trainer.args.max_budget
    prompts = [example["prompt"] for example in examples for _ in range(budget)]
    start = time.perf_counter()
    with vllm_colocate.seeded_rows(trainer, list(range(len(prompts)))):
        trainer._generate_rows(prompts, budget, examples[0]["prompt"])
    drawn = time.perf_counter() - start
    config = trainer.vllm_generation.llm.llm_engine.vllm_config.model_config
    print(
        f"engine {config.dtype}, eager {config.enforce_eager}: start {built:.1f} s, {len(prompts)} rows {drawn:.1f} s"
    )


if __name__ == "__main__":
    main()
