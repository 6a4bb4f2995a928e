"""The admin API: uploads, stale versions, fit jobs, and shadow evaluation with drift rollback."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from engines.local import LocalEngine
from gateway.registry import versions
from gateway.registry.tables import ShadowSampleRow
from gateway.settings import BootstrapSettings, DistillSettings, ShadowSettings
from tests.gateway.conftest import SMOL, Gateway, make_settings
from tests.gateway.helpers import CONTEXT, ask, cross_hop, saved_identity, upload

pytestmark = pytest.mark.models


def test_upload_ignores_client_file_names_and_marks_stale_versions(
    gateway: Gateway, load_engine: Callable[[str], LocalEngine], tmp_path: Path
) -> None:
    folder = saved_identity(load_engine(SMOL), tmp_path / "old", fingerprint="9" * 64)  # weights no engine runs
    files = {
        "manifest": ("../../../../etc/evil.json", (folder / "manifest.json").read_bytes()),
        "weights": ("/tmp/evil.safetensors", (folder / "adapter.safetensors").read_bytes()),
    }
    with gateway.http() as admin:
        r = admin.post("/admin/adapters", files=files)
        assert r.status_code == 201, r.text
        row = r.json()
        assert row["stale"] and row["status"] == "candidate"
        stored = Path(row["artifact_path"]).resolve()
        assert stored.is_relative_to(gateway.services.settings.adapters_dir.resolve())
        assert not Path("/etc/evil.json").exists() and not Path("/tmp/evil.safetensors").exists()
        r = admin.post(f"/admin/adapters/{row['id']}/promote")
        assert r.status_code == 409 and "stale" in r.json()["error"]["message"]
        bad = {"manifest": b"{}", "weights": b"not safetensors"}
        r = admin.post("/admin/adapters", files=bad)
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_adapter"


def test_fit_job_answers_202_reports_progress_and_registers_a_candidate(gateway: Gateway) -> None:
    with gateway.http() as admin:
        body = {"sender": SMOL, "receiver": "gemma3-270m", "method": "kv-ridge", "docs": 2, "max_tokens": 96}
        r = admin.post("/admin/fits", json=body)
        assert r.status_code == 202 and r.headers["location"] == f"/admin/fits/{r.json()['id']}"
        job = r.json()
        deadline = time.monotonic() + 600
        while job["status"] in ("queued", "running") and time.monotonic() < deadline:
            time.sleep(1)
            job = admin.get(f"/admin/fits/{job['id']}").json()
        assert job["status"] == "done", job
        assert job["progress"] == 1.0 and job["adapter_id"]
        adapters = {a["id"]: a for a in admin.get("/admin/adapters").json()}
        assert adapters[job["adapter_id"]]["status"] == "candidate" and not adapters[job["adapter_id"]]["stale"]


def test_distilled_fit_job_fits_kv_ridge_then_distils_it_for_the_configured_path(
    start_gateway: Callable[..., Gateway],
) -> None:
    distill = DistillSettings(docs=2, steps=2, path="quote")
    gateway = start_gateway(bootstrap=BootstrapSettings(distill=distill))
    with gateway.http() as admin:
        body = {"sender": SMOL, "receiver": "gemma3-270m", "method": "distilled", "docs": 2, "max_tokens": 96}
        job = admin.post("/admin/fits", json=body).json()
        deadline = time.monotonic() + 600
        while job["status"] in ("queued", "running") and time.monotonic() < deadline:
            time.sleep(1)
            job = admin.get(f"/admin/fits/{job['id']}").json()
        assert job["status"] == "done", job
        row = {a["id"]: a for a in admin.get("/admin/adapters").json()}[job["adapter_id"]]
        assert row["method"] == "distilled" and row["status"] == "candidate"
        r = admin.post("/admin/fits", json={**body, "method": "ridge"})
        assert r.status_code == 400 and "distilled" in r.json()["error"]["message"]
    fit = json.loads((Path(row["artifact_path"]) / "manifest.json").read_text())["fit"]
    assert fit["distill_path"] == "quote" and fit["steps"] == 2 and fit["distill_documents"] == 2
    assert fit["start"] == "kv-ridge" and fit["lr"] == 1e-3 and fit["clip"] == 1.0


def test_shadow_version_is_evaluated_on_live_traffic_without_serving(
    start_gateway: Callable[..., Gateway], fitted_adapter: Path
) -> None:
    gateway = start_gateway(shadow=ShadowSettings(sample_rate=0.0, shadow_rate=1.0))
    row = upload(gateway, fitted_adapter, promote=False)
    with gateway.http() as admin:
        assert admin.post(f"/admin/adapters/{row['id']}/shadow").json()["status"] == "shadow"
    hf = cross_hop(gateway, "conv-shadow")
    assert hf["path"] == "native"  # a shadow version never serves
    with gateway.http(None) as http:
        metrics = http.get("/metrics").text
    assert 'heterofold_shadow_samples_total{version="test-v1"} 1.0' in metrics
    assert 'heterofold_adapter_drift_first_token_kl{version="test-v1"}' in metrics


def test_drift_over_the_threshold_alerts_and_rolls_back(
    start_gateway: Callable[..., Gateway], fitted_adapter: Path
) -> None:
    shadow = ShadowSettings(sample_rate=1.0, shadow_rate=0.0, drift_kl_threshold=1e-9, min_samples=1,
                            auto_rollback=True)  # fmt: skip
    gateway = start_gateway(shadow=shadow)
    with gateway.http() as admin:
        files = {"manifest": (fitted_adapter / "manifest.json").read_bytes(),
                 "weights": (fitted_adapter / "adapter.safetensors").read_bytes()}  # fmt: skip
        first = admin.post("/admin/adapters", files=files, data={"version": "v1"}).json()
        second = admin.post("/admin/adapters", files=files, data={"version": "v2"}).json()
        admin.post(f"/admin/adapters/{first['id']}/promote")
        admin.post(f"/admin/adapters/{second['id']}/promote")
    gateway.services.resolver.invalidate()
    ask_hf = cross_hop_transfer(gateway)
    assert ask_hf["path"] == "transfer" and ask_hf["adapter_version"] == "v2"
    with gateway.http() as admin:
        statuses = {a["id"]: a["status"] for a in admin.get("/admin/adapters").json()}
        audit = admin.get("/admin/audit").json()
    assert statuses == {first["id"]: "active", second["id"]: "candidate"}
    assert any(a["action"] == "rollback" and a["actor"] == "auto" and a["adapter_id"] == second["id"] for a in audit)
    kinds = [e.kind for e in gateway.services.store.events.read(count=1000)]
    assert "adapter.drift" in kinds


def cross_hop_transfer(gateway: Gateway) -> dict[str, object]:
    from tests.gateway.helpers import CONTEXT, ask

    ask(gateway, "executor", [{"role": "user", "content": CONTEXT}], "conv-drift")
    gateway.settle()
    _, hf, _ = ask(gateway, "summarizer", [{"role": "user", "content": f"{CONTEXT}\n\nSummarize."}], "conv-drift")
    gateway.settle()
    return dict(hf)


def two_versions(gateway: Gateway, fitted_adapter: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The same map registered twice: ``v1`` active, ``v2`` in shadow."""
    with gateway.http() as admin:
        files = {"manifest": (fitted_adapter / "manifest.json").read_bytes(),
                 "weights": (fitted_adapter / "adapter.safetensors").read_bytes()}  # fmt: skip
        first = admin.post("/admin/adapters", files=files, data={"version": "v1"}).json()
        second = admin.post("/admin/adapters", files=files, data={"version": "v2"}).json()
        assert admin.post(f"/admin/adapters/{first['id']}/promote").json()["status"] == "active"
        assert admin.post(f"/admin/adapters/{second['id']}/shadow").json()["status"] == "shadow"
    gateway.services.resolver.invalidate()
    return first, second


