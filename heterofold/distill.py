"""End-to-end distillation of an adapter's maps through the frozen receiver.

A ridge map predicts each receiver K/V row from the aligned sender rows (held-out R² ~0.5-0.6),
but what the receiver needs is to *behave* as with its native cache. Distillation starts from a
fitted adapter and moves its maps to minimise KL(native || mapped) of the receiver's next-token
distributions over answer tokens that follow the context, with the context's KV mapped (and the
selected tokens native, as selective recompute leaves them). Only the short continuation runs
with gradients; the context is never recomputed.

The parameters are a low-rank residual per receiver layer on the key and value maps plus their
biases (LoRA-style, ``rank`` columns, the residual starting at zero so step 0 is the ridge map)::

    W_k' = W_k + A_k @ B_k      (F, r) @ (r, H_r * D_r)
    b_k' = b_k + c_k

and the same for values. With ``gates``, each receiver layer also learns a log-scale per KV head
for the mapped keys and one for the mapped values (starting at 0, a scale of 1): a mapped key
scaled by ``exp(g)`` scales every query's attention logit on that token by ``exp(g)``, so the key
gate is a per-head attention temperature for mapped tokens, and the value gate says how much of a
mapped token's value the head takes in. Both are diagonal per head, which a low-rank residual
cannot express, and both fold into the map's columns. An adapter with a token map
(``heterofold.adapter.TokenMap``) keeps its token weights as fitted (scaled by the gates too), or,
with ``token``, learns a full residual on them as well (``(r_tok, H_r * D_r)`` per layer, starting
at zero, in units of the weights' RMS), since the token map reads only ``r_tok`` components.
``fold()`` returns plain affine ``LayerMap``s: applying a distilled adapter costs exactly what
applying the ridge map does. This module is pure torch: the receiver's forward pass is the
caller's (``harness.distill_on_engines``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from heterofold.adapter import Adapter, LayerMap, Manifest
from heterofold.kv import KVCache
from heterofold.rope import apply_rope


@dataclass(frozen=True)
class DistillDoc:
    """One training example, everything but the map fixed (no gradients)."""

    x_k: tuple[torch.Tensor, ...]  # per receiver layer (N, F_l): content-space sender key features
    x_v: tuple[torch.Tensor, ...]  # per receiver layer (N, F_l)
    mapped: torch.Tensor  # (N,) receiver positions whose KV comes from the map
    native_k: tuple[torch.Tensor, ...]  # per receiver layer (H_r, T, D_r): native KV, used where not mapped
    native_v: tuple[torch.Tensor, ...]
    token_ids: torch.Tensor  # (T,) receiver context prompt tokens
    suffix: torch.Tensor  # (S,) receiver tokens after the context: question, template, answer
    answer_rows: slice  # rows of the suffix's logits that predict the answer tokens
    target: torch.Tensor  # (A, V) native log-probabilities at those rows
    z: torch.Tensor | None = None  # (N, r) token components of the mapped rows, for an adapter with a token map


def doc_features(
    adapter: Adapter,
    sender_kv: KVCache,
    src: torch.Tensor,
    receiver_ids: torch.Tensor | None = None,
    embeddings: torch.Tensor | None = None,
) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...], torch.Tensor, torch.Tensor | None]:
    """Per receiver layer ``(N, F_l)`` sender key and value features of the aligned receiver tokens
    (``src >= 0``), with the same features as ``Adapter.apply`` reads, their positions ``(N,)``,
    and, for an adapter with a token map, their token components ``(N, r)`` (which need the
    receiver's tokens ``receiver_ids`` and input ``embeddings``)."""
    feats = adapter.features(sender_kv, src, torch.float32)
    pairs = [feats.get(layers) for layers in adapter.manifest.sender_layers]
    z = None
    if adapter.token is not None:
        if receiver_ids is None or embeddings is None:
            raise ValueError("an adapter with a token map needs the receiver's tokens and embeddings")
        z = adapter.token.project(embeddings, receiver_ids)[feats.at]
    return tuple(k for k, _ in pairs), tuple(v for _, v in pairs), feats.at, z


class LowRankResidual(torch.nn.Module):
    """Trainable low-rank residuals on every layer's K and V maps of ``adapter`` (module docstring)."""

    def __init__(
        self, adapter: Adapter, rank: int = 8, seed: int = 0, gates: bool = False, token: bool = False
    ) -> None:
        super().__init__()
        if rank < 1:
            raise ValueError(f"rank must be at least 1, got {rank}")
        if token and adapter.token is None:
            raise ValueError("a token residual needs an adapter with a token map (fit --token-rank)")
        self.adapter = adapter
        self.gates = gates
        self.token = token
        r = adapter.manifest.receiver
        # per layer, per receiver KV head: log-scales of the mapped keys and values (module docstring)
        self.g_k = torch.nn.Parameter(torch.zeros(r.num_layers, r.num_kv_heads), requires_grad=gates)
        self.g_v = torch.nn.Parameter(torch.zeros(r.num_layers, r.num_kv_heads), requires_grad=gates)
        g = torch.Generator().manual_seed(seed)
        self.a_k, self.b_k, self.c_k = torch.nn.ParameterList(), torch.nn.ParameterList(), torch.nn.ParameterList()
        self.a_v, self.b_v, self.c_v = torch.nn.ParameterList(), torch.nn.ParameterList(), torch.nn.ParameterList()
        for mp in adapter.maps:
            F, out = mp.k_weight.shape  # the same for values
            for a, b, c in ((self.a_k, self.b_k, self.c_k), (self.a_v, self.b_v, self.c_v)):
                # A random, B zero: the residual starts at zero and A @ B stays near W's scale
                a.append(torch.nn.Parameter(torch.randn(F, rank, generator=g) / F**0.5))
                b.append(torch.nn.Parameter(torch.zeros(rank, out)))
                c.append(torch.nn.Parameter(torch.zeros(out)))
        # with ``token``: a full residual on the token map's weights, zero at the start, in units of
        # their RMS (Adam's steps are per element: raw, its lr would dwarf weights of RMS 1e-3)
        self.d_k, self.d_v = torch.nn.ParameterList(), torch.nn.ParameterList()
        self.token_scale: list[tuple[float, float]] = []
        for mp in adapter.maps if token else ():
            if mp.k_token is None or mp.v_token is None:
                raise ValueError("a token residual needs token weights in every layer")
            self.d_k.append(torch.nn.Parameter(torch.zeros_like(mp.k_token)))
            self.d_v.append(torch.nn.Parameter(torch.zeros_like(mp.v_token)))
            self.token_scale.append((_rms(mp.k_token), _rms(mp.v_token)))

    def layer(self, layer: int) -> LayerMap:
        """The effective map of receiver layer ``layer``."""
        mp = self.adapter.maps[layer]
        wk = mp.k_weight + self.a_k[layer] @ self.b_k[layer]
        wv = mp.v_weight + self.a_v[layer] @ self.b_v[layer]
        bk, bv = mp.k_bias + self.c_k[layer], mp.v_bias + self.c_v[layer]
        tk, tv = mp.k_token, mp.v_token
        if self.token and tk is not None and tv is not None:
            uk, uv = self.token_scale[layer]
            tk, tv = tk + uk * self.d_k[layer], tv + uv * self.d_v[layer]
        if not self.gates:
            return LayerMap(wk, bk, wv, bv, tk, tv)
        D = self.adapter.manifest.receiver.head_dim
        sk = self.g_k[layer].exp().repeat_interleave(D)  # (H_r * D_r,): one scale per head's columns
        sv = self.g_v[layer].exp().repeat_interleave(D)
        return LayerMap(wk * sk, bk * sk, wv * sv, bv * sv,
                        None if tk is None else tk * sk, None if tv is None else tv * sv)  # fmt: skip

    def context_kv(self, doc: DistillDoc) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """The receiver's context KV for ``doc``: mapped rows where ``doc.mapped``, native elsewhere.
        Per layer ``(H_r, T, D_r)``, keys after RoPE, differentiable in the parameters."""
        m = self.adapter.manifest
        H, D = m.receiver.num_kv_heads, m.receiver.head_dim
        keys, values = [], []
        for layer in range(m.receiver.num_layers):
            mp = self.layer(layer)
            k, v = doc.x_k[layer] @ mp.k_weight + mp.k_bias, doc.x_v[layer] @ mp.v_weight + mp.v_bias  # (N, H*D)
            if doc.z is not None and mp.k_token is not None and mp.v_token is not None:
                k, v = k + doc.z @ mp.k_token, v + doc.z @ mp.v_token
            k, v = k.reshape(-1, H, D).transpose(0, 1), v.reshape(-1, H, D).transpose(0, 1)  # (H, N, D)
            k = apply_rope(k, doc.mapped, m.receiver.rope_thetas[layer])
            keys.append(doc.native_k[layer].index_copy(1, doc.mapped, k))
            values.append(doc.native_v[layer].index_copy(1, doc.mapped, v))
        return keys, values

    def penalty(self) -> torch.Tensor:
        """Squared size of the residual relative to the maps it corrects (keeps it small)."""
        total = torch.zeros(())
        for layer, mp in enumerate(self.adapter.maps):
            for a, b, w in ((self.a_k, self.b_k, mp.k_weight), (self.a_v, self.b_v, mp.v_weight)):
                total = total + (a[layer] @ b[layer]).pow(2).sum() / w.pow(2).sum()
            if self.token:  # the residual relative to the token weights: its RMS units cancel
                total = total + self.d_k[layer].pow(2).mean() + self.d_v[layer].pow(2).mean()
        return total / len(self.adapter.maps)

    @torch.no_grad()
    def fold(self, method: str, version: str, fit: dict[str, object], metrics: dict[str, object]) -> Adapter:
        """A plain adapter with the residuals folded into its affine maps."""
        m = self.adapter.manifest

        def frozen(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.detach().clone()

        maps = []
        for i in range(m.receiver.num_layers):
            mp = self.layer(i)
            maps.append(LayerMap(mp.k_weight.detach().clone(), mp.k_bias.detach().clone(), mp.v_weight.detach().clone(),
                                 mp.v_bias.detach().clone(), frozen(mp.k_token), frozen(mp.v_token)))  # fmt: skip
        manifest = Manifest(method, version, m.sender, m.receiver, m.sender_layers, fit=fit, metrics=metrics,
                            token_lags=m.token_lags, token_rank=m.token_rank)  # fmt: skip
        return Adapter(manifest, maps, self.adapter.token)


def _rms(t: torch.Tensor) -> float:
    return max(float(t.pow(2).mean().sqrt()), 1e-12)


def kl_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean over rows of KL(target || softmax(logits)); ``target`` holds log-probabilities ``(A, V)``."""
    logp = torch.log_softmax(logits.float(), -1)
    return (target.exp() * (target - logp)).sum(-1).mean()


def split_docs(n: int, held: int) -> tuple[Sequence[int], Sequence[int]]:
    """Indices of training and held-out documents: the last ``held`` of ``n`` are held out."""
    held = min(held, n - 1) if n > 1 else 0
    return range(n - held), range(n - held, n)
