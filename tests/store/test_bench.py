"""The store benchmark runs end to end at a small size (its numbers are reported, never asserted)."""

import json

from typer.testing import CliRunner

from cli import app


def test_bench_store_reports_bandwidths_ratios_and_lookup_latency_as_json() -> None:
    args = ["bench", "store", "--json", "--tokens", "64", "--repeats", "1", "--lookups", "100"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["payload_bytes"] == 64 * 30 * 2 * 3 * 64 * 4 + 64 * 16
    assert report["lookup_pages"] == 256 and report["lookups"] == 100
    assert set(report["ratios"]) >= {"cpu_put_vs_memcpy_warm", "ssd_put_get_vs_file"}
    assert all(v > 0 for v in report["ratios"].values())
