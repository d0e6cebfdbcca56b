"""egpu-run's view of a running job: the maps of every process of the job, read over their control
sockets (live.py) while it runs, for ``--interval`` (printed) and ``--prometheus`` (scraped).

The job's processes are the live sessions whose ping names this job's session directory: children,
spawned workers and ranks register theirs as soon as they touch CUDA. A process that ends or does not
answer between listing and reading is left out of that interval.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from egpu_preload.control import ControlClient, list_sessions
from egpu_preload.errors import EgpuError
from egpu_preload.runtime import job

READ_TIMEOUT_S = 5.0
PROMETHEUS_PACKAGE = "prometheus_client"


def job_maps(session: Path) -> list[dict[str, Any]]:
    """A ``maps`` document (dump.py's fields) per process of the job that has probes attached, by pid."""
    docs = []
    for s in list_sessions(timeout=1.0):
        if not s.info or s.info.get("session") != str(session):
            continue
        try:
            doc = ControlClient(s.pid, timeout=READ_TIMEOUT_S).request("maps")
        except EgpuError:
            continue
        if isinstance(doc, dict) and doc.get("probes"):
            docs.append(doc)
    return docs


def interval_output(session: Path, as_json: bool) -> str:
    """What one ``--interval`` tick prints: the maps as at exit (text), or one JSON line per process."""
    return job.render([], job_maps(session), as_json)


# ---- Prometheus ---------------------------------------------------------------------------------------

def _metric_name(map_name: str) -> str:
    return "egpu_" + re.sub(r"[^a-zA-Z0-9_]", "_", map_name)


def _numbers(value: Any, labels: dict[str, str]) -> Iterator[tuple[dict[str, str], float]]:
    """The numeric leaves of a map value, a ``field`` label naming struct fields and array indexes."""
    if isinstance(value, bool):
        yield labels, float(value)
    elif isinstance(value, (int, float)):
        yield labels, float(value)
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _numbers(v, {**labels, "field": f"{labels['field']}.{k}" if "field" in labels else str(k)})
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from _numbers(v, {**labels, "field": f"{labels.get('field', '')}[{i}]"})


def series(doc: dict[str, Any]) -> Iterator[tuple[str, dict[str, str], float]]:
    """(metric, labels, value) for every entry of every map of one process's ``maps`` document:
    scalars one series, keyed maps one per key, histograms one per bucket, ring buffers their record
    and drop counts; labelled with pid and rank."""
    from egpu_preload.output.values import Histogram, KeyedScalars, Records, Scalar
    snap = job.snapshots([], doc)
    base = {"pid": str(doc["pid"]), "rank": "" if doc.get("rank") is None else str(doc["rank"])}
    for m in snap.maps:
        name = _metric_name(m.name)
        if isinstance(m, Scalar):
            rows = _numbers(m.value, base)
        elif isinstance(m, KeyedScalars):
            keys = _key_labels([e.key for e in m.entries], snap.kernel_names)
            rows = (r for e, key in zip(m.entries, keys) for r in _numbers(e.value, {**base, "key": key}))
        elif isinstance(m, Histogram):
            rows = (({**base, "bucket": f"[{lo}, {hi})"}, float(n)) for lo, hi, n in m.buckets())
        elif isinstance(m, Records):
            rows = iter([({**base, "count": "records"}, float(len(m.records))),
                         ({**base, "count": "dropped"}, float(m.dropped))])
        else:
            continue
        for labels, v in rows:
            yield name, labels, v


def _key_labels(keys: list[Any], names: dict[int, str]) -> list[str]:
    """Each key's "key" label: as egpu-run prints it, but where keys print alike (kernel names print without
    their template arguments and parameters: PyTorch's many elementwise kernels), their mangled names; one
    label for two series of a map made them one series twice, which Prometheus rejects."""
    from egpu_preload.output.json import plain
    from egpu_preload.output.text import value as show
    shown = [show(k, names) for k in keys]
    times = Counter(shown)
    exact = (plain(k, lambda kid: names.get(int(kid), int(kid))) for k in keys)
    return [s if times[s] == 1 else e if isinstance(e, str) else json.dumps(e) for s, e in zip(shown, exact)]


class JobCollector:
    """A prometheus_client collector: every scrape reads the job's maps, one family a metric (a map of one
    name holds other labels in another process, a scalar there and a keyed map here: HELP and TYPE once)."""

    def __init__(self, session: Path) -> None:
        self.session = session

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import Metric
        families: dict[str, Any] = {}
        for doc in job_maps(self.session):
            for name, labels, v in series(doc):
                if name not in families:
                    families[name] = Metric(name, f"egpu map {name[5:]}", "gauge")
                families[name].add_sample(name, labels, v)
        yield from families.values()


def serve_prometheus(port: int, session: Path) -> None:
    """Serve /metrics on ``port`` (a daemon thread) for the job of ``session``."""
    try:
        import prometheus_client
        from prometheus_client.core import REGISTRY
    except ImportError:
        raise EgpuError(f"--prometheus needs the {PROMETHEUS_PACKAGE} package "
                        "(pip install 'egpu[prometheus]')") from None
    REGISTRY.register(JobCollector(session))
    try:
        prometheus_client.start_http_server(port)
    except OSError as e:
        raise EgpuError(f"--prometheus {port}: cannot listen ({e.strerror})") from None
