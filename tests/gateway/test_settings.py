"""The transfer policy's selector choice: one default per role, another per sender engine, and a
config that names an unknown selector or engine refused at load with the name in the message; the
shipped config's defaults; the auto-promotion rule."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from gateway.registry.versions import Pairs
from gateway.settings import RoleSettings, Settings, ShadowSettings, TransferPolicy, load_settings

REPO = Path(__file__).resolve().parents[2]


def test_a_hop_from_a_named_sender_uses_its_selector_and_every_other_the_default() -> None:
    policy = TransferPolicy(selector="lexical", sender_selectors={"qwen": "sender-attention+lexical"})
    assert policy.selector_for("qwen") == "sender-attention+lexical"
    assert policy.selector_for("smollm2") == "lexical"
    assert TransferPolicy().selector_for("qwen") == "lexical-hop|meaning"  # the served default


def test_an_unknown_selector_is_refused_with_the_known_ones() -> None:
    with pytest.raises(ValidationError, match="lexical-hop"):
        TransferPolicy(sender_selectors={"qwen": "bm99"})


def test_sender_selectors_must_name_configured_engines(tmp_path: Path) -> None:
    role = RoleSettings(engine="gemma3-270m", policy=TransferPolicy(sender_selectors={"llama-70b": "lexical"}))
    with pytest.raises(ValidationError, match="llama-70b"):
        Settings(data_dir=tmp_path, roles={"summarizer": role})


def test_the_shipped_configs_load_with_the_code_defaults_for_the_policy(tmp_path: Path) -> None:
    shipped = load_settings(REPO / "config" / "heterofold.yaml", data_dir=tmp_path)
    defaults = Settings(data_dir=tmp_path)
    for name, role in defaults.roles.items():
        assert shipped.roles[name].policy.sender_selectors == role.policy.sender_selectors, name
        assert shipped.roles[name].policy.selector == role.policy.selector, name
    load_settings(REPO / "config" / "heterofold.sglang.yaml", data_dir=tmp_path)
    assert shipped.bootstrap == defaults.bootstrap and shipped.shadow == defaults.shadow


def test_promotion_asks_for_enough_pairs_a_margin_and_a_majority_of_wins() -> None:
    shadow = ShadowSettings(promote_min_pairs=4, promote_margin=0.05)
    assert shadow.promotes(Pairs(samples=4, kl=0.10, baseline_kl=0.30, wins=3))
    assert shadow.promotes(Pairs(samples=4, kl=0.25, baseline_kl=0.30, wins=3))  # exactly the margin
    assert not shadow.promotes(Pairs(samples=3, kl=0.10, baseline_kl=0.30, wins=3))  # too few pairs
    assert not shadow.promotes(Pairs(samples=4, kl=0.26, baseline_kl=0.30, wins=4))  # under the margin
    assert not shadow.promotes(Pairs(samples=4, kl=0.10, baseline_kl=0.30, wins=2))  # one large win, half the rest
    assert ShadowSettings().auto_promote and Settings(data_dir=Path("unused")).bootstrap.then == "distilled"
