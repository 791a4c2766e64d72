"""Split a model's eval accuracy into "answers correctly" and "answers in the graded format".

The default experiment's base model names the unit after some answers ("#### 17 pens"), which the
task's strict extraction rejects (``base_model.options.unit_items`` in ``config/config.yaml``). This
script tells how much of a trained model's accuracy change comes from dropping that habit and how much
from computing better. Run from the repository root after ``snakemake --cores 2``::

    python benchmarks/answer_habits.py resources/base_model/arithmetic results/default/runs/*/model
    python benchmarks/answer_habits.py --samples 32 --temperature 1.0 resources/base_model/arithmetic \
        results/default/runs/cgrpo_s0_*/model results/default/runs/grpo_s0_G32/model

For each model it prints accuracy as graded (strict), the share of answers that carry a unit, and the
accuracy a grader ignoring a trailing unit would give: over greedy answers by default, over
``--samples`` answers per prompt sampled at ``--temperature`` otherwise (a habit the greedy answer
no longer shows can remain in samples).
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from cgrpo.pipeline.jobs.sampling import generate_completions
from cgrpo.pipeline.tasks import extract_answer, get_task, normalize_number, parse_gold
from cgrpo.pipeline.tasks.splits import load_split

UNIT_ANSWER = re.compile(r"####\s*(\S+)\s+[A-Za-z]+\s*$")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="+", type=Path, help="model directories saved with save_pretrained")
    parser.add_argument("--splits", type=Path, default=Path("results/default/splits"), help="the split folder")
    parser.add_argument("--max-new-tokens", type=int, default=40)
    parser.add_argument("--samples", type=int, default=0, help="answers sampled per prompt; 0 grades greedy answers")
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling temperature with --samples")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed with --samples")
    parser.add_argument("--threads", type=int, default=2)
    return parser.parse_args()


def grade(completion: str, gold: str) -> tuple[bool, bool, bool]:
    """(correct as graded, answer carries a unit, correct once a trailing unit is ignored)."""
    strict = extract_answer(completion, "hash") == gold
    unit = UNIT_ANSWER.search(completion)
    return strict, unit is not None, strict or (unit is not None and normalize_number(unit.group(1)) == gold)


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    rows = load_split(args.splits, "eval")
    task = get_task("arithmetic")
    prompts = [task.format_prompt(row["question"]) for row in rows]
    print("model\tstrict accuracy\tanswers with a unit\taccuracy ignoring the unit")
    for path in args.models:
        model, tokenizer = AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)
        completions = generate_completions(
            model,
            tokenizer,
            prompts,
            num_samples=max(1, args.samples),
            temperature=args.temperature,
            max_new_tokens=args.max_new_tokens,
            greedy=not args.samples,
            seed=args.seed,
        )
        grades = [
            grade(text, parse_gold(row["answer"]))
            for texts, row in zip(completions, rows, strict=True)
            for text in texts
        ]
        strict, unit, lenient = (sum(column) / len(grades) for column in zip(*grades))
        print(f"{path}\t{strict:.3f}\t{unit:.3f}\t{lenient:.3f}")


if __name__ == "__main__":
    main()
