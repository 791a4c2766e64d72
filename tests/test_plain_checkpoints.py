"""`cgrpo.support.models.save_plain`: the checkpoint vLLM's CPU build is given for a LoRA adapter (here on the tiny model; the
GGUF base is checked in tests/test_smollm2_gguf.py), computing what the adapter on its base computes."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from cgrpo.support.models import is_plain, load_model, save_plain


def _adapter(base: str, folder) -> None:
    """A LoRA adapter on `base` whose weights are not the identity (B starts at zero in training)."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    config = LoraConfig(r=4, lora_alpha=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    get_peft_model(AutoModelForCausalLM.from_pretrained(base), config).save_pretrained(folder)
    AutoTokenizer.from_pretrained(base).save_pretrained(folder)


def test_a_lora_adapter_is_saved_merged_into_a_plain_checkpoint(tiny_model_dir, tmp_path):
    _adapter(tiny_model_dir, tmp_path / "adapter")
    assert is_plain(tiny_model_dir) and not is_plain(tmp_path / "adapter")
    save_plain(tmp_path / "adapter", tmp_path / "plain")
    assert is_plain(tmp_path / "plain") and not any((tmp_path / "plain").glob("adapter*"))
    inputs = AutoTokenizer.from_pretrained(tmp_path / "plain")("12 + 7 =", return_tensors="pt")
    with torch.no_grad():
        adapted = load_model(tmp_path / "adapter").eval()(**inputs).logits
        merged = AutoModelForCausalLM.from_pretrained(tmp_path / "plain").eval()(**inputs).logits
        base = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()(**inputs).logits
    assert torch.allclose(merged, adapted, atol=1e-5)
    # Otherwise an adapter that was dropped would pass.
    assert not torch.allclose(merged, base, atol=1e-3)
