"""The mapped-branch probe (bench/mapped_branch.py) on a hand-made evaluation: which path each
policy scores for each item auto maps, and the threshold fit. No model."""

from typing import Any

from bench.mapped_branch import branch, threshold, totals


def score(kind: str, correct: bool | None, kl: float | None, ttft: float) -> dict[str, Any]:
    return {"kind": kind, "correct": correct, "kl": kl, "top1": None if kl is None else 1 - kl, "ttft_ms": ttft}


def evaluation() -> dict[str, Any]:
    ids = {"look": "passkey", "para": "paraphrase", "sum": "summary", "cont": "continue"}
    rec = {"look": score("passkey", True, None, 10), "para": score("paraphrase", False, None, 11),
           "sum": score("summary", None, 0.2, 12), "cont": score("continue", None, 0.1, 13)}  # fmt: skip
    mq = {"look": score("passkey", True, None, 20), "para": score("paraphrase", True, None, 21),
          "sum": score("summary", None, 0.4, 22), "cont": score("continue", None, 0.3, 23)}  # fmt: skip
    quote = {i: score(k, k == "passkey", None if k in ("passkey", "paraphrase") else 0.9, 5) for i, k in ids.items()}
    auto = {i: {"via": "quote" if i == "look" else "map_quote"} for i in ids}
    return {"per_item": {"m@0.02": rec, "m+quote@0.02": mq, "quote@0.02": quote, "m+auto@0.02": auto}}


SIGNALS = {"look": {"meaning z": 9.0, "request detail": 0.9}, "para": {"meaning z": 5.0, "request detail": 0.8},
           "sum": {"meaning z": 3.0, "request detail": 0.1},
           "cont": {"meaning z": 6.0, "request detail": 0.6}}  # fmt: skip


def test_each_policy_scores_its_branch_on_the_items_auto_maps() -> None:
    signals = SIGNALS
    row = branch(evaluation(), "m", "0.02", signals, cut=4.0)
    assert row["mapped_items"] == 3 and row["kinds"] == ["continue", "paraphrase", "summary"]
    p = row["policies"]
    assert (p["map_quote"]["answers"], p["map_quote"]["whole_kl"], p["map_quote"]["to_transfer"]) == (1, 0.35, 0)
    assert (p["transfer"]["answers"], p["transfer"]["whole_kl"], p["transfer"]["to_transfer"]) == (0, 0.15, 3)
    assert (p["by kind"]["answers"], p["by kind"]["whole_kl"], p["by kind"]["to_transfer"]) == (1, 0.15, 2)
    # meaning z: the paraphrase (5) and the continuation (6) stay quoted, the summary (3) is recomputed
    assert (p["meaning z >= T"]["answers"], p["meaning z >= T"]["whole_kl"]) == (1, 0.25)
    assert p["meaning z >= T"]["to_transfer"] == 1 and p["quote"]["whole_kl"] == 0.9
    assert p["transfer"]["ttft_ms"] == 12 and p["map_quote"]["ttft_ms"] == 22  # medians over the mapped items
    # the request classifier reads the paraphrase (0.8) and the continuation (0.6) as details: quoted
    # alone, or mapped and quoted; the summary (0.1) is recomputed
    q, mq = p["request: quote / transfer"], p["request: map + quote / transfer"]
    assert (q["answers"], q["whole_kl"], q["to_transfer"]) == (0, 0.55, 1)
    assert (mq["answers"], mq["whole_kl"], mq["to_transfer"]) == (1, 0.25, 1)


def test_the_mapped_side_is_what_lexical_did_not_name_in_runs_that_record_it() -> None:
    """Since the request classifier, ``auto`` quotes some hops lexical did not name: the policies
    decide the hops with ``named`` false, whatever branch ``auto`` took."""
    result = evaluation()
    result["per_item"]["m+auto@0.02"] = {
        "look": {"via": "quote", "named": True}, "para": {"via": "quote", "named": False},
        "sum": {"via": "transfer", "named": False}, "cont": {"via": "transfer", "named": False},
    }  # fmt: skip
    row = branch(result, "m", "0.02", SIGNALS, cut=4.0)
    assert row["mapped_items"] == 3 and row["kinds"] == ["continue", "paraphrase", "summary"]


def test_threshold_misplaces_the_fewest_and_takes_the_lowest_such_cut() -> None:
    rows = [{"kind": "paraphrase", "meaning z": z} for z in (4.0, 5.0)]
    rows += [{"kind": k, "meaning z": z} for k, z in (("summary", 2.0), ("continue", 3.0))]
    assert threshold(rows) == 4.0
    rows.append({"kind": "summary", "meaning z": 4.5})  # now one item is misplaced whatever the cut
    assert threshold(rows) == 4.0


def test_the_branch_kl_rule_quotes_the_items_on_the_paraphrase_side_of_its_threshold() -> None:
    signals = {i: {"meaning z": 0.0, "request detail": 0.0} for i in ("look", "para", "sum", "cont")}
    items = [{"id": i, "branch KL": v} for i, v in (("para", 0.05), ("sum", 0.01), ("cont", 0.2))]
    low = {"items": items, "signals": {"branch KL": {"paraphrase_side": "low", "threshold": 0.05}}}
    p = branch(evaluation(), "m", "0.02", signals, cut=4.0, confidence=low)["policies"]["branch KL rule"]
    # at or below 0.05: the paraphrase and the summary quoted, the continuation recomputed
    assert (p["answers"], p["whole_kl"], p["to_transfer"]) == (1, 0.25, 1)
    high = {"items": items, "signals": {"branch KL": {"paraphrase_side": "high", "threshold": 0.1}}}
    p = branch(evaluation(), "m", "0.02", signals, cut=4.0, confidence=high)["policies"]["branch KL rule"]
    assert (p["answers"], p["whole_kl"], p["to_transfer"]) == (0, 0.25, 2)  # only the continuation quoted


def test_totals_sum_the_answers_and_average_the_rows_kl() -> None:
    one = branch(evaluation(), "m", "0.02", SIGNALS, cut=4.0)
    two = {"policies": {k: {**v, "whole_kl": v["whole_kl"] + 0.1} for k, v in one["policies"].items()}}
    t = totals([one, two])
    assert (t["map_quote"]["answers"], t["map_quote"]["of"], t["map_quote"]["rows"]) == (2, 2, 2)
    assert t["map_quote"]["mean_whole_kl"] == 0.4 and t["map_quote"]["rows_kl_below_map_quote"] == 0
    # the request rule quotes the misread continuation: above map + quote's KL on both rows
    assert t["request: quote / transfer"]["rows_kl_below_map_quote"] == 0
    assert t["transfer"]["rows_kl_below_map_quote"] == 2 and t["transfer"]["mean_whole_kl"] == 0.2
