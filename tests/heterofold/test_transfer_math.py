"""The method's pure parts: RoPE, alignment, ridge and re-colouring, the adapter artifact."""

from pathlib import Path

import pytest
import torch

from heterofold.adapter import Adapter, LayerMap, Manifest, Side
from heterofold.align import Section, align_layers, align_tokens, shared_sections
from heterofold.errors import AdapterError, FingerprintMismatch
from heterofold.fit import recolour, ridge
from heterofold.kv import KVCache
from heterofold.rope import apply_rope, strip_rope


def test_rope_strip_then_apply_is_an_exact_inverse() -> None:
    x = torch.randn(3, 50, 64)
    pos = torch.arange(50) * 97
    for theta in (1e4, 1e5, 1e6):
        torch.testing.assert_close(strip_rope(apply_rope(x, pos, theta), pos, theta), x, atol=1e-5, rtol=0)
    assert not torch.allclose(apply_rope(x, pos, 1e4), x)


def test_rope_moves_a_key_between_positions_like_a_rotation() -> None:
    # q·k after RoPE depends only on the distance between positions.
    q, k = torch.randn(1, 1, 64), torch.randn(1, 1, 64)
    a = (apply_rope(q, torch.tensor([10]), 1e4) * apply_rope(k, torch.tensor([3]), 1e4)).sum()
    b = (apply_rope(q, torch.tensor([107]), 1e4) * apply_rope(k, torch.tensor([100]), 1e4)).sum()
    torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


def words(text: str, bos: bool = False) -> list[tuple[int, int]]:
    """A stand-in tokenizer: words and single other characters, with character offsets."""
    import re

    spans = [(m.start(), m.end()) for m in re.finditer(r"\w+|\s+|[^\w\s]", text)]
    return [(0, 0), *spans] if bos else spans


@pytest.mark.parametrize(
    "content",
    ["naïve café — 12345 isn't it?", "Zoë's 3.14159 ≠ π; don't", "日本語のテキスト and emoji 🙂!", "ab"],
)
def test_tokens_align_through_different_templates(content: str) -> None:
    sender = f"<|im_start|>user\n{content}<|im_end|>\n"
    receiver = f"User: {content}\n\nAssistant:"
    sections = shared_sections(sender, receiver, [content], min_chars=1)
    s_off, r_off = words(sender), words(receiver, bos=True)
    src = align_tokens(s_off, r_off, sections)
    assert src[0] == -1  # BOS has no sender token
    for j, i in enumerate(src.tolist()):
        a, b = r_off[j]
        inside = b > a and sections[0].receiver_start <= b - 1 < sections[0].receiver_start + len(content)
        assert (i >= 0) == inside
        if i >= 0:  # the sender token covers the same character
            c = b - 1 - sections[0].receiver_start + sections[0].sender_start
            assert s_off[i][0] <= c < s_off[i][1] and sender[c] == receiver[b - 1]


def test_sections_are_the_shared_paragraphs_in_order() -> None:
    sender = "<s>First shared paragraph here.\n\nSender only.\n\nSecond shared paragraph.</s>"
    receiver = "[R] First shared paragraph here.\n\nSecond shared paragraph.\n\nNew question? [/R]"
    content = "First shared paragraph here.\n\nSecond shared paragraph.\n\nNew question?"
    sections = shared_sections(sender, receiver, [content], min_chars=10)
    got = [(sender[s.sender_start :][: s.length], receiver[s.receiver_start :][: s.length]) for s in sections]
    assert got == [("First shared paragraph here.",) * 2, ("Second shared paragraph.",) * 2]
    assert shared_sections("abc", "xyz", ["abc"]) == []  # nothing shared: no transfer


def test_layers_align_by_relative_depth_within_eligible_layers() -> None:
    assert align_layers(2, 10, width=1) == [[2], [7]]
    assert align_layers(4, 18, eligible=[5, 11, 17], width=1) == [[5], [5], [11], [17]]
    assert all(len(w) == 3 for w in align_layers(30, 24))


def test_ridge_recovers_an_affine_map_and_recolour_keeps_covariance() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4000, 8, generator=g)
    a, b = torch.randn(8, 5, generator=g), torch.randn(5, generator=g)
    y = x @ a + b
    w, c = ridge(x, y, 1e-8)
    torch.testing.assert_close(x @ w + c, y, atol=1e-3, rtol=1e-3)
    w2, c2 = recolour(x, y + 0.5 * torch.randn(4000, 5, generator=g))
    pred = x @ w2 + c2
    target = y + 0.5 * torch.randn(4000, 5, generator=g)
    torch.testing.assert_close(torch.cov(pred.T), torch.cov(target.T), atol=0.35, rtol=0.1)


