"""SGLang's HiCache page keys (sglang 0.5.23: ``get_hash_str``, ``cpp_utils/hash_binding.cpp``,
``storage_namespace_seed``), computed here independently with hashlib and compared with ours."""

from __future__ import annotations

import hashlib
import random
import struct

import pytest

from store.errors import BadRequest
from store.hicache.page_keys import PageKeys, namespace_seed, page_keys

# Known answers, tokens 1..8 in pages of 4 with no prior hash: sha256(u32le 1,2,3,4), then
# sha256(that digest || u32le 5,6,7,8). Literal, so a change of scheme on either side shows.
KNOWN = [
    "cf97adeedb59e05bfd73a2b4c2a8885708c4f4f70c84c64b27120e72ab733b72",
    "4ebfa8a1f3c341517621838c6e1b9aa350307e3f00b3cbd1a07ef740f54396d6",
]


def sglang_chain(tokens: list[int], page: int, prior: str | None = None) -> list[str]:
    """The scheme as SGLang's C++ binding computes it, written out with hashlib."""
    digest = bytes.fromhex(prior) if prior else None
    out = []
    for start in range(0, len(tokens) - len(tokens) % page, page):
        h = hashlib.sha256()
        if digest is not None:
            h.update(digest)
        h.update(struct.pack(f"<{page}I", *tokens[start : start + page]))
        digest = h.digest()
        out.append(digest.hex())
    return out


def test_page_keys_match_known_answers() -> None:
    first = hashlib.sha256(struct.pack("<4I", 1, 2, 3, 4)).digest()
    second = hashlib.sha256(first + struct.pack("<4I", 5, 6, 7, 8)).hexdigest()
    assert [first.hex(), second] == KNOWN
    assert page_keys(list(range(1, 9)), 4) == KNOWN


@pytest.mark.parametrize("page", [1, 16, 64])
def test_page_keys_match_sglang_chain_on_random_tokens(page: int) -> None:
    rng = random.Random(page)
    tokens = [rng.randrange(0, 262144) for _ in range(5 * page + page // 2)]  # a cut last page
    assert page_keys(tokens, page) == sglang_chain(tokens, page)
    prior = hashlib.sha256(b"prior page").hexdigest()
    assert page_keys(tokens, page, prior) == sglang_chain(tokens, page, prior)


def test_only_full_pages_get_keys() -> None:
    assert page_keys([1, 2, 3], 4) == []
    assert len(page_keys(list(range(9)), 4)) == 2


def test_a_prefix_has_the_same_keys_as_the_longer_sequence() -> None:
    tokens = list(range(100, 164))
    assert page_keys(tokens[:32], 16) == page_keys(tokens, 16)[:2]


def test_namespace_seed_matches_sglang() -> None:
    def seed(extra: str | None, salt: str | None) -> str:
        h = hashlib.sha256(b"sglang-cache-namespace-v1")
        for part in (extra, salt):
            if part is None:
                h.update(b"\x00")
            else:
                raw = part.encode()
                h.update(b"\x01" + struct.pack("<Q", len(raw)) + raw)
        return h.hexdigest()

    assert namespace_seed(None, None) is None
    for extra, salt in (("lora-a", None), (None, "tenant"), ("", ""), ("a", "bc"), ("ab", "c")):
        assert namespace_seed(extra, salt) == seed(extra, salt)
    assert namespace_seed("a", "bc") != namespace_seed("ab", "c")


def test_token_ids_beyond_uint32_are_refused() -> None:
    with pytest.raises(BadRequest):
        page_keys([2**32], 1)


def test_redis_keys_name_namespace_and_rank() -> None:
    keys = PageKeys("hf", "qwen2.5-0.5b", 1, 2)
    assert keys.page("ab") == "hf:hicache:qwen2.5-0.5b:r1of2:ab"
    assert keys.rank(0).page("ab") == "hf:hicache:qwen2.5-0.5b:r0of2:ab"
    assert keys.geometry == "hf:hicache:qwen2.5-0.5b:geometry:r1of2"
    with pytest.raises(ValueError):
        PageKeys("hf", "a:b", 0, 1)
    with pytest.raises(ValueError):
        PageKeys("hf", "m", 2, 2)
