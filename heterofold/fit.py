"""Fitting adapters from aligned KV pairs. Pure tensors in, an ``Adapter`` out; both models frozen.

``FitData`` stacks, over fit documents, the content-space (RoPE stripped) K and V of every
eligible sender layer at the aligned sender tokens, and of every receiver layer at the receiver
tokens. One document in five (the last of 2-4) is held out to choose the ridge strength and to report fidelity.

- ``kv-ridge`` (the baseline): per receiver layer, rank the eligible sender layers by the held-out
  R² of a single-layer ridge fit, take the top ``k``, fit a closed-form ridge on them.
- with ``token_rank`` r (KV Ridge only), each layer's ridge also reads the receiver's own token
  features (``heterofold.features.token_features``: the token's input embedding and the previous
  tokens'), projected once onto their top r principal components, whitened (``TokenMap``). The
  sender's cache carries token identity only through its own, lossy, representation; the
  receiver's embedding of the token is exact and costs a lookup.
- ``heterofold``: per receiver layer, the sender layers nearest in relative depth, an affine
  initial map, then calibration (``calibrate_adapter``) on the receiver's own attention.
  The initial map is a ridge fit (``init="ridge"``, the default) or re-colouring
  (``init="recolour"``: whiten both sides, rotate with orthogonal Procrustes, re-colour with the
  receiver's covariance, so mapped keys and values keep the receiver's statistics). Measured on
  smollm2 to gemma3 (BENCHMARKS.md), re-colouring made the transferred first-token KL worse
  (1.34 against ridge's 0.70 with no recompute), so ridge is the default.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from heterofold.adapter import Adapter, LayerMap, Manifest, Side, TokenMap
from heterofold.align import align_layers
from heterofold.calibrate import CalibDoc, calibrate_keys, calibrate_values
from heterofold.errors import AdapterError
from heterofold.features import SenderFeatures, token_features
from heterofold.kv import KVCache
from heterofold.rope import strip_rope

ALPHAS = (1e-4, 1e-3, 1e-2, 1e-1, 1.0)
RANK_ROWS = 4000  # ridge strength, relative to the mean feature variance
Progress = Callable[[str, int, int], None]


@dataclass(frozen=True)
class FitPair:
    sender: KVCache  # dense, or at least complete on the eligible sender layers
    receiver: KVCache  # dense
    src: torch.Tensor  # (T_r,) sender token per receiver token, -1 where none
    queries: tuple[torch.Tensor, ...] = ()  # per receiver layer (H_q, T_r, D), after RoPE; for calibration


@dataclass
class FitData:
    sender_k: dict[int, torch.Tensor]  # eligible sender layer -> (N, H_s * D_s), content space
    sender_v: dict[int, torch.Tensor]
    receiver_k: list[torch.Tensor]  # per receiver layer (N, H_r * D_r), content space
    receiver_v: list[torch.Tensor]
    held_out: torch.Tensor  # (N,) bool
    token_feats: torch.Tensor | None = None  # (N, lags * d_r) receiver token features, when stacked with embeddings
    token_lags: int = 0

    @property
    def tokens(self) -> int:
        return int(self.held_out.numel())

    def features(self, layers: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V features ``(N, len(layers) * H_s * D_s)`` of the sender ``layers``, in that order."""
        return torch.cat([self.sender_k[s] for s in layers], 1), torch.cat([self.sender_v[s] for s in layers], 1)


def is_held_out(d: int, n: int) -> bool:
    """Document ``d`` of ``n`` is held out: one in five (the fifth, tenth, ...), or the last one when
    there are 2-4 documents, so every fit with more than one document reports held-out fidelity."""
    if n < 2:
        return False
    return d % 5 == 4 or (n < 5 and d == n - 1)


