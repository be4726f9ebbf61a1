"""TFMA metrics for language models, over the ``serving_default`` outputs.

Both are token- and byte-weighted over the whole evaluated split, not means of
per-example values:
  * ``Perplexity`` = exp(sum of NLL / sum of tokens).
  * ``BitsPerByte`` = sum of NLL / (ln 2 * sum of UTF-8 bytes).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import apache_beam as beam
import numpy as np
import tensorflow_model_analysis as tfma
from tensorflow_model_analysis.metrics import metric_types
from tensorflow_model_analysis.utils import util

PERPLEXITY = "perplexity"
BITS_PER_BYTE = "bits_per_byte"
NLL_SUM, NUM_TOKENS, NUM_BYTES = "nll_sum", "num_tokens", "num_bytes"


class _SumsCombiner(beam.CombineFn):
    """Sums nll, tokens and bytes of one model's predictions, then applies ``finish``."""

    def __init__(self, key: metric_types.MetricKey, model_name: str, finish):
        self._key, self._model_name, self._finish = key, model_name, finish

    def create_accumulator(self):
        return np.zeros(3, dtype=np.float64)

    def add_input(self, acc, element: metric_types.StandardMetricInputs):
        predictions = element.prediction if hasattr(element, "prediction") else element.predictions
        if self._model_name:
            predictions = util.get_by_keys(predictions, [self._model_name], optional=True) or predictions
        acc[0] += float(np.sum(predictions[NLL_SUM]))
        acc[1] += float(np.sum(predictions[NUM_TOKENS]))
        acc[2] += float(np.sum(predictions[NUM_BYTES]))
        return acc

    def merge_accumulators(self, accs: Iterable[np.ndarray]):
        return np.sum(list(accs), axis=0)

    def extract_output(self, acc):
        return {self._key: self._finish(*acc)}


def _computations(name: str, finish, model_names=None, output_names=None, sub_keys=None,
                  example_weighted=False):
    computations = []
    for model_name in model_names or [""]:
        key = metric_types.MetricKey(name=name, model_name=model_name,
                                     example_weighted=example_weighted)
        computations.append(metric_types.MetricComputation(
            keys=[key],
            preprocessors=[metric_types.StandardMetricInputsPreprocessor(
                include_filter={"predictions": {}}, include_default_inputs=False)],
            combiner=_SumsCombiner(key, model_name, finish)))
    return computations


def _perplexity(nll, tokens, _bytes):
    return math.exp(nll / tokens) if tokens else float("nan")


def _bits_per_byte(nll, _tokens, num_bytes):
    return nll / (math.log(2) * num_bytes) if num_bytes else float("nan")


def _perplexity_computations(name=PERPLEXITY, model_names=None, output_names=None, sub_keys=None,
                             example_weighted=False):
    return _computations(name, _perplexity, model_names, output_names, sub_keys, example_weighted)


def _bpb_computations(name=BITS_PER_BYTE, model_names=None, output_names=None, sub_keys=None,
                      example_weighted=False):
    return _computations(name, _bits_per_byte, model_names, output_names, sub_keys, example_weighted)


class Perplexity(tfma.metrics.Metric):
    """exp(total NLL / total tokens) over the evaluated examples."""

    def __init__(self, name: str = PERPLEXITY):
        super().__init__(_perplexity_computations, name=name)

    @property
    def compute_confidence_interval(self) -> bool:
        return False


class BitsPerByte(tfma.metrics.Metric):
    """total NLL / (ln 2 * total UTF-8 bytes) over the evaluated examples."""

    def __init__(self, name: str = BITS_PER_BYTE):
        super().__init__(_bpb_computations, name=name)

    @property
    def compute_confidence_interval(self) -> bool:
        return False


metric_types.register_metric(Perplexity)
metric_types.register_metric(BitsPerByte)
