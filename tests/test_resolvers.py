"""The MLMD-aware resolver strategies, on an in-memory ML Metadata store with hand-built lineage.

New data must get the latest blessed model (as warm start) and its tokenizer; a rerun on exactly the same
examples must get what the blessed model's own execution was given, so that execution's inputs repeat and
it stays cached. With span windows, examples overlap between runs without being equal: overlap is new data.
"""

from tfx.types import standard_artifacts

from deepseek_tfx.components.baseline_resolver import (
    BlessedModelTokenizerStrategy,
    LatestBlessedBaselineStrategy,
    WarmStartModelStrategy,
)
from deepseek_tfx.components.tokenizer_gen import Tokenizer
from tests.mlmd_fakes import Lineage


def _world():
    """Two trainings: m1 on {e1} from scratch with tokenizer t1 (learned from {e1}); m2 on the window
    {e1, e2}, warm-started from m1, with t2 (t1 carried over by a TokenizerGen given {e1, e2}). Both blessed."""
    w = Lineage()
    e1, e2, e3 = (w.artifact(standard_artifacts.Examples) for _ in range(3))
    t1, t2 = w.artifact(Tokenizer), w.artifact(Tokenizer)
    m1, m2 = w.artifact(standard_artifacts.Model), w.artifact(standard_artifacts.Model)
    w.execution({"examples": [e1]}, {"tokenizer": [t1]})
    w.execution({"examples": [e1], "tokenizer": [t1]}, {"model": [m1]})
    w.execution({"examples": [e1, e2], "base_tokenizer": [t1]}, {"tokenizer": [t2]})
    w.execution({"examples": [e1, e2], "tokenizer": [t2], "base_model": [m1]}, {"model": [m2]})
    return w, (e1, e2, e3), (t1, t2), (m1, m2), [w.blessing(m1), w.blessing(m2)]


def _ids(artifacts):
    return [a.id for a in artifacts]


def test_warm_start_is_the_latest_blessed_model_for_new_data_and_repeats_on_a_rerun():
    w, (e1, e2, e3), _, (m1, m2), blessings = _world()
    strategy = WarmStartModelStrategy()

    def base(examples, models=(m1, m2), blessed=blessings):
        return _ids(strategy.resolve_artifacts(w.store, {"model": list(models), "model_blessing": list(blessed),
                                                         "examples": examples})["model"])

    assert base([e3]) == [m2.id]
    assert base([e2, e3]) == [m2.id]  # overlaps m2's window, yet new data: continue from m2
    assert base([e1, e2]) == [m1.id]  # m2's exact inputs: m2's own base, so its Trainer stays cached
    assert base([e1], models=[m1], blessed=blessings[:1]) == []  # m1 was trained from scratch
    assert base([e3], blessed=[w.blessing(m2, blessed=False), blessings[0]]) == [m1.id]
    assert base([e3], blessed=[]) == []


def test_reused_tokenizer_is_the_blessed_models_and_repeats_on_a_rerun():
    w, (e1, e2, e3), (t1, t2), (m1, m2), blessings = _world()
    strategy = BlessedModelTokenizerStrategy()

    def tokenizer(examples, models=(m1, m2), blessed=blessings):
        return _ids(strategy.resolve_artifacts(w.store, {
            "model": list(models), "model_blessing": list(blessed), "tokenizer": [t1, t2],
            "examples": examples})["tokenizer"])

    assert tokenizer([e3]) == [t2.id]
    assert tokenizer([e2, e3]) == [t2.id]
    assert tokenizer([e1, e2]) == [t1.id]  # what the blessed model's TokenizerGen was given
    assert tokenizer([e1], models=[m1], blessed=blessings[:1]) == []  # t1 was learned, not carried over
    assert tokenizer([e3], blessed=[]) == []


def test_baseline_is_the_latest_blessed_model_other_than_the_candidate():
    w, _, _, (m1, m2), blessings = _world()
    strategy = LatestBlessedBaselineStrategy()

    def baseline(candidate):
        return _ids(strategy.resolve_artifacts(w.store, {"model": [m1, m2], "model_blessing": blessings,
                                                         "candidate": [candidate]})["model"])

    m3 = w.artifact(standard_artifacts.Model)
    assert baseline(m3) == [m2.id]
    assert baseline(m2) == [m1.id]  # a cached Trainer's model is not compared with itself
