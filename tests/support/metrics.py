"""Reading a Prometheus exposition in tests."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families


def sample_sum(text: str, name: str, **labels: str) -> float:
    """The sum of the samples `name` of the exposition `text` that carry `labels` (whatever their other labels: a
    test that does not know which revision answered adds them up)."""
    return sum(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
               if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()))
