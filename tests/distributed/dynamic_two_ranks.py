"""Train with dynamic sampling on one rank of a two-process run and dump what each rank saw (launched by
test_dynamic_sampling.py): first `DynamicSamplingGRPOTrainer`, then `CGRPOTrainer(drop_unanimous=True)`.

    torchrun --nproc_per_node 2 tests/distributed/dynamic_two_ranks.py MODEL_DIR OUT_DIR
"""

import json
import sys
from pathlib import Path

import torch
from datasets import Dataset

from cgrpo import CGRPOConfig, CGRPOTrainer, DynamicSamplingConfig, DynamicSamplingGRPOTrainer

# Without shuffling, a generation batch of 4 prompts gives prompts 4s and 4s+1 to rank 0 and 4s+2, 4s+3 to rank 1:
# rank 0's are informative, rank 1's are not, so the informative groups must be shared out across the ranks.
DATA = Dataset.from_dict(
    {
        "prompt": [f"{i}+{i}=" for i in range(64)],
        "index": list(range(64)),
        "informative": [i % 4 < 2 for i in range(64)],
        "easy": [i % 4 >= 2 for i in range(64)],
    }
)


def parity_reward(completions, informative, **kwargs):
    """Alternating rewards over the rows of an informative group, one reward for all rows of the others."""
    return [float(j % 2) if flag else 1.0 for j, flag in enumerate(informative)]


def easy_passes(completions, easy, **kwargs):
    """C-GRPO's verifier: every completion of an easy prompt passes, so its group stops at the first budget."""
    return [easy] * len(completions)


def record_batches(sampler) -> list[list[int]]:
    """From now on, the dataset indices of the groups each generation batch keeps on this rank."""
    batches = []
    sample = sampler.sample

    def recording(inputs, generate_round):
        kept, pad_mask = sample(inputs, generate_round)
        batches.append([row["index"] for row in kept[:: sampler.group_size]])
        return kept, pad_mask

    sampler.sample = recording
    return batches


def common(out_dir: str) -> dict:
    return dict(
        output_dir=out_dir,
        use_cpu=True,
        bf16=False,
        per_device_train_batch_size=8,
        max_completion_length=4,
        max_steps=3,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        seed=0,
        shuffle_dataset=False,
        max_sampling_rounds=3,
        prompts_per_round=4,
    )  # no over-sampling: rank 1 must get rank 0's groups


def main(model_dir: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    args = DynamicSamplingConfig(num_generations=4, **common(out_dir))
    trainer = DynamicSamplingGRPOTrainer(model=model_dir, reward_funcs=parity_reward, args=args, train_dataset=DATA)
    batches = record_batches(trainer._sampler)
    trainer.train()
    dump = {
        "world_size": trainer.accelerator.num_processes,
        "steps": trainer.state.global_step,
        "batches": batches,
        "totals": trainer.dynamic_totals,
        "logged": [{k: v for k, v in e.items() if k.startswith("dynamic/")} for e in trainer.state.log_history],
    }

    calibration = Dataset.from_dict({"prompt": [f"{i}*2=" for i in range(4)], "easy": [True] * 4})
    args = CGRPOConfig(
        budget_grid=[2, 4],
        score="first_success",
        recalibrate_every=0,
        min_generation_prompts=1,
        drop_unanimous=True,
        **common(out_dir),
    )
    cgrpo = CGRPOTrainer(
        model=model_dir,
        reward_funcs=parity_reward,
        args=args,
        train_dataset=DATA,
        calibration_dataset=calibration,
        verifier=easy_passes,
    )
    cgrpo_batches = record_batches(cgrpo._dynamic)
    cgrpo.train()
    dump["cgrpo"] = {
        "steps": cgrpo.state.global_step,
        "batches": cgrpo_batches,
        "totals": cgrpo.dynamic_totals,
        "cgrpo_totals": cgrpo.cgrpo_totals,
    }
    rank = trainer.accelerator.process_index
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(dump))


if __name__ == "__main__":
    main(*sys.argv[1:3])
