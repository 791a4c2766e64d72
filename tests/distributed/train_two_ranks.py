"""Train C-GRPO on one rank of a multi-process run and dump what each rank saw (launched by test_distributed.py).

torchrun --nproc_per_node 2 tests/distributed/train_two_ranks.py MODEL_DIR OUT_DIR
"""

import json
import sys
from pathlib import Path

import torch
from datasets import Dataset

from cgrpo import CGRPOConfig, CGRPOTrainer


def main(model_dir: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    data = Dataset.from_dict({"prompt": [f"{i}+{i}=" for i in range(64)], "easy": [i % 2 == 0 for i in range(64)]})
    calibration = Dataset.from_dict({"prompt": [f"{i}*2=" for i in range(5)], "easy": [True, False, True, True, False]})
    args = CGRPOConfig(
        output_dir=out_dir,
        use_cpu=True,
        bf16=False,
        budget_grid=[2, 4, 8],
        per_device_train_batch_size=16,
        max_completion_length=4,
        max_steps=3,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        score="first_success",
        recalibrate_every=2,
        seed=0,
        min_generation_prompts=1,
    )
    trainer = CGRPOTrainer(
        model=model_dir,
        reward_funcs=lambda completions, **kw: [float(len(c) % 2) for c in completions],
        args=args,
        train_dataset=data,
        calibration_dataset=calibration,
        verifier=lambda completions, easy: [easy] * len(completions),
    )
    local_ks = []
    log_budget = trainer._log_budget_metrics

    def record(kept, prompt_ids, completion_ids):
        local_ks.append(list(kept))
        log_budget(kept, prompt_ids, completion_ids)

    trainer._log_budget_metrics = record
    trainer.train()
    rank = trainer.accelerator.process_index
    dump = {
        "world_size": trainer.accelerator.num_processes,
        "calibrations": trainer.calibration_history,
        "totals": trainer.cgrpo_totals,
        "local_ks": local_ks,
        "mean_k": [e["cgrpo/mean_k"] for e in trainer.state.log_history if "cgrpo/mean_k" in e],
    }
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(dump))


if __name__ == "__main__":
    main(*sys.argv[1:3])
