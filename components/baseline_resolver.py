"""Resolver strategy for the Evaluator's baseline: the latest blessed model other than the candidate.

TFX's LatestBlessedModelStrategy returns the latest blessed model whatever it
is. When a pipeline runs again on unchanged data, the Trainer is cached, so its
model (the candidate) *is* the latest blessed model: the Evaluator would then
see a new baseline input, re-evaluate the model against itself and push it
again as a new version. Excluding the candidate keeps a rerun fully cached,
while a retrained model is still compared with the model in production.
"""

from __future__ import annotations

from typing import Dict, List, Optional

from tfx import types
from tfx.dsl.components.common import resolver
from tfx.dsl.input_resolution.strategies.latest_blessed_model_strategy import (
    LatestBlessedModelStrategy,
)

CANDIDATE_KEY = "candidate"
MODEL_KEY = "model"
BLESSING_KEY = "model_blessing"


class LatestBlessedBaselineStrategy(resolver.ResolverStrategy):
    """Resolves {model, model_blessing}: the latest blessed Model not among ``candidate``.

    Inputs: ``model`` (all Models), ``model_blessing`` (all ModelBlessings) and
    ``candidate`` (the Trainer's output). The candidate is passed through.
    """

    def resolve_artifacts(self, store, input_dict: Dict[str, List[types.Artifact]]
                          ) -> Optional[Dict[str, List[types.Artifact]]]:
        candidate_ids = {a.id for a in input_dict.get(CANDIDATE_KEY, [])}
        models = [m for m in input_dict.get(MODEL_KEY, []) if m.id not in candidate_ids]
        blessings = list(input_dict.get(BLESSING_KEY, []))
        result = {MODEL_KEY: [], BLESSING_KEY: []}
        if models and blessings:
            # Reuse TFX's selection rule (latest blessed by id) on the filtered models.
            result = LatestBlessedModelStrategy()._resolve(  # noqa: SLF001
                {MODEL_KEY: models, BLESSING_KEY: blessings}, MODEL_KEY, BLESSING_KEY)
        result[CANDIDATE_KEY] = list(input_dict.get(CANDIDATE_KEY, []))
        return result
