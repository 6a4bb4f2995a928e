"""The inline SVG charts: well-formed, escaped, scaled, and honest about having no data."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from dashboard.charts import Series, bar_chart, line_chart, nice_ticks

NS = {"s": "http://www.w3.org/2000/svg"}


def parse(svg: str) -> ET.Element:
    return ET.fromstring(svg)


def test_bar_chart_draws_one_bar_per_value_scaled_to_the_largest() -> None:
    root = parse(bar_chart([("a", 2.0), ("b", 4.0)], title="speedup", reference=1.0))
    bars = root.findall("s:rect[@class='bar']", NS)
    assert len(bars) == 2
    widths = [float(b.get("width", "0")) for b in bars]
    assert widths[1] == pytest.approx(2 * widths[0], rel=1e-3)
    assert root.find("s:line[@class='reference']", NS) is not None
    assert root.find("s:title", NS) is not None and root.find("s:title", NS).text == "speedup"  # type: ignore[union-attr]


def test_chart_labels_are_escaped() -> None:
    svg = bar_chart([("<script>alert(1)</script>", 1.0)], title='a "title" & more')
    assert "<script>" not in svg
    labels = [t.text for t in parse(svg).findall("s:text", NS)]
    assert "<script>alert(1)</script>" in labels  # the text survives, as text


def test_line_chart_draws_each_series_and_the_threshold() -> None:
    series = [Series("v1", [(0.0, 0.1), (10.0, 0.3), (20.0, 0.2)]), Series("v2", [(5.0, 0.6)])]
    root = parse(line_chart(series, title="drift", threshold=0.5, x_fmt=lambda x: f"{x:g}s"))
    assert len(root.findall("s:polyline", NS)) == 1  # a one-point series is a dot, not a line
    assert len(root.findall("s:circle", NS)) == 4
    assert root.find("s:line[@class='threshold']", NS) is not None
    legend = [t.text for t in root.findall("s:text[@class='legend']", NS)]
    assert legend == ["v1", "v2"]


def test_line_chart_puts_higher_values_higher_on_the_page() -> None:
    root = parse(line_chart([Series("x", [(0.0, 1.0), (1.0, 3.0)])], title="t"))
    low, high = (float(c.get("cy", "0")) for c in root.findall("s:circle", NS))
    assert high < low  # SVG y grows downwards


def test_empty_charts_say_so() -> None:
    for svg in (bar_chart([], title="t", empty="nothing yet"), line_chart([Series("a", [])], title="t",
                                                                          empty="nothing yet")):  # fmt: skip
        root = parse(svg)
        assert root.find("s:text[@class='empty']", NS).text == "nothing yet"  # type: ignore[union-attr]
        assert not root.findall("s:rect", NS) and not root.findall("s:circle", NS)


def test_nice_ticks_cover_the_range_in_round_steps() -> None:
    assert nice_ticks(0.0, 0.93) == [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
    assert nice_ticks(0.0, 47.0) == [0.0, 10.0, 20.0, 30.0, 40.0, 50.0]
    assert nice_ticks(0.0, 0.0)[-1] > 0  # a flat series still gets an axis
    with pytest.raises(ValueError):
        nice_ticks(0.0, float("nan"))
