"""The oracle probe's splice (bench/native_layers.py): native keys or values put into a mapped cache."""

from dataclasses import replace

import pytest
import torch

from bench.native_layers import head_end, layer_sets, norm_stats, renorm, splice, splice_head, variants
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
    shifted = replace(mapped, positions=mapped.positions + 1)
    with pytest.raises(ValueError, match="different tokens or positions"):
        splice(shifted, native, {0}, keys=True, values=True)
    with pytest.raises(ValueError, match="different tokens or positions"):
        splice_head(shifted, native, upto=3)


def test_variants_add_one_row_per_error_share_on_the_full_attention_layers() -> None:
    rows = {name: (layers, k, v, e) for name, layers, k, v, e in variants(WINDOWS, [0.5])}
    assert rows["kv:global err0.5"] == ({2, 5}, True, True, 0.5)
    assert rows["k:global"] == ({2, 5}, True, False, 0.0) and rows["kv:L5"] == ({5}, True, True, 0.0)


def test_splice_head_makes_the_first_positions_native_in_every_layer_sliding_ones_where_they_hold_them() -> None:
    native, mapped = pair()  # T = 10; the sliding layers (window 4) hold positions 7, 8, 9
    head = splice_head(mapped, native, upto=8)
    for i, w in enumerate(WINDOWS):
        native_rows = 8 if w == 0 else 1  # full layers: positions 0-7; sliding: position 7 of 7-9
        for got, ref, off in (
            (head.keys[i], native.keys[i], mapped.keys[i]),
            (head.values[i], native.values[i], mapped.values[i]),
        ):
            assert torch.equal(got[:, :native_rows], ref[:, :native_rows])
            assert torch.equal(got[:, native_rows:], off[:, native_rows:])
    untouched = splice_head(mapped, native, upto=5)  # before the sliding layers' rows
    assert torch.equal(untouched.keys[0], mapped.keys[0]) and torch.equal(
        untouched.keys[2][:, :5], native.keys[2][:, :5]
    )


def test_head_end_counts_mapped_tokens_past_the_unaligned_ones() -> None:
    src = torch.tensor([-1, -1, 0, 1, -1, 2, 3])  # BOS and a template marker, then text with one unaligned token
    assert head_end(src, 1) == 3 and head_end(src, 3) == 6 and head_end(src, 4) == 7
    assert head_end(src, 9) == 7  # fewer mapped tokens than asked: all of them


def test_renorm_takes_lengths_or_directions_from_the_native_rows() -> None:
    native = make_kv(T=10, windows=WINDOWS)
    mapped = replace(native, keys=tuple(k * 2.0 + 0.1 for k in native.keys))  # longer rows, off in direction too
    lengths = renorm(mapped, native, "k:norm")
    for got, m, n in zip(lengths.keys, mapped.keys, native.keys, strict=True):
        assert torch.allclose(got.norm(dim=-1), n.norm(dim=-1), atol=1e-5)  # native lengths
        cos = torch.nn.functional.cosine_similarity(got, m, dim=-1)
        assert torch.allclose(cos, torch.ones_like(cos), atol=1e-5)  # the map's directions
    assert all(torch.equal(a, b) for a, b in zip(lengths.values, mapped.values, strict=True))
    direction = renorm(mapped, native, "k:dir")
    assert torch.allclose(direction.keys[0].norm(dim=-1), mapped.keys[0].norm(dim=-1), atol=1e-5)
    unit = renorm(mapped, native, "kv:unit")  # every row of a head at the head's mean native length
    length = unit.keys[2].norm(dim=-1)  # (H, T)
    assert torch.allclose(length, native.keys[2].norm(dim=-1).mean(dim=1, keepdim=True).expand_as(length), atol=1e-5)
    assert torch.allclose(renorm(native, native, "k:scale").keys[0], native.keys[0])


def test_norm_stats_read_only_the_rows_the_map_changed() -> None:
    native = make_kv(T=10, windows=WINDOWS)
    keys = list(native.keys)
    keys[2] = keys[2].clone()
    keys[2][:, :3] *= 0.5  # three mapped rows at half length, the rest native (recomputed)
    stats = norm_stats(replace(native, keys=tuple(keys)), native)
    assert stats["k_ratio"][2] == pytest.approx(0.5, abs=1e-3) and stats["k_cos"][2] == pytest.approx(1.0, abs=1e-3)
    assert stats["k_ratio"][0] == 1.0 and stats["v_cos"] == [1.0] * len(WINDOWS)
