"""The admin API: uploads, stale versions, fit jobs, and shadow evaluation with drift rollback."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from engines.local import LocalEngine
from gateway.settings import BootstrapSettings, DistillSettings, ShadowSettings
from tests.gateway.conftest import SMOL, Gateway
from tests.gateway.helpers import cross_hop, saved_identity, upload

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
