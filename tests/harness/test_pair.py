"""The probes' shared preamble (bench/pair.py): the three positionals, and a map that does not
belong to the named pair refused before any probe runs."""

import asyncio
from pathlib import Path

import pytest

from bench.pair import load_pair, pair_parser
from heterofold.adapter import Adapter, Side
from heterofold.errors import FingerprintMismatch


def test_the_parser_takes_sender_receiver_and_adapter_and_the_docs_first_paragraph() -> None:
    ap = pair_parser("One line.\n\nMore detail.", "the map")
    args = ap.parse_args(["a", "b", "/tmp/m"])
    assert (args.sender, args.receiver, args.adapter) == ("a", "b", Path("/tmp/m"))
    assert ap.description == "One line."
    with pytest.raises(SystemExit):
        ap.parse_args(["a", "b"])  # no adapter


@pytest.mark.models
def test_load_pair_checks_the_adapter_against_both_models(load_engine, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    spec = load_engine("smollm2-135m-instruct").spec
    Adapter.identity(Side.of(spec)).save(tmp_path)
    ap = pair_parser(None, "the map")
    s, r, adapter = load_pair(ap.parse_args([spec.name, spec.name, str(tmp_path)]))
    assert s.spec.fingerprint == r.spec.fingerprint == spec.fingerprint
    assert adapter.manifest.version == "identity"
    for engine in (s, r):  # load_pair's own engines, not the fixture's
        asyncio.run(engine.aclose())
    with pytest.raises(FingerprintMismatch):
        load_pair(ap.parse_args([spec.name, "gemma3-270m", str(tmp_path)]))
