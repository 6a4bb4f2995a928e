import hashlib
import json
import struct

import pytest
import torch
from safetensors.torch import load as st_load

from heterofold.errors import KVChecksumError, KVFormatError
from heterofold.kv import FORMAT_VERSION, HEADER_SIZE, MAGIC, KVCache, header_digest
from tests.heterofold.caches import make_kv


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


def with_header(body: bytes, version: int = FORMAT_VERSION, magic: bytes = MAGIC) -> bytes:
    """A payload of ``body`` whose header carries its true sha256, as a writer of that format would."""
    return struct.pack("<4sH2x32s", magic, version, hashlib.sha256(body).digest()) + body


def as_buffer(blob: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(blob), dtype=torch.uint8)


def test_same_value_serializes_to_the_same_bytes() -> None:
    kv = make_kv()
    rebuilt = KVCache(
        kv.fingerprint,
        kv.token_ids.clone(),
        kv.positions.clone(),
        tuple(k.transpose(0, 1).contiguous().transpose(0, 1) for k in kv.keys),  # same values, other strides
        tuple(v.clone() for v in kv.values),
        kv.windows,
    )
    blob = kv.to_bytes()
    assert blob == kv.to_bytes() == rebuilt.to_bytes() == KVCache.from_bytes(blob).to_bytes()
    assert header_digest(blob) == kv.to_parts().sha256()


def test_body_is_a_safetensors_file_other_tools_can_read() -> None:
    kv = make_kv()
    body = kv.to_bytes()[HEADER_SIZE:]
    tensors = st_load(body)
    assert torch.equal(tensors["token_ids"], kv.token_ids) and torch.equal(tensors["v.2"], kv.values[2])
    (n,) = struct.unpack_from("<Q", body)
    assert (HEADER_SIZE + 8 + n) % 8 == 0  # the tensor data starts 8-byte aligned in the payload
    assert json.loads(body[8 : 8 + n])["__metadata__"] == {"fingerprint": kv.fingerprint, "windows": "[0, 4, 0]"}


def test_from_buffer_views_the_buffer_without_copying() -> None:
    kv = make_kv()
    data = as_buffer(kv.to_bytes())
    back = KVCache.from_buffer(data)
    assert_same(back, kv)
    lo, hi = data.data_ptr(), data.data_ptr() + data.numel()
    assert all(lo <= t.data_ptr() < hi for t in (back.token_ids, *back.keys, *back.values))


def test_from_buffer_refuses_flipped_truncated_and_foreign_payloads() -> None:
    blob = make_kv().to_bytes()
    for at in (HEADER_SIZE + 3, len(blob) - 1, 10):  # JSON header, last tensor byte, the digest itself
        flipped = bytearray(blob)
        flipped[at] ^= 0x08
        with pytest.raises(KVChecksumError):
            KVCache.from_buffer(torch.frombuffer(flipped, dtype=torch.uint8))
    with pytest.raises(KVChecksumError):
        KVCache.from_buffer(as_buffer(blob[:-4]))
    with pytest.raises(KVChecksumError):  # a caller's digest is checked as strictly as one computed here
        KVCache.from_buffer(as_buffer(blob), body_sha256=hashlib.sha256(blob[HEADER_SIZE:-1]).digest())
    with pytest.raises(KVFormatError):
        KVCache.from_buffer(as_buffer(b"PK\x03\x04" + blob[4:]))
    with pytest.raises(KVFormatError):
        KVCache.from_buffer(as_buffer(blob[: HEADER_SIZE - 1]))
    with pytest.raises(KVFormatError):
        KVCache.from_buffer(as_buffer(blob).view(torch.int8))


def test_other_format_versions_are_refused() -> None:
    body = make_kv().to_bytes()[HEADER_SIZE:]
    assert_same(KVCache.from_bytes(with_header(body)), make_kv())
    for version in (1, FORMAT_VERSION + 1):
        with pytest.raises(KVFormatError, match="version"):
            KVCache.from_bytes(with_header(body, version=version))


def test_malformed_header_with_a_valid_checksum_is_refused_as_a_format_error() -> None:
    kv = make_kv()
    body = kv.to_bytes()[HEADER_SIZE:]
    (n,) = struct.unpack_from("<Q", body)
    header = json.loads(body[8 : 8 + n])

    def rewritten(**changes: object) -> bytes:
        text = json.dumps({**header, **changes}).encode()
        return with_header(struct.pack("<Q", len(text)) + text + body[8 + n :])

    end = header["v.2"]["data_offsets"][1]
    bad = [
        rewritten(**{"k.0": {**header["k.0"], "data_offsets": [0, end + 8]}}),  # past the data
        rewritten(**{"k.0": {**header["k.0"], "shape": [2, 10, 4]}}),  # more than its bytes hold
        rewritten(**{"k.0": {**header["k.0"], "shape": [-2, 10, -3]}}),
        rewritten(**{"k.0": {**header["k.0"], "dtype": "C64"}}),
        rewritten(**{"k.0": "not a tensor"}),
        rewritten(__metadata__={"fingerprint": kv.fingerprint}),  # no windows
        with_header(struct.pack("<Q", 1 << 40) + body[8:]),  # header length past the end
        with_header(struct.pack("<Q", 2) + b"[]" + body[10:]),
        with_header(b"\x01"),
    ]
    for blob in bad:
        with pytest.raises(KVFormatError) as info:
            KVCache.from_bytes(blob)
        assert not isinstance(info.value, KVChecksumError)


def test_empty_layers_other_dtypes_and_unaligned_tensors_round_trip() -> None:
    T = 5
    layers = [
        torch.randn(1, T, 3).to(torch.float16),  # K and V take 60 bytes: the next layer starts 4 bytes off 8
        torch.randn(2, T, 3).to(torch.float64),
        torch.randn(1, 0, 4),  # a window-1 layer holds no token
        torch.randn(2, T, 4).to(torch.bfloat16),
    ]
    kv = KVCache("f" * 64, torch.arange(T), torch.arange(T), tuple(layers), tuple(t + 1 for t in layers), (0, 0, 1, 0))
    data = as_buffer(kv.to_bytes())
    back = KVCache.from_buffer(data)
    assert_same(back, kv)
    assert [t.dtype for t in back.keys] == [t.dtype for t in kv.keys]
    assert all(t.data_ptr() % t.element_size() == 0 for t in back.keys + back.values)
    inside = data.data_ptr() <= back.keys[1].data_ptr() < data.data_ptr() + data.numel()
    assert not inside  # the misaligned float64 layer was copied, the others are views
    assert data.data_ptr() <= back.keys[0].data_ptr() < data.data_ptr() + data.numel()
