"""GGUF to safetensors conversion, and loading a converted model with its tokenizer and spec.

Loading never touches the network: paths are local and ``local_files_only`` is set.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

from engines.attention import SDPA
from engines.catalog import ZooEntry
from engines.errors import ZooError
from heterofold.spec import ModelSpec, SpecialTokens, fingerprint

# Tokens that end a turn, by template, besides the tokenizer's own EOS.
_TURN_END = {"chatml": ("<|im_end|>", "<|endoftext|>"), "plain": ("<eos>", "<end_of_turn>")}


@dataclass
class LoadedModel:
    model: Any  # a transformers PreTrainedModel, in eval mode
    tokenizer: Any  # a fast transformers tokenizer
    spec: ModelSpec
    load_s: float


def convert_gguf(entry: ZooEntry, gguf: Path, out_dir: Path, progress: Any) -> dict[str, Any]:
    """Dequantize ``gguf`` to fp32 and save it into ``out_dir``. Returns the manifest."""
    t0 = time.perf_counter()
    progress("convert", 0, 3)
    kwargs = {"gguf_file": gguf.name, "local_files_only": True}
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, **kwargs)
        model: Any = AutoModelForCausalLM.from_pretrained(gguf.parent, dtype=torch.float32, **kwargs)
    except Exception as exc:  # transformers raises many types for a bad GGUF
        raise ZooError(f"{entry.name}: transformers could not read {gguf}: {exc}") from exc
    progress("convert", 1, 3)
    _check_shape(entry, model.config)
    # save_pretrained refuses a model that still carries its GGUF quantization marker.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    progress("convert", 2, 3)
    config = json.loads((out_dir / "config.json").read_text())
    manifest = {
        "name": entry.name,
        "family": entry.family,
        "gguf_sha256": entry.gguf_sha256,
        "fingerprint": fingerprint(model.state_dict().items(), config),
        "template": entry.template,
        "transformers": transformers.__version__,
        "convert_s": round(time.perf_counter() - t0, 2),
    }
    progress("convert", 3, 3)
    return manifest


def load_converted(folder: Path, manifest: dict[str, Any], device: str = "cpu") -> LoadedModel:
    """Load a converted model folder (a second or two) and build its spec."""
    t0 = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    model: Any = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, local_files_only=True)
    model.to(device).eval()
    model.config._attn_implementation = SDPA  # engines.attention: SDPA, the key/value groups left to the kernel on CPU
    spec = ModelSpec.from_hf(
        name=manifest["name"],
        config=model.config,
        template=manifest["template"],
        special=special_tokens(tokenizer, manifest["template"]),
        fingerprint=manifest["fingerprint"],
    )
    return LoadedModel(model=model, tokenizer=tokenizer, spec=spec, load_s=time.perf_counter() - t0)


def verify_fingerprint(model: Any, folder: Path) -> str:
    """Recompute the fingerprint from loaded weights; returns it (the caller compares)."""
    config = json.loads((folder / "config.json").read_text())
    return fingerprint(model.state_dict().items(), config)


def special_tokens(tokenizer: Any, template: str) -> SpecialTokens:
    vocab = tokenizer.get_vocab()
    eos = [tokenizer.eos_token] if tokenizer.eos_token else []
    eos += [t for t in _TURN_END[template] if t in vocab and t not in eos]
    probe = tokenizer("a", add_special_tokens=True)["input_ids"]
    bos_id = tokenizer.bos_token_id
    return SpecialTokens(
        bos=tokenizer.bos_token,
        add_bos=bool(probe) and bos_id is not None and probe[0] == bos_id,
        eos=tuple(eos),
        eos_ids=tuple(int(vocab[t]) for t in eos),
    )


def _check_shape(entry: ZooEntry, config: Any) -> None:
    got = (
        config.num_hidden_layers,
        config.num_attention_heads,
        config.num_key_value_heads,
        getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads,
        config.vocab_size,
    )
    want = (entry.shape.layers, entry.shape.heads, entry.shape.kv_heads, entry.shape.head_dim, entry.shape.vocab)
    if got != want:
        raise ZooError(f"{entry.name}: GGUF gives layers/heads/kv/dim/vocab {got}, the catalog expects {want}")
