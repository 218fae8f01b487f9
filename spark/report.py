"""The analysis' readable report: one self-contained HTML file with PNG plots embedded.

Plots (matplotlib, the Agg backend: no display needed): dead letters per minute by reason,
the delivery-count distribution, the top source queues, the top header values. Everything
comes from a :class:`spark.transforms.Summary` (small, already collected), so this module
needs no Spark.
"""

from __future__ import annotations

import base64
import html
import io
from typing import Any

from postroom.spark.transforms import Summary

__all__ = ["render_html", "render_plots"]


def _png(figure: Any) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=96, bbox_inches="tight")
    return buffer.getvalue()


def render_plots(summary: Summary) -> dict[str, bytes]:
    """PNG bytes of each plot, by file name (``per_minute.png`` ...)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    plots: dict[str, bytes] = {}
    figure, axes = pyplot.subplots(figsize=(9, 3.5))
    minutes = sorted({minute for minute, _reason, _n in summary.per_minute})
    reasons = sorted({reason for _minute, reason, _n in summary.per_minute})
    bottom = [0] * len(minutes)
    index = {minute: i for i, minute in enumerate(minutes)}
    for reason in reasons:
        heights = [0] * len(minutes)
        for minute, r, n in summary.per_minute:
            if r == reason:
                heights[index[minute]] = n
        axes.bar(range(len(minutes)), heights, bottom=bottom, label=reason)
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    step = max(1, -(-len(minutes) // 8))  # at most 8 labels: they must not overlap
    axes.set_xticks(range(0, len(minutes), step), [minutes[i][11:] for i in range(0, len(minutes), step)])
    axes.set_title("Dead letters per minute (UTC), by reason")
    if reasons:
        axes.legend()
    plots["per_minute.png"] = _png(figure)
    pyplot.close(figure)

    figure, axes = pyplot.subplots(figsize=(6, 3.5))
    axes.bar([str(c) for c, _n in summary.delivery_counts], [n for _c, n in summary.delivery_counts])
    axes.set_title("Delivery count at death")
    axes.set_xlabel("returns before dead-lettering")
    plots["delivery_counts.png"] = _png(figure)
    pyplot.close(figure)

    figure, axes = pyplot.subplots(figsize=(6, 3.5))
    queues = sorted(summary.by_queue.items(), key=lambda item: -item[1])[:20]
    axes.barh([q for q, _n in reversed(queues)], [n for _q, n in reversed(queues)])
    axes.set_title("Top source queues")
    plots["top_queues.png"] = _png(figure)
    pyplot.close(figure)

    figure, axes = pyplot.subplots(figsize=(6, 3.5))
    labels = [f"{h}={v}"[:40] for h, v, _n in reversed(summary.top_headers)]
    axes.barh(labels, [n for _h, _v, n in reversed(summary.top_headers)])
    axes.set_title("Top header values")
    plots["top_headers.png"] = _png(figure)
    pyplot.close(figure)
    return plots


def _table(headings: list[str], rows: list[list[Any]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headings)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def render_html(summary: Summary, plots: dict[str, bytes]) -> str:
    """The report page; the plots are embedded as data URIs, so the file stands alone."""
    images = "".join(
        f'<img alt="{html.escape(name)}" src="data:image/png;base64,{base64.b64encode(data).decode()}">'
        for name, data in plots.items()
    )
    facts = _table(
        ["", ""],
        [
            ["dead letters", summary.total],
            ["still pending in a dead-letter queue", summary.pending],
            ["consumed or gone from the dead-letter queue", summary.total - summary.pending],
            ["corrupt records skipped", summary.corrupt_records],
            ["first death", summary.first_death or "-"],
            ["last death", summary.last_death or "-"],
        ],
    )
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>Postroom dead-letter report</title>"
        "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;margin:1em 0}"
        "td,th{border:1px solid #ccc;padding:.2em .6em;text-align:left}img{margin:.5em;max-width:100%}</style>"
        "</head><body><h1>Dead letters</h1>"
        f"{facts}<h2>Plots</h2>{images}"
        "<h2>By reason</h2>" + _table(["reason", "count"], [[k, v] for k, v in summary.by_reason.items()]) + ""
        "<h2>By source queue and reason</h2>"
        + _table(["queue", "reason", "count"], [list(t) for t in summary.by_queue_reason])
        + "<h2>By dead-letter queue</h2>"
        + _table(["dead-letter queue", "count"], [[k, v] for k, v in summary.by_dlq.items()])
        + "<h2>Delivery counts</h2>"
        + _table(["delivery count", "count"], [list(t) for t in summary.delivery_counts])
        + "<h2>Top header values</h2>"
        + _table(["header", "value", "count"], [list(t) for t in summary.top_headers])
        + "</body></html>"
    )
