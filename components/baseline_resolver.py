"""Resolver strategies: the Evaluator's baseline, the Trainer's warm-start model, the reused tokenizer, and the
statistics the data checks compare new data with.

The Evaluator's baseline is the latest blessed model other than the candidate.

TFX's LatestBlessedModelStrategy returns the latest blessed model whatever it
is. When a pipeline runs again on unchanged data, the Trainer is cached, so its
model (the candidate) *is* the latest blessed model: the Evaluator would then
see a new baseline input, re-evaluate the model against itself and push it
again as a new version. Excluding the candidate keeps a rerun fully cached,
while a retrained model is still compared with the model in production.
"""

from __future__ import annotations


from tfx import types
from tfx.dsl.components.common import resolver
from tfx.dsl.input_resolution.strategies.latest_blessed_model_strategy import (
    LatestBlessedModelStrategy,
)

from deepseek_tfx.components import mlmd
from deepseek_tfx.components.mlmd import (
    BASE_MODEL_KEY,
    BASE_TOKENIZER_KEY,
    CANDIDATE_KEY,
    EXAMPLES_KEY,
    MODEL_KEY,
    POST_TRANSFORM_STATS_KEY,
    TOKENIZER_KEY,
)
from deepseek_tfx.components.mlmd import MODEL_BLESSING_KEY as BLESSING_KEY



def _latest_blessed(models, blessings) -> dict[str, list[types.Artifact]]:
    """{model, model_blessing}: TFX's own selection rule (latest blessed by id) over these artifacts."""
    return LatestBlessedModelStrategy()._resolve(  # noqa: SLF001
        {MODEL_KEY: list(models), BLESSING_KEY: list(blessings)}, MODEL_KEY, BLESSING_KEY)


class LatestBlessedBaselineStrategy(resolver.ResolverStrategy):
    """Resolves {model, model_blessing}: the latest blessed Model not among ``candidate``.

    Inputs: ``model`` (all Models), ``model_blessing`` (all ModelBlessings) and
    ``candidate`` (the Trainer's output). The candidate is passed through.
    """

    def resolve_artifacts(self, store, input_dict: dict[str, list[types.Artifact]]
                          ) -> dict[str, list[types.Artifact]] | None:
        candidate_ids = {a.id for a in input_dict.get(CANDIDATE_KEY, [])}
        models = [m for m in input_dict.get(MODEL_KEY, []) if m.id not in candidate_ids]
        blessings = list(input_dict.get(BLESSING_KEY, []))
        result = {MODEL_KEY: [], BLESSING_KEY: []}
        if models and blessings:
            result = _latest_blessed(models, blessings)
        result[CANDIDATE_KEY] = list(input_dict.get(CANDIDATE_KEY, []))
        return result


def _inputs_if_rerun(store, execution_id: int | None, examples: set, key: str) -> list[int] | None:
    """The ids execution ``execution_id`` was given under ``key``, if its examples were exactly ``examples``.

    The shared rule of the strategies below: when the latest blessed model came from
    these very examples (a rerun with no new data), resolve what its producing
    execution was given, so the consumer's inputs repeat and it stays cached. None
    when the examples differ (new data: use the blessed artifact itself).
    """
    if execution_id is None or set(mlmd.artifact_ids(store, execution_id, EXAMPLES_KEY)) != examples:
        return None
    return mlmd.artifact_ids(store, execution_id, key)


class BlessedModelTokenizerStrategy(resolver.ResolverStrategy):
    """Resolves {tokenizer}: the tokenizer the latest blessed model was trained with, for reuse.

    Inputs: ``model`` and ``model_blessing`` (all), ``tokenizer`` (all Tokenizers) and
    ``examples`` (this run's examples: the newest span, or the span window). To keep
    reruns cached, when the blessed model's tokenizer was itself made from exactly these examples, the
    result is what that TokenizerGen execution was given (so its inputs repeat).
    """

    def resolve_artifacts(self, store, input_dict: dict[str, list[types.Artifact]]
                          ) -> dict[str, list[types.Artifact]] | None:
        models, blessings = input_dict.get(MODEL_KEY, []), input_dict.get(BLESSING_KEY, [])
        tokenizers = {t.id: t for t in input_dict.get(TOKENIZER_KEY, [])}
        current = {e.id for e in input_dict.get(EXAMPLES_KEY, [])}
        # A resolver returns every input key; only ``tokenizer`` is consumed downstream.
        result = {MODEL_KEY: [], BLESSING_KEY: [], TOKENIZER_KEY: [],
                  EXAMPLES_KEY: list(input_dict.get(EXAMPLES_KEY, []))}
        if not (models and blessings):
            return result
        result.update(_latest_blessed(models, blessings))
        blessed = result[MODEL_KEY]
        trainer = mlmd.producer_id(store, blessed[0].id) if blessed else None
        used = mlmd.artifact_ids(store, trainer, TOKENIZER_KEY) if trainer is not None else []
        if not used or used[0] not in tokenizers:
            return result
        given = _inputs_if_rerun(store, mlmd.producer_id(store, used[0]), current, BASE_TOKENIZER_KEY)
        result[TOKENIZER_KEY] = ([tokenizers[i] for i in given if i in tokenizers] if given is not None
                                 else [tokenizers[used[0]]])
        return result


