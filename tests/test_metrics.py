"""The TFMA metrics equal an independent NumPy computation over the same predictions."""

import math

import numpy as np
from tensorflow_model_analysis.metrics import metric_types

from deepseek_tfx.trainer_module import metrics


def combine(metric, predictions):
    computation = metric.computations()[0]
    combiner = computation.combiner
    accs = []
    for chunk in (predictions[:3], predictions[3:]):  # two workers, then merged
        acc = combiner.create_accumulator()
        for p in chunk:
            acc = combiner.add_input(acc, metric_types.StandardMetricInputs(predictions=p))
        accs.append(acc)
    return list(combiner.extract_output(combiner.merge_accumulators(accs)).values())[0]


def test_perplexity_and_bits_per_byte_are_token_and_byte_weighted():
    rng = np.random.default_rng(0)
    preds = [{"nll_sum": np.float32(rng.uniform(1, 50)), "num_tokens": np.int64(rng.integers(1, 30)),
              "num_bytes": np.int64(rng.integers(1, 60))} for _ in range(7)]
    nll = sum(float(p["nll_sum"]) for p in preds)
    tokens = sum(int(p["num_tokens"]) for p in preds)
    num_bytes = sum(int(p["num_bytes"]) for p in preds)
    assert math.isclose(combine(metrics.Perplexity(), preds), math.exp(nll / tokens), rel_tol=1e-9)
    assert math.isclose(combine(metrics.BitsPerByte(), preds), nll / (math.log(2) * num_bytes), rel_tol=1e-9)
    mean_of_ratios = np.mean([math.exp(p["nll_sum"] / p["num_tokens"]) for p in preds])
    assert not math.isclose(combine(metrics.Perplexity(), preds), mean_of_ratios, rel_tol=1e-3)
