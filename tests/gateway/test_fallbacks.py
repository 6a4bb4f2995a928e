"""Every failure in the reuse and transfer path falls back to native prefill: the request succeeds,
and a metric and a ``transfer.fallback`` event say why."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from engines.errors import KVMismatch
from engines.local import LocalEngine
from gateway.registry import versions
from gateway.settings import StoreSettings
from heterofold.adapter import Adapter, LayerMap, Side
from heterofold.kv import KVCache
from store.redis_server import EmbeddedRedis
from tests.gateway.conftest import GEMMA, SMOL, Gateway
from tests.gateway.helpers import CONTEXT, ask, cross_hop, upload

pytestmark = pytest.mark.models


def fallback_events(gateway: Gateway) -> list[dict[str, str]]:
    events = gateway.services.store.events.read(count=1000)
    return [e.fields for e in events if e.kind == "transfer.fallback"]


def test_transfer_falls_back_to_prefill_when_redis_is_down(start_gateway, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    redis_server = EmbeddedRedis(tmp_path / "own-redis").start()
    try:
        gateway: Gateway = start_gateway(store=StoreSettings(redis_url=redis_server.url))
        ask(gateway, "executor", [{"role": "user", "content": CONTEXT}], "conv-redis")
        gateway.settle()
        redis_server.stop()
        reply, hf, cached = ask(gateway, "reviewer", [{"role": "user", "content": f"{CONTEXT}\n\nCheck it."}],
                                "conv-redis")  # fmt: skip
        assert reply and hf["path"] == "native" and cached == 0 and hf["fallback"] == "StoreUnavailable"
        with gateway.http(None) as http:
            assert http.get("/health/ready").status_code == 503
            metrics = http.get("/metrics").text
        assert 'heterofold_transfer_fallbacks_total{reason="StoreUnavailable",stage="prefix"}' in metrics
        gateway.settle()
        redis_server.start()  # the events written while Redis was down are logged, not lost silently
    finally:
        redis_server.stop()


def test_tampered_artifact_falls_back_to_native(gateway: Gateway, fitted_adapter: Path, tmp_path: Path) -> None:
    row = upload(gateway, fitted_adapter)
    weights = Path(row["artifact_path"]) / "adapter.safetensors"
    blob = bytearray(weights.read_bytes())
    blob[-1] ^= 0xFF
    weights.write_bytes(bytes(blob))
    hf = cross_hop(gateway, "conv-tampered")
    assert hf["path"] == "native" and hf["fallback"] == "AdapterError"
    assert any(e["reason"] == "AdapterError" and e["stage"] == "transfer" for e in fallback_events(gateway))


def test_adapter_for_other_fingerprints_falls_back_to_native(
    gateway: Gateway, load_engine: Callable[[str], LocalEngine], tmp_path: Path
) -> None:
    smol, gemma = load_engine(SMOL).spec, load_engine(GEMMA).spec
    folder = tmp_path / "identity"
    identity = Adapter.identity(Side.of(smol), "mislabelled")  # made for smollm2 -> smollm2
    maps = [LayerMap(*(t.clone() for t in (m.k_weight, m.k_bias, m.v_weight, m.v_bias))) for m in identity.maps]
    sha = Adapter(identity.manifest, maps).save(folder)  # identity's layers share one tensor; saving needs copies
    with gateway.services.db.session() as session:  # registered as if it were smollm2 -> gemma3
        row = versions.create_adapter(
            session=session, sender_name=smol.name, receiver_name=gemma.name, sender_fingerprint=smol.fingerprint,
            receiver_fingerprint=gemma.fingerprint, version="mislabelled", method="identity",
            artifact_path=str(folder), sha256=sha, metrics={}, actor="test",
        )  # fmt: skip
        versions.promote(session=session, adapter_id=row.id, actor="test")
    hf = cross_hop(gateway, "conv-mismatch")
    assert hf["path"] == "native" and hf["fallback"] == "FingerprintMismatch"
    assert any(e["reason"] == "FingerprintMismatch" for e in fallback_events(gateway))


def test_a_defect_inside_the_transfer_path_answers_natively_and_is_recorded(
    gateway: Gateway, fitted_adapter: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Not one of the expected failures (store, method, engine, registry): a bug, here an
    IndexError raised where the map runs. The request still answers, natively, and says why."""

    async def broken(*args: object, **kwargs: object) -> object:
        raise IndexError("list index out of range")

    upload(gateway, fitted_adapter)
    monkeypatch.setattr("gateway.hop.transfer", broken)
    hf = cross_hop(gateway, "conv-defect")
    assert hf["path"] == "native" and hf["fallback"] == "IndexError"
    assert any(e["reason"] == "IndexError" and e["stage"] == "transfer" for e in fallback_events(gateway))
    assert any(r.levelname == "ERROR" and "transfer path failed" in r.getMessage() for r in caplog.records)


def test_an_engine_that_refuses_the_planned_kv_answers_natively_and_is_recorded(
    gateway: Gateway, fitted_adapter: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine raises ``KVMismatch`` on the transferred KV before its first token: the planner's
    ``refused`` turns the plan native, the turn is prefilled from the original prompt, and the
    fallback is recorded at stage ``engine`` (a metric and an event)."""
    upload(gateway, fitted_adapter)
    receiver = gateway.services.pool[GEMMA].engine
    real, offered = receiver.stream, []

    def refusing(ids: Any, params: Any, *, past: KVCache | None = None, export: Any = "none") -> AsyncIterator[Any]:
        offered.append(past is not None)
        if past is None:
            return real(ids, params, past=past, export=export)

        async def refuse() -> AsyncIterator[Any]:
            raise KVMismatch("this engine refuses the imported KV (test)")
            yield  # an async generator, as the engine's stream is

        return refuse()

    monkeypatch.setattr(receiver, "stream", refusing)
    hf = cross_hop(gateway, "conv-refused")
    assert offered == [True, False]  # the transferred KV was offered once, then the native prompt
    assert hf["path"] == "native" and hf["fallback"] == "KVMismatch"
    assert any(e["reason"] == "KVMismatch" and e["stage"] == "engine" for e in fallback_events(gateway))
    with gateway.http(None) as http:
        assert 'heterofold_transfer_fallbacks_total{reason="KVMismatch",stage="engine"}' in http.get("/metrics").text
