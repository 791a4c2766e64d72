"""Measure the bootstrapped base model: size, bootstrap time and accuracy on unseen arithmetic problems.

Run (offline, 2 threads), from the repository root::

    HF_HUB_OFFLINE=1 python benchmarks/base_model.py --output-dir results/base_model --threads 2

Add ``--load`` to measure an existing model instead of bootstrapping, and ``--set key=value`` to
override :class:`cgrpo.pipeline.bootstrap.BootstrapSettings` fields (e.g. ``--set num_examples=8000``).
Prints the parameter count, bootstrap wall time, greedy accuracy, majority-vote accuracy over the
first 8 samples and pass@k at the given temperature, overall and per (operations, size) group.
"""

from __future__ import annotations

import argparse
import ast
import json
import time
from collections import Counter, defaultdict
from pathlib import Path

import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer

from cgrpo.pipeline.bootstrap import SETTINGS_FILE, BootstrapSettings, bootstrap_base_model, sft_problems
from cgrpo.pipeline.sampling import generate_completions
from cgrpo.pipeline.splits import content_hash
from cgrpo.pipeline.tasks import get_task
from cgrpo.pipeline.tasks.arithmetic import generate_problems


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output-dir", type=Path, default=Path("results/base_model"))
    parser.add_argument("--load", action="store_true", help="measure the model already in --output-dir")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="bootstrap setting overrides")
    parser.add_argument("--eval-size", type=int, default=300)
    parser.add_argument("--eval-seed", type=int, default=123_456)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--num-samples", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    return parser.parse_args()


def parse_overrides(pairs: list[str]) -> dict:
    """``["seed=1", "learning_rate=1e-3"]`` -> ``{"seed": 1, "learning_rate": 0.001}``."""
    overrides = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        try:
            overrides[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):  # a bare word such as answer_format=boxed stays a string
            overrides[key] = value
    return overrides


def unseen_eval_set(settings: BootstrapSettings, size: int, seed: int) -> Dataset:
    """``size`` unique generated problems that are not among the model's SFT problems."""
    seen = {content_hash(example) for example in sft_problems(settings)}
    candidates = generate_problems(20 * size, seed, answer_format=settings.answer_format)
    keep, chosen = set(), []
    for index, example in enumerate(candidates):
        key = content_hash(example)
        if key not in seen and key not in keep:
            keep.add(key)
            chosen.append(index)
        if len(chosen) == size:
            return candidates.select(chosen)
    raise ValueError(f"Only {len(chosen)} unseen problems were found; lower --eval-size below {size}.")


def majority_correct(answers: list[str | None], gold: str) -> bool:
    """Majority vote over extracted answers; failed extractions (None) never win."""
    votes = Counter(answer for answer in answers if answer is not None)
    return bool(votes) and votes.most_common(1)[0][0] == gold


def score(task, problems: Dataset, greedy: list[list[str]], sampled: list[list[str]]) -> dict[str, tuple]:
    """Per group ("all" and each operations/size pair): greedy, maj@8 and pass@k correctness flags."""
    groups = defaultdict(lambda: ([], [], []))
    for index, example in enumerate(problems):
        gold = task.gold(example["answer"])
        answers = [task.extract(completion) for completion in sampled[index]]
        flags = (task.extract(greedy[index][0]) == gold, majority_correct(answers[:8], gold), gold in answers)
        for key in ("all", f"ops={example['num_ops']},{example['size']}"):
            for column, flag in zip(groups[key], flags):
                column.append(flag)
    return groups


def report(name: str, greedy: list[bool], majority: list[bool], passes: list[bool], k: int) -> None:
    mean = lambda flags: sum(flags) / len(flags)  # noqa: E731
    print(
        f"{name:<12} n={len(greedy):<4} greedy={mean(greedy):.3f} maj@8={mean(majority):.3f} "
        f"pass@{k}={mean(passes):.3f}"
    )


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    started, cpu_started = time.perf_counter(), time.process_time()
    if not args.load:
        bootstrap_base_model(args.output_dir, **parse_overrides(args.set))
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    settings = BootstrapSettings(**json.loads((args.output_dir / SETTINGS_FILE).read_text()))
    model = AutoModelForCausalLM.from_pretrained(args.output_dir)
    tokenizer = AutoTokenizer.from_pretrained(args.output_dir)
    task = get_task("arithmetic", answer_format=settings.answer_format)
    problems = unseen_eval_set(settings, args.eval_size, args.eval_seed)
    prompts = [task.format_prompt(question) for question in problems["question"]]
    common = dict(max_new_tokens=args.max_new_tokens, batch_size=args.batch_size, seed=args.eval_seed)
    greedy = generate_completions(model, tokenizer, prompts, num_samples=1, temperature=1.0, greedy=True, **common)
    sampled = generate_completions(
        model, tokenizer, prompts, num_samples=args.num_samples, temperature=args.temperature, **common
    )
    print(f"parameters: {model.num_parameters():,}")
    # CPU time over threads estimates the wall time on idle cores when other jobs share them.
    timing = "loaded" if args.load else f"{wall:.1f} s, CPU time {cpu:.1f} s on {args.threads} threads"
    print(f"bootstrap wall time: {timing}")
    print(f"eval: {len(prompts)} unseen problems, temperature {args.temperature}, {args.num_samples} samples")
    for key, flags in sorted(score(task, problems, greedy, sampled).items()):
        report(key, *flags, k=args.num_samples)
    print("example greedy completions:", [samples[0] for samples in greedy[:3]])
    lengths = [len(tokenizer(answer + tokenizer.eos_token).input_ids) for answer in problems["answer"]]
    print(f"longest reference completion: {max(lengths)} tokens with EOS")


if __name__ == "__main__":
    main()
