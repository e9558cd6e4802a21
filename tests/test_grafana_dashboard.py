"""docs/grafana/credgate-dashboard.json and the metrics in step: every query names a series credgate exports, with
labels it has, and every metric appears on the dashboard."""

import json
import re
from pathlib import Path

from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.metrics import MetricWrapperBase

from credgate import metrics

DASHBOARD = Path(__file__).parents[1] / "docs" / "grafana" / "credgate-dashboard.json"
SERIES = re.compile(r"\b(credgate_[a-z_]+)(?:\{([^}]*)\})?")
GROUPING = re.compile(r"\bby \(([^)]*)\)")


def exported() -> dict[str, set[str]]:
    """Each series name credgate exports, with the labels it may carry."""
    found: dict[str, set[str]] = {}
    for metric in vars(metrics).values():
        if not isinstance(metric, MetricWrapperBase):
            continue
        labels = set(metric._labelnames)
        if isinstance(metric, Counter):
            found[f"{metric._name}_total"] = labels
        elif isinstance(metric, Histogram):
            for suffix in ("_bucket", "_count", "_sum"):
                found[metric._name + suffix] = labels | ({"le"} if suffix == "_bucket" else set())
        elif isinstance(metric, Gauge):
            found[metric._name] = labels
    return found


def queries() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]


def test_every_query_names_an_exported_series_and_its_labels() -> None:
    series = exported()
    for query in queries():
        named = SERIES.findall(query)
        assert named, query
        for name, selector in named:
            assert name in series, f"{name} is not exported: {query}"
            for matcher in filter(None, (part.strip() for part in selector.split(","))):
                assert re.split(r"[=!~]", matcher)[0] in series[name], f"{matcher} on {name}: {query}"
        for grouping in GROUPING.findall(query):
            for label in (part.strip() for part in grouping.split(",")):
                assert any(label in series[name] for name, _ in named), f"by {label}: {query}"


def test_every_metric_is_on_the_dashboard() -> None:
    shown = {name for query in queries() for name, _ in SERIES.findall(query)}
    names = {metric._name for metric in vars(metrics).values() if isinstance(metric, MetricWrapperBase)}
    assert {name for name in names if not any(series.startswith(name) for series in shown)} == set()
