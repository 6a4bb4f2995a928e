import hashlib

import numpy as np
import pytest

from store.errors import BadRequest
from store.identity import Scope, page_hashes

from .conftest import FP, OTHER_FP


def sglang_get_hash_str(token_ids: list[int], prior_hash: str | None = None) -> str:
    """SGLang HiCache's page hash (``mem_cache``), written out independently as the reference."""
    hasher = hashlib.sha256()
    if prior_hash:
        hasher.update(bytes.fromhex(prior_hash))
    for t in token_ids:
        hasher.update(t.to_bytes(4, byteorder="little", signed=False))
    return hasher.hexdigest()


def test_unseeded_chain_has_known_answers() -> None:
    # Computed outside Python: printf '\x01\0\0\0\x02\0\0\0' | sha256sum, then the first
    # digest's bytes followed by 3 and 4 as uint32 little-endian, through sha256sum again.
    chain = page_hashes([1, 2, 3, 4, 5], page_size=2)
    assert chain == [
        "34fb5c825de7ca4aea6e712f19d439c1da0c92c37b423936c5f618545ca4fa1f",
        "c57b445f90651b9a650e516ab2238c965b21af35608a31c303e6d9e407f2915c",
    ]


def test_unseeded_chain_is_sglangs_page_hash() -> None:
    tokens = [0, 1, 2**32 - 1, 151_935, 7, 7, 7, 42, 9]
    expected, prior = [], None
    for start in range(0, 8, 4):
        prior = sglang_get_hash_str(tokens[start : start + 4], prior)
        expected.append(prior)
    assert page_hashes(tokens, page_size=4) == expected
    assert page_hashes(np.array(tokens), page_size=4) == expected


def test_scope_seed_has_a_known_answer_and_starts_the_chain() -> None:
    scope = Scope(FP, "tenant-1", 4)
    # sha256sum of "heterofold.kv.chain.v1\0", then fingerprint and salt each behind its uint32
    # little-endian length, then the page size as uint32 little-endian.
    assert scope.seed == "b2d6106ada6cd879ffbe847766ba5d57590d2bed2de40f8d96b7c5724f3a1611"
    assert scope.pages([1, 2, 3, 4]) == [sglang_get_hash_str([1, 2, 3, 4], scope.seed)]


def test_chain_differs_for_another_model_tenant_or_page_size() -> None:
    tokens = list(range(16))
    base = Scope(FP, "t", 4).pages(tokens)
    assert set(base).isdisjoint(Scope(OTHER_FP, "t", 4).pages(tokens))
    assert set(base).isdisjoint(Scope(FP, "u", 4).pages(tokens))
    assert set(base).isdisjoint(Scope(FP, "t", 2).pages(tokens))
    assert Scope(FP, "t", 4).pages(tokens) == base


def test_a_short_last_page_is_hashed_only_for_identity() -> None:
    scope = Scope(FP, "", 4)
    assert scope.pages([1, 2, 3, 4, 5, 6]) == scope.pages([1, 2, 3, 4])
    assert scope.identity([1, 2, 3, 4, 5, 6]) != scope.identity([1, 2, 3, 4, 5])
    assert scope.identity([1, 2, 3, 4]).chain_hash == scope.pages([1, 2, 3, 4])[-1]
    assert scope.identity([1, 2, 3, 4]).scope == scope


def test_same_tokens_of_two_tenants_have_different_handles() -> None:
    a, b = Scope(FP, "tenant-a", 4), Scope(FP, "tenant-b", 4)
    assert a.identity([5, 6, 7]).handle_id != b.identity([5, 6, 7]).handle_id
    assert a.key != b.key and "tenant-a" not in a.key


def test_token_ids_outside_uint32_or_empty_are_refused() -> None:
    with pytest.raises(BadRequest):
        page_hashes([1, 2**32], 2)
    with pytest.raises(BadRequest):
        page_hashes([-1, 3], 2)
    with pytest.raises(BadRequest):
        Scope(FP, "", 4).identity([])