class WarmStartModelStrategy(resolver.ResolverStrategy):
    """Resolves {model}: the Trainer's base model, i.e. the latest blessed model.

    Inputs: ``model`` and ``model_blessing`` (all) and ``examples`` (the examples the
    Trainer is about to train on). When the latest blessed model was itself trained
    on exactly these examples (a rerun with no new data), the result is the base model
    *that* training had, so the Trainer's inputs repeat and it stays cached instead
    of training again on top of its own output.
    """

    def resolve_artifacts(self, store, input_dict: dict[str, list[types.Artifact]]
                          ) -> dict[str, list[types.Artifact]] | None:
        models, blessings = input_dict.get(MODEL_KEY, []), input_dict.get(BLESSING_KEY, [])
        current = {e.id for e in input_dict.get(EXAMPLES_KEY, [])}
        result = {MODEL_KEY: [], BLESSING_KEY: [], EXAMPLES_KEY: list(input_dict.get(EXAMPLES_KEY, []))}
        if not (models and blessings):
            return result
        latest = _latest_blessed(models, blessings)
        if not latest[MODEL_KEY]:
            return result
        given = _inputs_if_rerun(store, mlmd.producer_id(store, latest[MODEL_KEY][0].id), current, BASE_MODEL_KEY)
        if given is not None:
            by_id = {m.id: m for m in models}
            result[MODEL_KEY] = [by_id[i] for i in given if i in by_id]
        else:
            result.update(latest)
        return result


BASELINE_STATISTICS_KEY = "baseline_statistics"
CURRENT_STATISTICS_KEY = "statistics"
DATA_CHECKS_TYPE = ".DataChecks"  # the end of components.data_checks.DataChecks's execution type name


class BlessedDataStatisticsStrategy(resolver.ResolverStrategy):
    """Resolves {baseline_statistics}: the post-transform statistics of the latest blessed model's data.

    Inputs: ``model`` and ``model_blessing`` (all), ``baseline_statistics`` (all post-transform statistics of
    the Transform node) and ``examples`` (this run's transformed examples: their Transform execution made this
    run's statistics). When the blessed model was trained on this very data (a rerun with no new span), the
    result is what the data checks of this data were given before, so they stay cached; none before the
    first blessed model.
    """

    def resolve_artifacts(self, store, input_dict: dict[str, list[types.Artifact]]
                          ) -> dict[str, list[types.Artifact]] | None:
        models, blessings = input_dict.get(MODEL_KEY, []), input_dict.get(BLESSING_KEY, [])
        candidates = {a.id: a for a in input_dict.get(BASELINE_STATISTICS_KEY, [])}
        transformed = list(input_dict.get(EXAMPLES_KEY, []))
        transform = mlmd.producer_id(store, transformed[0].id) if transformed else None
        current = mlmd.artifact_ids(store, transform, POST_TRANSFORM_STATS_KEY, outputs=True) if transform else []
        result = {MODEL_KEY: [], BLESSING_KEY: [], BASELINE_STATISTICS_KEY: [], EXAMPLES_KEY: transformed}
        if not (models and blessings):
            return result
        result.update(_latest_blessed(models, blessings))
        if not result[MODEL_KEY]:
            return result
        used = mlmd.training_statistics(store, result[MODEL_KEY][0])
        if current and [a.id for a in used] == current[:1]:  # a rerun: repeat the checks' earlier input
            consumers = store.get_executions_by_id(mlmd.consumer_ids(store, current[0], CURRENT_STATISTICS_KEY))
            checks = sorted((e for e in consumers if mlmd.execution_type_name(store, e).endswith(DATA_CHECKS_TYPE)),
                            key=lambda e: e.id)
            given = mlmd.artifact_ids(store, checks[0].id, BASELINE_STATISTICS_KEY) if checks else []
            result[BASELINE_STATISTICS_KEY] = [candidates[i] for i in given if i in candidates]
        else:
            result[BASELINE_STATISTICS_KEY] = [candidates[a.id] for a in used if a.id in candidates]
        return result


class FirstBlessedExamplesStrategy(resolver.ResolverStrategy):
    """Resolves {examples}: the ExampleGen outputs the first blessed model (other than ``candidate``) was trained
    on, as the Evaluator's fixed reference eval set; none before that model exists.

    Inputs: ``model``, ``model_blessing`` (all), ``candidate`` (the Trainer's output, passed through) and
    ``examples`` (all Examples of the ExampleGen node). Excluding the candidate keeps a rerun of the first
    blessed run cached (its Evaluator had no reference either).
    """

    def resolve_artifacts(self, store, input_dict: dict[str, list[types.Artifact]]
                          ) -> dict[str, list[types.Artifact]] | None:
        candidates = {a.id for a in input_dict.get(CANDIDATE_KEY, [])}
        blessed_ids = {b.get_int_custom_property("current_model_id") for b in input_dict.get(BLESSING_KEY, [])
                       if b.get_int_custom_property("blessed") == 1}
        models = sorted((m for m in input_dict.get(MODEL_KEY, []) if m.id in blessed_ids and m.id not in candidates),
                        key=lambda m: m.id)
        examples = {a.id: a for a in input_dict.get(EXAMPLES_KEY, [])}
        used = mlmd.trained_examples(store, models[0]) if models else []
        return {MODEL_KEY: models[:1], BLESSING_KEY: [], CANDIDATE_KEY: list(input_dict.get(CANDIDATE_KEY, [])),
                EXAMPLES_KEY: [examples[a.id] for a in used if a.id in examples]}
