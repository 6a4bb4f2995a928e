"""bench.report's per-kind rows: counts, means and medians from an eval JSON's per-item results."""

from bench.report import per_kind_header, per_kind_rows


def _item(kind: str, correct: bool | None, ttft: float, kl: float = 0.0, top1: float = 1.0) -> dict:
    return {"kind": kind, "correct": correct, "ttft_ms": ttft, "kl": kl, "top1": top1}


def test_per_kind_rows_count_and_average_by_kind() -> None:
    items = {
        "a": _item("passkey", True, 100),
        "b": _item("passkey", False, 300),
        "c": _item("update", True, 200),
        "d": _item("paraphrase", True, 50),
        "e": _item("summary", None, 1000, kl=0.2, top1=0.5),
        "f": _item("continue", None, 3000, kl=0.4, top1=1.0),
    }
    e = {"per_item": {"quote@0.02": items}}
    (row,) = per_kind_rows(e)
    # passkey 1, update 1, paraphrase 1, 3 in all; KL and top-1 over the two whole-context items;
    # median TTFT over all six, the three look-ups (answer items but the paraphrase), the
    # paraphrase, and the two whole-context items.
    assert row == "| quote@0.02 | 1 | 1 | 1 | 3 | 0.300 | 0.750 | 250 | 200 | 50 | 2000 |"
    assert per_kind_header(e).splitlines()[0] == (
        "| path | passkey | update | paraphrase | answers | whole-context KL | top-1 | TTFT ms all | look-ups |"
        " paraphrases | whole-context |"
    )


def test_per_kind_rows_without_whole_context_items() -> None:
    (row,) = per_kind_rows({"per_item": {"native": {"a": _item("passkey", True, 10), "b": _item("facts", False, 30)}}})
    assert row == "| native | 1 | 0 | 1 | - | - | 20 | 20 | - | - |"  # no paraphrase, no whole-context item
