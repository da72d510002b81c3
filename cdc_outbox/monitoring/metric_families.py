"""Building blocks of the relay's metric families: names get :data:`PREFIX` (except the
labelled ``by_label``/``one_of``, which take full names); a ``None`` value exports no sample."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

__all__ = ["PREFIX", "by_label", "counter", "gauge", "one_of"]

PREFIX = "cdc_outbox_"


def by_label(name: str, doc: str, label: str, values: dict[str, int]) -> Metric:
    family = CounterMetricFamily(name, doc, labels=[label])
    for key, value in sorted(values.items()):
        family.add_metric([key], value)
    return family


def one_of(name: str, doc: str, label: str, choices: Iterable[str], current: str | None) -> Metric:
    """One sample per choice: 1 for ``current``, 0 for the others."""
    family = GaugeMetricFamily(name, doc, labels=[label])
    for choice in choices:
        family.add_metric([choice], 1.0 if choice == current else 0.0)
    return family


def gauge(name: str, doc: str, value: float | int | bool | None) -> Metric:
    family = GaugeMetricFamily(PREFIX + name, doc)
    if value is not None:
        family.add_metric([], float(value))
    return family


def counter(name: str, doc: str, value: int | None) -> Metric:
    family = CounterMetricFamily(PREFIX + name, doc)
    if value is not None:
        family.add_metric([], value)
    return family
