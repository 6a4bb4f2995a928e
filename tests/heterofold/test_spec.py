from types import SimpleNamespace

import pytest
import torch

from heterofold.errors import HeteroFoldError
from heterofold.spec import ModelSpec, SpecialTokens, fingerprint

SPECIAL = SpecialTokens(bos="<bos>", add_bos=True, eos=("<eos>",), eos_ids=(1,))


def gemma_like_config() -> SimpleNamespace:
    kinds = ["sliding_attention"] * 5 + ["full_attention"]
    return SimpleNamespace(
        model_type="gemma3_text", num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=1,
        head_dim=256, hidden_size=640, vocab_size=262144, max_position_embeddings=32768,
        layer_types=kinds, sliding_window=512,
        rope_parameters={
            "full_attention": {"rope_theta": 1e6, "rope_type": "default"},
            "sliding_attention": {"rope_theta": 1e4, "rope_type": "default"},
        },
    )  # fmt: skip


def test_spec_reads_per_layer_rope_and_windows() -> None:
    spec = ModelSpec.from_hf(name="g", config=gemma_like_config(), template="plain", special=SPECIAL, fingerprint="x")
    assert spec.family == "gemma3"
    assert spec.full_attention_layers == (5,)
    assert spec.windows == (512,) * 5 + (0,)
    assert [layer.rope_theta for layer in spec.layers] == [1e4] * 5 + [1e6]


def test_spec_reads_flat_rope_and_defaults_head_dim() -> None:
    cfg = SimpleNamespace(
        model_type="llama", num_hidden_layers=2, num_attention_heads=9, num_key_value_heads=3, hidden_size=576,
        vocab_size=49152, max_position_embeddings=8192, rope_parameters={"rope_theta": 1e5, "rope_type": "default"},
    )  # fmt: skip
    spec = ModelSpec.from_hf(name="s", config=cfg, template="chatml", special=SPECIAL, fingerprint="x")
    assert spec.head_dim == 64 and spec.windows == (0, 0) and spec.layers[1].rope_theta == 1e5


def test_spec_refuses_a_sliding_layer_without_a_window() -> None:
    cfg = gemma_like_config()
    cfg.sliding_window = None
    with pytest.raises(HeteroFoldError):
        ModelSpec.from_hf(name="g", config=cfg, template="plain", special=SPECIAL, fingerprint="x")


def test_fingerprint_changes_with_weights_and_config_but_not_tool_version() -> None:
    w = {"a.weight": torch.ones(2, 2), "b.bias": torch.zeros(3)}
    base = fingerprint(w.items(), {"vocab_size": 10, "transformers_version": "5.0"})
    assert base == fingerprint(reversed(list(w.items())), {"vocab_size": 10, "transformers_version": "5.9"})
    assert base != fingerprint({**w, "b.bias": torch.tensor([0.0, 0.0, 1e-7])}.items(), {"vocab_size": 10})
    assert base != fingerprint(w.items(), {"vocab_size": 11})