def side(fp: str, layers: int = 2, heads: int = 1, dim: int = 4) -> Side:
    return Side(fp, fp * 8, layers, heads, dim, (1e4,) * layers)


def dense_kv(fp: str, T: int = 6, layers: int = 2, heads: int = 1, dim: int = 4) -> KVCache:
    g = torch.Generator().manual_seed(1)
    k = tuple(torch.randn(heads, T, dim, generator=g) for _ in range(layers))
    v = tuple(torch.randn(heads, T, dim, generator=g) for _ in range(layers))
    return KVCache(fp * 8, torch.arange(T), torch.arange(T), k, v, (0,) * layers)


def test_identity_adapter_reproduces_the_cache() -> None:
    kv = dense_kv("a")
    out = Adapter.identity(side("a")).apply(kv, torch.arange(6), kv.token_ids)
    for x, y in zip(out.keys + out.values, kv.keys + kv.values, strict=True):
        torch.testing.assert_close(x, y, atol=1e-6, rtol=0)


def test_unaligned_receiver_tokens_are_left_for_recompute() -> None:
    kv = dense_kv("a")
    out = Adapter.identity(side("a")).apply(kv, torch.tensor([-1, 0, 1, 2, 3, -1]), kv.token_ids)
    assert out.keys[0][:, 0].abs().sum() == 0 and out.keys[0][:, 5].abs().sum() == 0


def test_artifact_round_trip_and_refusals(tmp_path: Path) -> None:
    g = torch.Generator().manual_seed(2)
    maps = [LayerMap(*(torch.randn(s, generator=g) for s in ((8, 4), (4,), (8, 4), (4,)))) for _ in range(2)]
    adapter = Adapter(Manifest("kv-ridge", "v1", side("s", dim=4), side("r"), ((0, 1), (0, 1))), maps)
    adapter.save(tmp_path / "ad")
    loaded = Adapter.load(tmp_path / "ad", sender_fingerprint="s" * 8, receiver_fingerprint="r" * 8)
    kv = dense_kv("s")
    a, b = adapter.apply(kv, torch.arange(6), kv.token_ids), loaded.apply(kv, torch.arange(6), kv.token_ids)
    assert all(torch.equal(x, y) for x, y in zip(a.keys + a.values, b.keys + b.values, strict=True))
    with pytest.raises(FingerprintMismatch, match="receiver"):
        Adapter.load(tmp_path / "ad", sender_fingerprint="s" * 8, receiver_fingerprint="x" * 8)
    with pytest.raises(FingerprintMismatch):
        adapter.apply(dense_kv("x"), torch.arange(6), kv.token_ids)
    weights = tmp_path / "ad" / "adapter.safetensors"
    blob = bytearray(weights.read_bytes())
    blob[-3] ^= 0xFF
    weights.write_bytes(bytes(blob))
    with pytest.raises(AdapterError, match="sha256"):
        Adapter.load(tmp_path / "ad", sender_fingerprint="s" * 8, receiver_fingerprint="r" * 8)


def test_sections_map_receiver_tokens_only_inside_shared_text() -> None:
    src = align_tokens([(0, 3), (3, 6)], [(0, 2), (2, 4), (4, 6), (6, 9)], [Section(0, 2, 4)])
    assert src.tolist() == [-1, 0, 1, -1]


def test_identity_adapter_saves_and_loads(tmp_path: Path) -> None:
    s = side("a")
    Adapter.identity(s).save(tmp_path / "id")
    loaded = Adapter.load(tmp_path / "id", sender_fingerprint=s.fingerprint, receiver_fingerprint=s.fingerprint)
    assert loaded.manifest.method == "identity"


def test_map_dtype_follows_the_host_unless_pinned(monkeypatch: pytest.MonkeyPatch) -> None:
    from heterofold.adapter import map_dtype

    cpu = torch.device("cpu")
    monkeypatch.delenv("HETEROFOLD_MAP_DTYPE", raising=False)
    host = torch.bfloat16 if torch.cpu._is_avx512_bf16_supported() else torch.float32
    assert map_dtype(cpu) == host
    for name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        monkeypatch.setenv("HETEROFOLD_MAP_DTYPE", name)
        assert map_dtype(cpu) == dtype
    monkeypatch.setenv("HETEROFOLD_MAP_DTYPE", "float16")
    with pytest.raises(AdapterError, match="float32 or bfloat16"):
        map_dtype(cpu)


def test_eval_refuses_an_unknown_map_dtype_before_loading_anything() -> None:
    from typer.testing import CliRunner

    from cli import app

    args = ["eval", "--sender", "a", "--receiver", "b", "--data", "builtin", "--map-dtype", "float16"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and "--map-dtype takes host, float32 or bfloat16" in result.output
