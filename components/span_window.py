"""The training window: the Examples of the last N spans, for ``retrain --last-spans N``.

ExampleGen reads one span per execution (TFX 1.16 supports only a static
range of one span). Each run ingests the newest span; this resolver then hands
the downstream stages the Examples of the newest span and of the N-1 spans
before it, as ingested by earlier runs (or by ``pipeline.local_runner``'s
backfill of spans no run has read yet). It is TFX's rolling-range selection
(SpanRangeStrategy) except that each span contributes one artifact (the newest
version, then the newest ingestion), so a span ingested twice is not trained
on twice.

Local runs only: span-range resolvers do not compile for Kubeflow Pipelines V2
or Vertex AI.
"""

from __future__ import annotations

import logging

from tfx import types
from tfx.dsl.components.common import resolver

from deepseek_tfx.components import mlmd
from deepseek_tfx.components.mlmd import EXAMPLES_KEY, SPAN_PROPERTY

log = logging.getLogger(__name__)


def select_window(candidates: list[types.Artifact], num_spans: int) -> list[types.Artifact]:
    """One artifact per span in [newest - num_spans + 1, newest], oldest span first.

    ``newest`` is the highest span among ``candidates``. Each span contributes its
    newest version, then its newest ingestion (highest artifact id). Spans nobody
    ingested are left out (and logged).
    """
    if num_spans < 1:
        raise ValueError(f"num_spans must be >= 1, got {num_spans}")
    chosen: dict[int, types.Artifact] = {}
    for artifact in candidates:
        if not mlmd.has_prop(artifact, SPAN_PROPERTY):
            raise RuntimeError(f"Examples artifact #{artifact.id} ({artifact.uri}) has no span property")
        span = mlmd.span(artifact)
        best = chosen.get(span)
        if best is None or (mlmd.version(artifact), artifact.id) > (mlmd.version(best), best.id):
            chosen[span] = artifact
    if not chosen:
        return []
    newest = max(chosen)
    first = newest - num_spans + 1
    missing = [s for s in range(max(first, 0), newest) if s not in chosen]
    if missing:
        log.warning("Training window of %d spans ending at span %d: no Examples for span(s) %s", num_spans,
                    newest, missing)
    return [chosen[s] for s in sorted(chosen) if s >= first]


class LastSpansStrategy(resolver.ResolverStrategy):
    """Resolves {examples}: the window of the last ``num_spans`` spans (see ``select_window``).

    Input: ``examples``, every Examples artifact the pipeline's ExampleGen node
    ever produced. The resolver node must run after this run's ExampleGen
    (``add_upstream_node``), so the newest span is the one this run read.
    """

    def __init__(self, num_spans: int):
        self._num_spans = int(num_spans)

    def resolve_artifacts(self, store, input_dict: dict[str, list[types.Artifact]]
                          ) -> dict[str, list[types.Artifact]] | None:
        window = select_window(list(input_dict.get(EXAMPLES_KEY, [])), self._num_spans)
        if not window:
            return None
        log.info("Training window: span(s) %s", [mlmd.span(a) for a in window])
        return {EXAMPLES_KEY: window}
