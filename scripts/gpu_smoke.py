"""The ten-minute GPU smoke run: config/gsm8k_qwen.yaml with config/overrides/gpu_smoke.yaml on one GPU, into
results/gpu_smoke/, failing loudly where a GPU path is broken.

    python scripts/gpu_smoke.py [extra snakemake arguments, e.g. --cores 16]

Before any work it refuses, in one sentence, a machine where torch sees no CUDA device or vLLM is missing. It then
runs the pipeline with workflow/profiles/gpu (the policy's jobs one at a time on the GPU) and, once it has finished,
checks what a silent fallback would hide (`cgrpo.pipeline.analysis.gpu_smoke`): every training run generated with
vLLM, C-GRPO refitted inside its training job, every evaluation and the format check sampled with vLLM. It prints
every job's time, and the generation and training throughputs it measured as the cost plan takes them
(`--gen-tokens-per-s N --train-tokens-per-s M --measured-on <model>`, `cgrpo.pipeline.analysis.gpu_smoke.plan_flags`);
exit status 0 only when the run finished and every check holds.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from cgrpo.pipeline.analysis.gpu_smoke import gpu_run_problems, job_times, plan_flags
from cgrpo.pipeline.jobs.vllm_backend import check_gpu_machine

REPO = Path(__file__).resolve().parents[1]
CONFIGS = [REPO / "config" / "gsm8k_qwen.yaml", REPO / "config" / "overrides" / "gpu_smoke.yaml"]
PROFILE = REPO / "workflow" / "profiles" / "gpu"
RESULTS = REPO / "results" / "gpu_smoke"


def main(extra: list[str]) -> int:
    try:
        check_gpu_machine()
    except ValueError as error:
        print(f"gpu smoke: {error}", file=sys.stderr)
        return 2
    command = [
        sys.executable,
        "-m",
        "snakemake",
        "--workflow-profile",
        str(PROFILE),
        "--configfile",
        *map(str, CONFIGS),
    ]
    start = time.perf_counter()
    finished = subprocess.run([*command, *extra], cwd=REPO, check=False).returncode
    elapsed = time.perf_counter() - start
    if finished:
        print(
            f"gpu smoke: the pipeline failed after {elapsed:.0f} s; the failed job's log is named above.",
            file=sys.stderr,
        )
        return finished
    print(job_times(RESULTS).to_markdown(index=False, floatfmt=".1f"))
    print(f"\ngpu smoke: the pipeline took {elapsed:.0f} s.")
    problems = gpu_run_problems(RESULTS)
    try:
        # The throughputs measured on this GPU, as the cost plan of the full config (or another model's) takes them.
        flags = plan_flags(RESULTS)
        print(f"gpu smoke: python scripts/cost_plan.py --configfile config/gsm8k_qwen.yaml {flags}")
    except ValueError as error:
        problems.append(str(error))
    for problem in problems:
        print(f"gpu smoke: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
