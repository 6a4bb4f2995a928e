import pytest
import torch

from heterofold.errors import KVChecksumError, KVFormatError
from heterofold.kv import KVCache


def make_kv(T: int = 10, windows: tuple[int, ...] = (0, 4, 0), H: int = 2, D: int = 3) -> KVCache:
    g = torch.Generator().manual_seed(0)
    keys, values = [], []
    for w in windows:
        t = T if w == 0 else min(T, w - 1)
        keys.append(torch.randn(H, t, D, generator=g))
        values.append(torch.randn(H, t, D, generator=g))
    return KVCache(
        fingerprint="f" * 64,
        token_ids=torch.arange(100, 100 + T),
        positions=torch.arange(T),
        keys=tuple(keys),
        values=tuple(values),
        windows=windows,
    )


def assert_same(a: KVCache, b: KVCache) -> None:
    assert a.fingerprint == b.fingerprint and a.windows == b.windows
    assert torch.equal(a.token_ids, b.token_ids) and torch.equal(a.positions, b.positions)
    for x, y in zip(a.keys + a.values, b.keys + b.values, strict=True):
        assert torch.equal(x, y)


def test_bytes_round_trip_is_exact() -> None:
    kv = make_kv()
    assert_same(KVCache.from_bytes(kv.to_bytes()), kv)


def test_flipped_byte_is_refused_by_checksum() -> None:
    blob = bytearray(make_kv().to_bytes())
    blob[-5] ^= 0x01
    with pytest.raises(KVChecksumError):
        KVCache.from_bytes(bytes(blob))


def test_truncated_or_foreign_payload_is_refused() -> None:
    blob = make_kv().to_bytes()
    with pytest.raises(KVChecksumError):
        KVCache.from_bytes(blob[: len(blob) // 2])
    with pytest.raises(KVFormatError):
        KVCache.from_bytes(b"PK\x03\x04" + blob[4:])
    with pytest.raises(KVFormatError):
        KVCache.from_bytes(b"HF")


def test_sliding_layer_must_hold_window_minus_one_tokens() -> None:
    kv = make_kv(T=10, windows=(0, 4))
    assert kv.stored_length(1) == 3 and kv.keys[1].shape[1] == 3
    with pytest.raises(KVFormatError):
        KVCache(kv.fingerprint, kv.token_ids, kv.positions, (kv.keys[0], kv.keys[0]), kv.values, kv.windows)


def test_truncate_keeps_the_tokens_a_shorter_value_holds() -> None:
    kv = make_kv(T=10, windows=(0, 6))  # sliding layer holds tokens 5..9
    assert kv.can_truncate(9) is False  # would need tokens 4..8
    full_only = make_kv(T=10, windows=(0, 0))
    short = full_only.truncate(7)
    assert short.num_tokens == 7 and torch.equal(short.keys[1], full_only.keys[1][:, :7])
    early = make_kv(T=4, windows=(0, 6))  # below the window, every token is held
    assert torch.equal(early.truncate(2).keys[1], early.keys[1][:, :2])
    with pytest.raises(KVFormatError):
        kv.truncate(9)
