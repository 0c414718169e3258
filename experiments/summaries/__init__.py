"""What each paper experiment reports: its columns, derived metrics, summary notes and figure.

One module per experiment, each defining a `Spec`; `SPECS` maps the experiment name
(`exp.name` in its config) to it.
"""

from __future__ import annotations

from .chunked import CHUNKED
from .common import Metric, Spec
from .disagg import DISAGG
from .fairness import FAIRNESS
from .latency import LATENCY
from .orca import ORCA
from .paged import PAGED
from .prefix import PREFIX

SPECS: dict[str, Spec] = {s.name: s for s in (ORCA, PAGED, CHUNKED, PREFIX, LATENCY, DISAGG,
                                                   FAIRNESS)}

__all__ = ["SPECS", "Metric", "Spec"]
