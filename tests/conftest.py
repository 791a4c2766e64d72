"""Shared fixtures: a tiny random causal LM and a character tokenizer, built offline in seconds."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

CHARACTERS = "0123456789+-*/=#.:?, abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ\n'"


def build_tiny_model(path, seed: int = 0) -> str:
    """Save a random 2-layer Qwen2 model and a character-level tokenizer to `path`; return the path."""
    import torch
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    specials = ["<pad>", "<eos>", "<unk>"]
    vocab = {token: i for i, token in enumerate(specials + list(CHARACTERS))}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=256, pad_token_id=0, eos_token_id=1, bos_token_id=1,
        tie_word_embeddings=True,
    )
    Qwen2ForCausalLM(config).save_pretrained(path)
    fast.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"))


# Settings for a bootstrap that takes seconds: far too small to learn arithmetic, but it exercises every step.
TINY_BOOTSTRAP = dict(
    seed=0, num_examples=64, batch_size=16, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2,
    warmup_steps=0,
)


@pytest.fixture(scope="session")
def bootstrapped_model_dir(tmp_path_factory):
    """A base model built by `cgrpo.pipeline.bootstrap.bootstrap_base_model` on a tiny budget."""
    from cgrpo.pipeline.bootstrap import bootstrap_base_model

    return bootstrap_base_model(tmp_path_factory.mktemp("bootstrapped-model"), **TINY_BOOTSTRAP)