def statuses(gateway: Gateway) -> dict[int, str]:
    with gateway.http() as admin:
        return {a["id"]: a["status"] for a in admin.get("/admin/adapters").json()}


@pytest.mark.parametrize("path", ["transfer", "map_quote"])
def test_a_shadow_version_is_paired_with_the_served_one_on_the_path_that_served(
    start_gateway: Callable[..., Gateway], fitted_adapter: Path, path: str
) -> None:
    """Rebuilt on the path that served the request (its prompt, spans and budget), the shadow copy
    of the served map gives the served KV: each paired sample's two answer KLs are equal. Equal is
    not better: no promotion, however few pairs the rule asks for. The request sampled for the
    serving version's own drift too gets its sample from the same evaluation."""
    roles = make_settings(Path("unused")).roles
    summarizer = roles["summarizer"]
    roles["summarizer"] = summarizer.model_copy(update={"policy": summarizer.policy.model_copy(update={"path": path})})
    shadow = ShadowSettings(sample_rate=1.0, shadow_rate=1.0, promote_min_pairs=1, promote_margin=0.0)
    gateway = start_gateway(roles=roles, shadow=shadow)
    first, second = two_versions(gateway, fitted_adapter)
    ask(gateway, "executor", [{"role": "user", "content": CONTEXT}], f"conv-{path}")
    gateway.settle()
    _, hf, cached = ask(gateway, "summarizer", [{"role": "user", "content": f"{CONTEXT}\n\nSummarize."}],
                        f"conv-{path}")  # fmt: skip
    assert hf["path"] == path and hf["adapter_version"] == "v1" and cached > 300
    gateway.settle()
    with gateway.services.db.session() as session:
        served, sample = session.scalars(select(ShadowSampleRow).order_by(ShadowSampleRow.id)).all()
    assert (served.adapter_id, served.baseline_id, served.answer_kl) == (first["id"], None, sample.baseline_kl)
    assert (sample.adapter_id, sample.baseline_id) == (second["id"], first["id"])
    assert sample.answer_kl is not None and sample.baseline_kl is not None
    assert sample.answer_kl == pytest.approx(sample.baseline_kl, abs=1e-6) and sample.answer_kl > 1e-4
    assert statuses(gateway) == {first["id"]: "active", second["id"]: "shadow"}