def stack_pairs(
    pairs: Sequence[FitPair],
    sender: Side,
    receiver: Side,
    eligible: Sequence[int],
    *,
    embeddings: torch.Tensor | None = None,
    lags: int = 2,
) -> FitData:
    """The fit pairs' aligned rows; with the receiver's input ``embeddings`` ``(V, d_r)``, also
    its token features with ``lags`` tokens per row (what a token map reads)."""
    sk: dict[int, list[torch.Tensor]] = {s: [] for s in eligible}
    sv: dict[int, list[torch.Tensor]] = {s: [] for s in eligible}
    rk: list[list[torch.Tensor]] = [[] for _ in range(receiver.num_layers)]
    rv: list[list[torch.Tensor]] = [[] for _ in range(receiver.num_layers)]
    held, toks = [], []
    for d, p in enumerate(pairs):
        if not p.receiver.is_dense:
            raise AdapterError("fitting needs dense receiver KV values")
        feats = SenderFeatures(p.sender, p.src, sender.rope_thetas, eligible)
        r_idx = feats.at  # (N_d,)
        for s in eligible:
            k, v = feats.get((s,))  # (N_d, H_s * D_s) each
            sk[s].append(k)
            sv[s].append(v)
        for layer in range(receiver.num_layers):
            k = strip_rope(p.receiver.keys[layer][:, r_idx], r_idx, receiver.rope_thetas[layer])
            rk[layer].append(k.transpose(0, 1).reshape(len(r_idx), -1))
            rv[layer].append(p.receiver.values[layer][:, r_idx].transpose(0, 1).reshape(len(r_idx), -1))
        held.append(torch.full((len(r_idx),), is_held_out(d, len(pairs))))
        if embeddings is not None:
            toks.append(token_features(embeddings, p.receiver.token_ids, lags)[r_idx])
    return FitData(
        sender_k={s: torch.cat(x) for s, x in sk.items()},
        sender_v={s: torch.cat(x) for s, x in sv.items()},
        receiver_k=[torch.cat(x) for x in rk],
        receiver_v=[torch.cat(x) for x in rv],
        held_out=torch.cat(held),
        token_feats=torch.cat(toks) if toks else None,
        token_lags=lags if toks else 0,
    )


# ---- closed-form maps ------------------------------------------------------------------------


