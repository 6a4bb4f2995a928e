"""Calibration on a synthetic receiver layer: the mapped keys and values get closer to what the
native attention needs, and calibration never makes its own objective worse."""

import torch

from engines.transfer import sliding_rows
from heterofold.calibrate import CalibDoc, calibrate_keys, calibrate_values
from heterofold.rope import apply_rope


def synthetic_docs(
    n_docs: int = 3, T: int = 64, H_q: int = 4, H_kv: int = 2, D: int = 8, F: int = 12
) -> tuple[list[CalibDoc], torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    true_w = torch.randn(F, H_kv * D, generator=g) / F**0.5
    docs = []
    for _ in range(n_docs):
        x = torch.randn(T, F, generator=g)
        idx = torch.arange(T)
        content = (x @ true_w).reshape(T, H_kv, D).transpose(0, 1)  # (H_kv, T, D)
        keys = apply_rope(content, idx, 1e4)
        values = (x @ true_w.flip(0)).reshape(T, H_kv, D).transpose(0, 1)
        queries = apply_rope(3 * torch.randn(H_q, T, D, generator=g), idx, 1e4)
        docs.append(CalibDoc(x, x, idx, queries, keys, values))
    return docs, true_w


def test_key_calibration_lowers_attention_kl_from_a_noisy_map() -> None:
    docs, true_w = synthetic_docs()
    g = torch.Generator().manual_seed(1)
    noisy = true_w + 0.3 * torch.randn(true_w.shape, generator=g)
    bias = torch.zeros(true_w.shape[1])
    _, _, before, after = calibrate_keys(docs, noisy, bias, theta=1e4, window=0, scale=8**-0.5, steps=80, lr=3e-2)
    assert after < 0.7 * before
    _, _, exact, _ = calibrate_keys(docs, true_w, bias, theta=1e4, window=0, scale=8**-0.5, steps=0)
    assert exact < 1e-6  # the true map has zero attention KL


def test_value_calibration_moves_toward_the_attention_output() -> None:
    docs, true_w = synthetic_docs()
    target = true_w.flip(0)
    g = torch.Generator().manual_seed(2)
    start = target + 0.5 * torch.randn(target.shape, generator=g)
    w, _ = calibrate_values(docs, start, torch.zeros(target.shape[1]), window=0, scale=8**-0.5, strength=1e-4)
    assert (w - target).norm() < 0.5 * (start - target).norm()


def test_sliding_rows_cover_windows_before_recomputed_tokens_and_the_tail() -> None:
    rows = sliding_rows((0, 4), prefix=20, chosen=[9])
    assert rows[0] is None
    assert rows[1].nonzero().squeeze(1).tolist() == [6, 7, 8, 9, 17, 18, 19]


def test_every_fit_with_two_or_more_documents_holds_one_out() -> None:
    from heterofold.fit import is_held_out

    assert [is_held_out(d, 1) for d in range(1)] == [False]
    assert [is_held_out(d, 4) for d in range(4)] == [False, False, False, True]
    assert [d for d in range(12) if is_held_out(d, 12)] == [4, 9]
