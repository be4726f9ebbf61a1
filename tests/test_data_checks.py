"""The data checks (components.data_checks) on TFDV statistics made here the way Transform makes them.

Each check is driven by statistics of documents built in the test, so the expected figure is counted here with
NumPy, independently of TFDV; the pipeline test (test_retraining) stops real bad spans through `retrain`.
"""

import numpy as np
import pyarrow as pa
import pytest
from tensorflow_metadata.proto.v0 import schema_pb2

from deepseek_tfx.components import data_checks
from deepseek_tfx.pipeline.config import ConfigError, DataChecksConfig
from deepseek_tfx.trainer_module.preprocessing import stats_options_updater_fn

DEFAULTS = DataChecksConfig()


def statistics(token_lists, replacement=None, bytes_per_token=4):
    """Post-transform statistics of documents given as token id lists (as preprocessing_fn outputs them)."""
    import tensorflow_data_validation as tfdv
    from tensorflow_data_validation.statistics import stats_impl
    from tfx.components.transform.stats_options_util import StatsType

    replacement = replacement or [0] * len(token_lists)
    chars = [len(t) * bytes_per_token for t in token_lists]
    batch = pa.RecordBatch.from_arrays(
        [pa.array(token_lists, type=pa.list_(pa.int64())),
         pa.array([[c] for c in chars], type=pa.list_(pa.int64())),
         pa.array([[c] for c in chars], type=pa.list_(pa.int64())),
         pa.array([[r] for r in replacement], type=pa.list_(pa.int64()))],
        ["token_ids", "num_bytes", "num_chars", "replacement_chars"])
    schema = schema_pb2.Schema()
    for name in batch.schema.names:
        schema.feature.add(name=name, type=schema_pb2.INT)
    options = stats_options_updater_fn(StatsType.POST_TRANSFORM, tfdv.StatsOptions(
        schema=schema, experimental_use_sketch_based_topk_uniques=True))
    return stats_impl.generate_statistics_in_memory(batch, options)


def documents(rng, n, vocab, length=(20, 60)):
    return [list(rng.choice(vocab, size=rng.integers(*length))) for _ in range(n)]


def run_check(stats, text_schema=None, baseline=None, **thresholds):
    config = {"max_replacement_share": DEFAULTS.max_replacement_share,
              "max_token_drift": DEFAULTS.max_token_drift, **thresholds}
    reasons, _ = data_checks.check(stats, text_schema=text_schema, baseline=baseline, **config)
    return reasons


def test_token_ids_statistics_are_categorical():
    feature = next(f for f in statistics([[1, 2, 2], [3]]).datasets[0].features if f.path.step == ["token_ids"])
    assert feature.WhichOneof("stats") == "string_stats"  # top-k token frequencies: what drift compares
    assert {v.value: v.frequency for v in feature.string_stats.top_values} == {"2": 2, "1": 1, "3": 1}


def test_replacement_share_is_the_share_of_all_characters():
    rng = np.random.default_rng(0)
    docs = documents(rng, 50, np.arange(10, 60))
    replaced = [int(rng.integers(0, 3)) for _ in docs]
    expected = sum(replaced) / sum(len(d) * 4 for d in docs)  # num_chars = 4 per token here
    stats = statistics(docs, replaced)
    assert data_checks.replacement_share(stats) == pytest.approx(expected, rel=1e-6)
    assert run_check(stats, max_replacement_share=expected * 1.01) == []
    (reason,) = run_check(stats, max_replacement_share=expected * 0.99)
    assert reason.startswith("replacement_chars: ") and f"{expected:.2%}" in reason
    assert "max_replacement_share" in reason
    assert run_check(stats, max_replacement_share=None) == []


def test_drift_stops_a_new_token_distribution_only():
    rng = np.random.default_rng(1)
    english = np.arange(10, 110)
    baseline = statistics(documents(rng, 200, english))
    same = statistics(documents(rng, 200, english))
    other = statistics(documents(rng, 200, np.arange(200, 300)))  # another script: other pieces
    assert run_check(same, baseline=baseline) == []
    (reason,) = run_check(other, baseline=baseline)
    assert reason.startswith("token_ids: ") and "Jensen-Shannon" in reason
    assert run_check(other) == []  # no blessed model yet: nothing to compare with
    assert run_check(other, baseline=baseline, max_token_drift=None) == []


def test_frozen_ranges_stop_longer_documents_and_token_counts():
    rng = np.random.default_rng(2)
    vocab = np.arange(10, 60)
    frozen = data_checks.text_constraints(statistics(documents(rng, 100, vocab, (20, 61))), margin=2.0)
    ranges = {f.name: f for f in frozen.feature}
    counts = ranges["token_ids"].value_count
    assert (counts.min, counts.max) == (10, 120)  # observed 20..60 tokens, widened by 2 each way
    assert (ranges["num_bytes"].int_domain.min, ranges["num_bytes"].int_domain.max) == (40, 480)
    assert run_check(statistics(documents(rng, 100, vocab, (15, 100))), text_schema=frozen) == []
    reasons = run_check(statistics(documents(rng, 100, vocab, (20, 200))), text_schema=frozen)
    assert {r.split(":")[0] for r in reasons} == {"num_bytes", "token_ids"}, reasons
    assert run_check(statistics(documents(rng, 100, vocab, (20, 200)))) == []  # not frozen: no ranges


def test_config_names_bad_thresholds():
    with pytest.raises(ConfigError, match="DataChecksConfig.max_token_drift"):
        DataChecksConfig(max_token_drift=0.0)
    with pytest.raises(ConfigError, match="DataChecksConfig.max_replacement_share"):
        DataChecksConfig(max_replacement_share=1.5)
    with pytest.raises(ConfigError, match="DataChecksConfig.range_margin"):
        DataChecksConfig(range_margin=0.5)