def ridge(x: torch.Tensor, y: torch.Tensor, alpha: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Affine ``y ≈ x @ W + b`` by ridge; ``alpha`` is relative to the mean feature variance."""
    x64, y64 = x.double(), y.double()
    mx, my = x64.mean(0), y64.mean(0)
    xc, yc = x64 - mx, y64 - my
    gram = xc.T @ xc  # (F, F)
    lam = alpha * float(gram.diagonal().mean())
    w = torch.linalg.solve(gram + lam * torch.eye(gram.shape[0], dtype=torch.float64), xc.T @ yc)  # (F, O)
    return w.float(), (my - mx @ w).float()


def fit_token_map(tokens: torch.Tensor, lags: int, rank: int, eps: float = 1e-6) -> TokenMap:
    """The top ``rank`` principal components of token features ``(N, lags * d)``, whitened: each
    component of ``TokenMap.components`` has unit variance on ``tokens``."""
    if not 1 <= rank <= tokens.shape[1]:
        raise AdapterError(f"token rank must be 1..{tokens.shape[1]}, got {rank}")
    x = tokens.double()
    mean = x.mean(0)
    xc = x - mean
    evals, evecs = torch.linalg.eigh(xc.T @ xc / len(x))  # ascending
    top, vecs = evals.flip(0)[:rank], evecs.flip(1)[:, :rank]
    proj = vecs / top.clamp(min=eps * float(evals.max())).sqrt()
    return TokenMap(lags, mean.float(), proj.float())


def _sqrt_and_inv_sqrt(cov: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    evals, evecs = torch.linalg.eigh(cov)
    evals = evals.clamp(min=eps * float(evals.max()))
    return (evecs * evals.sqrt()) @ evecs.T, (evecs * evals.rsqrt()) @ evecs.T


def recolour(x: torch.Tensor, y: torch.Tensor, eps: float = 1e-4) -> tuple[torch.Tensor, torch.Tensor]:
    """Whiten ``x``, rotate onto whitened ``y`` (orthogonal Procrustes), re-colour with ``y``'s
    covariance: the mapped values have exactly ``y``'s mean and covariance on the fit data."""
    x64, y64 = x.double(), y.double()
    mx, my = x64.mean(0), y64.mean(0)
    xc, yc = x64 - mx, y64 - my
    n = x64.shape[0]
    _, wx = _sqrt_and_inv_sqrt(xc.T @ xc / n, eps)  # (F, F) whitening
    cy, wy = _sqrt_and_inv_sqrt(yc.T @ yc / n, eps)  # (O, O) colouring and whitening
    u, _, vh = torch.linalg.svd((xc @ wx).T @ (yc @ wy), full_matrices=False)  # (F, O) cross-covariance
    w = wx @ (u @ vh) @ cy  # (F, O)
    return w.float(), (my - mx @ w).float()


def r2(pred: torch.Tensor, y: torch.Tensor) -> float:
    resid = ((pred - y) ** 2).sum()
    total = ((y - y.mean(0)) ** 2).sum()
    return float(1 - resid / total)


# ---- whole adapters --------------------------------------------------------------------------


def _fit_ridge(x: torch.Tensor, y: torch.Tensor, held: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Ridge with the strength chosen on held-out rows, refitted on all rows; returns held-out R²."""
    if not held.any():
        w, b = ridge(x, y, 1e-2)
        return w, b, float("nan")
    scores = []
    for alpha in ALPHAS:
        w, b = ridge(x[~held], y[~held], alpha)
        scores.append((r2(x[held] @ w + b, y[held]), alpha))
    best, alpha = max(scores)
    w, b = ridge(x, y, alpha)
    return w, b, best


def fit_adapter(
    data: FitData,
    sender: Side,
    receiver: Side,
    eligible: Sequence[int],
    *,
    method: str,
    version: str,
    width: int = 3,
    init: str = "ridge",
    token_rank: int = 0,
    fit_info: dict[str, object] | None = None,
    progress: Progress | None = None,
) -> Adapter:
    if method not in ("kv-ridge", "heterofold"):
        raise AdapterError(f"unknown method {method!r}: kv-ridge or heterofold")
    token, z = None, None
    if token_rank:
        if method != "kv-ridge":
            raise AdapterError("a token map is fitted with kv-ridge only (calibration does not read it)")
        if data.token_feats is None:
            raise AdapterError("a token map needs token features: stack the pairs with the receiver's embeddings")
        train_rows = ~data.held_out if data.held_out.any() else torch.ones_like(data.held_out)
        token = fit_token_map(data.token_feats[train_rows], data.token_lags, token_rank)
        z = token.components(data.token_feats)  # (N, r), unit variance per component
    if init not in ("ridge", "recolour"):
        raise AdapterError(f"unknown initial map {init!r}: ridge or recolour")
    t0 = time.perf_counter()
    held = data.held_out
    by_depth = align_layers(receiver.num_layers, sender.num_layers, eligible, width)
    maps, chosen, k_scores, v_scores = [], [], [], []
    for layer in range(receiver.num_layers):
        yk, yv = data.receiver_k[layer], data.receiver_v[layer]
        tk: torch.Tensor | None = None  # token weights: only a token map's joint fit sets them
        tv: torch.Tensor | None = None
        if method == "kv-ridge":
            ranked = sorted(eligible, key=lambda s: -_single_r2(data, s, yk, yv, held))
            layers = tuple(sorted(ranked[:width]))
            xk, xv = data.features(layers)
            if z is None:
                wk, bk, sk = _fit_ridge(xk, yk, held)
                wv, bv, sv = _fit_ridge(xv, yv, held)
            else:
                (wk, bk, sk, tk), (wv, bv, sv, tv) = (_fit_joint(x, z, y, held) for x, y in ((xk, yk), (xv, yv)))
        elif init == "ridge":
            layers = tuple(by_depth[layer])
            xk, xv = data.features(layers)
            wk, bk, sk = _fit_ridge(xk, yk, held)
            wv, bv, sv = _fit_ridge(xv, yv, held)
        else:
            layers = tuple(by_depth[layer])
            xk, xv = data.features(layers)
            train = ~held if held.any() else torch.ones_like(held)
            wk, bk = recolour(xk[train], yk[train])
            wv, bv = recolour(xv[train], yv[train])
            sk = r2(xk[held] @ wk + bk, yk[held]) if held.any() else float("nan")
            sv = r2(xv[held] @ wv + bv, yv[held]) if held.any() else float("nan")
            wk, bk = recolour(xk, yk)
            wv, bv = recolour(xv, yv)
        maps.append(LayerMap(wk, bk, wv, bv, tk, tv))
        chosen.append(layers)
        k_scores.append(sk)
        v_scores.append(sv)
        if progress:
            progress("fit", layer + 1, receiver.num_layers)
    metrics = {
        "held_out_r2_k": [round(s, 4) for s in k_scores],
        "held_out_r2_v": [round(s, 4) for s in v_scores],
        "mean_r2_k": round(sum(k_scores) / len(k_scores), 4),
        "mean_r2_v": round(sum(v_scores) / len(v_scores), 4),
    }
    info = {**(fit_info or {}), "tokens": data.tokens, "map_fit_s": round(time.perf_counter() - t0, 2)}
    lags, rank = (token.lags, token_rank) if token is not None else (0, 0)
    manifest = Manifest(method, version, sender, receiver, tuple(chosen), fit=info, metrics=metrics,
                        token_lags=lags, token_rank=rank)  # fmt: skip
    return Adapter(manifest, maps, token)


def _fit_joint(
    x: torch.Tensor, z: torch.Tensor, y: torch.Tensor, held: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, float, torch.Tensor]:
    """Ridge on the sender features ``x`` and the token components ``z`` together, ``z`` scaled to
    ``x``'s mean column variance so one ridge strength fits both; the scale is folded back into
    the token weights. Returns ``(W_x, b, held-out R², W_z)``."""
    scale = float(x.var(0).mean().sqrt())  # z's columns have unit variance
    w, b, score = _fit_ridge(torch.cat([x, scale * z], 1), y, held)
    F = x.shape[1]
    return w[:F].contiguous(), b, score, (scale * w[F:]).contiguous()


def _single_r2(data: FitData, s: int, yk: torch.Tensor, yv: torch.Tensor, held: torch.Tensor) -> float:
    """Held-out R² (K plus V) of sender layer ``s`` alone, on every k-th row (at most about
    ``RANK_ROWS``): ranking needs an order, not the last digit, and runs for every layer pair."""
    step = max(len(held) // RANK_ROWS, 1)
    rows = torch.arange(0, len(held), step)
    train = rows[~held[rows]] if held.any() else rows
    test = rows[held[rows]] if held.any() else rows
    total = 0.0
    for x, y in ((data.sender_k[s], yk), (data.sender_v[s], yv)):
        w, b = ridge(x[train], y[train], 1e-2)
        total += r2(x[test] @ w + b, y[test])
    return total


def calibrate_adapter(
    adapter: Adapter,
    pairs: Sequence[FitPair],
    windows: Sequence[int],
    scale: float,
    *,
    docs: int = 6,
    seed: int = 0,
    progress: Progress | None = None,
) -> Adapter:
    """HeteroFold's calibration step (``heterofold.calibrate``) on every receiver layer, fitted on
    up to ``docs`` training documents and scored by attention KL on the held-out ones."""
    m = adapter.manifest
    train = [p for i, p in enumerate(pairs) if not is_held_out(i, len(pairs))][:docs]
    held = [p for i, p in enumerate(pairs) if is_held_out(i, len(pairs))][:2]
    if not train or not all(p.queries for p in train + held):
        raise AdapterError("calibration needs fit pairs with receiver queries")
    maps: list[LayerMap] = []
    kl_before: list[float] = []
    kl_after: list[float] = []
    for layer, (mp, src_layers) in enumerate(zip(adapter.maps, m.sender_layers, strict=True)):
        theta, window = m.receiver.rope_thetas[layer], windows[layer]
        tr = [_calib_doc(p, layer, src_layers, m.sender) for p in train]
        wk, bk, _, _ = calibrate_keys(tr, mp.k_weight, mp.k_bias, theta=theta, window=window, scale=scale, seed=seed)
        wv, bv = calibrate_values(tr, mp.v_weight, mp.v_bias, window=window, scale=scale, seed=seed)
        if held:
            ho = [_calib_doc(p, layer, src_layers, m.sender) for p in held]
            for w, b, out in ((mp.k_weight, mp.k_bias, kl_before), (wk, bk, kl_after)):
                score = calibrate_keys(ho, w, b, theta=theta, window=window, scale=scale, steps=0, seed=seed + 7)
                out.append(score[2])
        maps.append(LayerMap(wk, bk, wv, bv))
        if progress:
            progress("calibrate", layer + 1, len(adapter.maps))
    metrics = dict(m.metrics)
    if kl_before:
        metrics["held_out_attention_kl_before_calibration"] = [round(x, 4) for x in kl_before]
        metrics["held_out_attention_kl_after_calibration"] = [round(x, 4) for x in kl_after]
        metrics["mean_attention_kl_before"] = round(sum(kl_before) / len(kl_before), 4)
        metrics["mean_attention_kl_after"] = round(sum(kl_after) / len(kl_after), 4)
    manifest = Manifest(m.method, m.version, m.sender, m.receiver, m.sender_layers, fit=m.fit, metrics=metrics)
    return Adapter(manifest, maps)


def _calib_doc(pair: FitPair, layer: int, src_layers: tuple[int, ...], sender: Side) -> CalibDoc:
    feats = SenderFeatures(pair.sender, pair.src, sender.rope_thetas, src_layers)
    x_k, x_v = feats.get(src_layers)
    return CalibDoc(x_k, x_v, feats.at, pair.queries[layer], pair.receiver.keys[layer], pair.receiver.values[layer])
