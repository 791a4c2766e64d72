"""A model's size for the cost plan: its parameters and the shapes that set its memory, read without loading it.

The shapes come from the model's `config.json`: a local folder's, the Hugging Face cache's (offline: nothing is
downloaded), one given by path, or, for the models the shipped configs train, the published `config.json` in
`PUBLISHED`. The parameter count is computed from the shapes for the llama family's layout (the layout of Qwen2,
Llama, Mistral and SmolLM: grouped-query attention, a gated MLP, RMSNorm, with Qwen2's biases on the query, key and
value projections and Llama's optional ones), which gives Qwen2.5-0.5B-Instruct's 494,032,768 and Qwen2.5-1.5B-Instruct's 1,543,714,304, the
0.49B and 1.54B their model cards state; another layout, or a count known better, is given as a number.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

__all__ = ["PUBLISHED", "ModelSize", "find_model_size", "size_from_config"]

# The config.json fields of the models the shipped configs train, as published with them
# (huggingface.co/Qwen/Qwen2.5-0.5B-Instruct/blob/main/config.json and .../Qwen2.5-1.5B-Instruct/...): used where
# neither a folder nor the local cache holds the model.
PUBLISHED = {
    "Qwen/Qwen2.5-0.5B-Instruct": {
        "model_type": "qwen2",
        "num_hidden_layers": 24,
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "vocab_size": 151936,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
    },
    "Qwen/Qwen2.5-1.5B-Instruct": {
        "model_type": "qwen2",
        "num_hidden_layers": 28,
        "hidden_size": 1536,
        "intermediate_size": 8960,
        "num_attention_heads": 12,
        "num_key_value_heads": 2,
        "vocab_size": 151936,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
    },
}

# The linear layers of one llama-family decoder layer, as PEFT's target_modules name them, by (in, out) features.
_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class ModelSize:
    """A decoder-only model's parameter count and, where known, its shapes; `source` says where they come from.

    Without the shapes (`layers` None: only a count was given) the plan estimates weights and optimizer state, not
    the KV cache or activations.
    """

    name: str
    params: int
    source: str
    layers: int | None = None
    hidden: int | None = None
    intermediate: int | None = None
    heads: int | None = None
    kv_heads: int | None = None
    head_dim: int | None = None
    vocab: int | None = None
    # The checkpoint's dtype, which vLLM loads it in ("auto") and TRL's dtype "auto" keeps.
    dtype: str = "bfloat16"

    @property
    def has_shapes(self) -> bool:
        return self.layers is not None

    def kv_bytes_per_token(self, bytes_per_value: int = 2) -> int:
        """KV-cache bytes per token: a key and a value per layer and KV head, head_dim values each."""
        return 2 * self.layers * self.kv_heads * self.head_dim * bytes_per_value

    def lora_params(self, rank: int, modules: list[str] | str) -> int:
        """Trainable parameters of LoRA at `rank` on `modules` (PEFT's target_modules: projection names, or
        "all-linear") in every layer: rank x (in + out) per projection."""
        names = list(_PROJECTIONS) if modules == "all-linear" else list(modules)
        unknown = sorted(set(names) - set(_PROJECTIONS))
        if unknown:
            raise ValueError(
                f"peft.target_modules names {', '.join(unknown)}, whose shape the cost plan does not know; target "
                f"the projections ({', '.join(_PROJECTIONS)}) or all-linear to plan the memory."
            )
        shapes = self._projection_shapes()
        return self.layers * sum(rank * sum(shapes[name]) for name in names)

    def _projection_shapes(self) -> dict[str, tuple[int, int]]:
        query, key_value = self.heads * self.head_dim, self.kv_heads * self.head_dim
        return {
            "q_proj": (self.hidden, query),
            "k_proj": (self.hidden, key_value),
            "v_proj": (self.hidden, key_value),
            "o_proj": (query, self.hidden),
            "gate_proj": (self.hidden, self.intermediate),
            "up_proj": (self.hidden, self.intermediate),
            "down_proj": (self.intermediate, self.hidden),
        }


def size_from_config(config: Mapping[str, Any], name: str, source: str) -> ModelSize:
    """The size of the model whose config.json is `config`, its parameters counted for the llama family's layout."""
    try:
        layers, hidden, heads = (
            int(config[key]) for key in ("num_hidden_layers", "hidden_size", "num_attention_heads")
        )
        vocab, intermediate = int(config["vocab_size"]), int(config["intermediate_size"])
    except KeyError as missing:
        raise ValueError(
            f"{source} lacks {missing}, which the cost plan reads the model's shapes from; give the parameter count "
            "with --model-params."
        ) from None
    kv_heads = int(config.get("num_key_value_heads") or heads)
    head_dim = int(config.get("head_dim") or hidden // heads)
    query, key_value = heads * head_dim, kv_heads * head_dim
    # Qwen2 always biases the query, key and value projections; Llama's attention_bias biases the output one too.
    llama_bias = bool(config.get("attention_bias"))
    qkv_bias = config.get("model_type") == "qwen2" or llama_bias
    attention = 2 * hidden * query + 2 * hidden * key_value + (query + 2 * key_value) * qkv_bias + hidden * llama_bias
    mlp = 3 * hidden * intermediate + (2 * intermediate + hidden) * bool(config.get("mlp_bias"))
    # Two RMSNorm weights per layer, one after the last.
    per_layer = attention + mlp + 2 * hidden
    embeddings = vocab * hidden * (1 if config.get("tie_word_embeddings", True) else 2)
    return ModelSize(
        name=name,
        params=layers * per_layer + hidden + embeddings,
        source=source,
        layers=layers,
        hidden=hidden,
        intermediate=intermediate,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        vocab=vocab,
        dtype=str(config.get("torch_dtype") or config.get("dtype") or "bfloat16"),
    )


def find_model_size(
    location: str, config_file: str | Path | None = None, params: int | None = None
) -> ModelSize | None:
    """The size of the model at `location` (a hub id or folder): from `config_file` where given, else the folder's
    config.json, the local Hugging Face cache's or `PUBLISHED`; `params` replaces the computed count (and alone, with
    no config found, gives a size without shapes). None where nothing is known."""
    found = _config_json(location, config_file)
    if found is None:
        return None if params is None else ModelSize(location, int(params), "--model-params")
    size = size_from_config(found[0], location, found[1])
    return size if params is None else replace(size, params=int(params), source=f"{size.source}; --model-params")


def _config_json(location: str, config_file: str | Path | None) -> tuple[dict[str, Any], str] | None:
    if config_file is not None:
        path = Path(config_file)
        path = path / "config.json" if path.is_dir() else path
        return json.loads(path.read_text()), str(path)
    path = Path(location)
    if (path / "config.json").is_file():
        return json.loads((path / "config.json").read_text()), str(path / "config.json")
    if path.exists() or path.is_absolute() or location.startswith(".") or location.count("/") > 1:
        # A GGUF file or a path, not a hub id: nothing in the cache.
        return None
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(location, "config.json")
    if isinstance(cached, str):
        return json.loads(Path(cached).read_text()), f"{location}'s config.json in the Hugging Face cache"
    if location in PUBLISHED:
        return PUBLISHED[location], f"{location}'s published config.json"
    return None