def test_auto_promotion_needs_enough_pairs_a_margin_and_most_wins_and_can_be_rolled_back(
    start_gateway: Callable[..., Gateway], fitted_adapter: Path
) -> None:
    shadow = ShadowSettings(sample_rate=0.0, shadow_rate=0.0, promote_min_pairs=4, promote_margin=0.05, window=10)
    gateway = start_gateway(shadow=shadow)
    first, second = two_versions(gateway, fitted_adapter)
    evaluator = gateway.services.chat.accounting.shadow
    (ref,) = asyncio.run_coroutine_threadsafe(gateway.services.resolver.shadows(pair_of(gateway, second)),
                                              gateway.loop).result(30)  # fmt: skip

    def pairs(*kls: tuple[float, float]) -> dict[int, str]:
        with gateway.services.db.session() as session:
            for kl, base in kls:
                versions.record_shadow(session=session, adapter_id=second["id"], kl=kl, top1=1.0, answer_kl=kl,
                                       baseline_id=first["id"], baseline_kl=base)  # fmt: skip
        asyncio.run_coroutine_threadsafe(evaluator._consider(ref, first["id"]), gateway.loop).result(30)
        return statuses(gateway)

    waiting = {first["id"]: "active", second["id"]: "shadow"}
    assert pairs((0.1, 0.3), (0.1, 0.3), (0.1, 0.3)) == waiting  # 3 pairs of the 4 asked for
    with gateway.http(None) as http:  # the Adapters page shows where the shadow version stands
        page = http.get("/dashboard/adapters").text
    assert "beside the active version: answer KL 0.1 against 0.3 over 3 requests, lower on 3" in page
    assert pairs((0.9, 0.3)) == waiting  # 4 pairs, but a mean of 0.30 against 0.30: no margin
    assert pairs((0.0, 0.3)) == {first["id"]: "candidate", second["id"]: "active"}  # 0.24 against 0.30, 4 of 5
    with gateway.http(None) as http:
        feed = http.get("/dashboard/live").text
    assert "shadow -&gt; active, by auto (shadow: mean answer KL 0.2400" in feed
    with gateway.http() as admin:
        audit = admin.get("/admin/audit").json()
        (promoted,) = [a for a in audit if a["action"] == "promote" and a["actor"] == "auto"]
        assert promoted["adapter_id"] == second["id"]
        assert "0.2400 against the active version's 0.3000 over 5 paired requests, lower on 4" in json.dumps(promoted)
        assert admin.post(f"/admin/adapters/{second['id']}/rollback").json()["id"] == first["id"]
    (event,) = [e.fields for e in gateway.services.store.events.read(count=1000)
                if e.kind == "adapter.status" and e.fields.get("actor") == "auto"]  # fmt: skip
    assert (event["version"], event["from"], event["to"]) == ("v2", "shadow", "active")
    assert (event["replaced"], event["samples"], event["wins"]) == (str(first["id"]), "5", "4")
    with gateway.http(None) as http:
        assert 'heterofold_auto_promotions_total{version="v2"} 1.0' in http.get("/metrics").text
    assert pairs((0.0, 0.3)) == {first["id"]: "active", second["id"]: "candidate"}  # decided: not a shadow now


def pair_of(gateway: Gateway, row: dict[str, Any]) -> tuple[str, str]:
    return row["sender_fingerprint"], row["receiver_fingerprint"]
