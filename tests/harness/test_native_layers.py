"""The oracle probe's splice (bench/native_layers.py): native keys or values put into a mapped cache."""

from dataclasses import replace

import pytest
import torch

from bench.native_layers import layer_sets, splice, variants
from heterofold.kv import KVCache
from tests.heterofold.caches import make_kv

WINDOWS = (4, 4, 0, 4, 4, 0)  # two sliding layers, one full-attention layer, twice


def pair() -> tuple[KVCache, KVCache]:
    native = make_kv(T=10, windows=WINDOWS)
    shifted = replace(
        native, keys=tuple(k + 1.0 for k in native.keys), values=tuple(v - 2.0 for v in native.values)
    )  # the "mapped" cache: every entry off by a known amount
    return native, shifted


def test_layer_sets_name_depth_thirds_and_the_full_attention_layers() -> None:
    sets = layer_sets(WINDOWS)
    assert sets == {"all": set(range(6)), "early": {0, 1}, "middle": {2, 3}, "late": {4, 5}, "global": {2, 5}}
    assert "global" not in layer_sets((0, 0, 0))  # all full attention: nothing to single out


def test_splice_replaces_only_the_named_part_of_the_named_layers() -> None:
    native, mapped = pair()
    both = splice(mapped, native, {0, 1, 2, 3, 4, 5}, keys=True, values=True)
    for a, b in zip(both.keys + both.values, native.keys + native.values, strict=True):
        assert torch.equal(a, b)
    keys_only = splice(mapped, native, {2, 5}, keys=True, values=False)
    for i in range(6):
        assert torch.equal(keys_only.keys[i], native.keys[i] if i in (2, 5) else mapped.keys[i])
        assert torch.equal(keys_only.values[i], mapped.values[i])


def test_splice_keeps_the_given_share_of_the_maps_error() -> None:
    native, mapped = pair()
    half = splice(mapped, native, {2}, keys=True, values=True, error=0.5)
    assert torch.allclose(half.keys[2] - native.keys[2], torch.full_like(native.keys[2], 0.5))
    assert torch.allclose(half.values[2] - native.values[2], torch.full_like(native.values[2], -1.0))
    assert torch.equal(half.keys[0], mapped.keys[0])


def test_splice_refuses_caches_of_different_positions() -> None:
    native, mapped = pair()
    with pytest.raises(ValueError, match="different tokens or positions"):
        splice(replace(mapped, positions=mapped.positions + 1), native, {0}, keys=True, values=True)


def test_variants_add_one_row_per_error_share_on_the_full_attention_layers() -> None:
    rows = {name: (layers, k, v, e) for name, layers, k, v, e in variants(WINDOWS, [0.5])}
    assert rows["kv:global err0.5"] == ({2, 5}, True, True, 0.5)
    assert rows["k:global"] == ({2, 5}, True, False, 0.0) and rows["kv:L5"] == ({5}, True, True, 0.0)
