"""The span window of `retrain --last-spans N`: which Examples artifacts the resolver picks."""

import logging

import pytest
from tfx.types import standard_artifacts

from deepseek_tfx.components.span_window import LastSpansStrategy, select_window


def examples(artifact_id, span, version=None):
    artifact = standard_artifacts.Examples()
    artifact.id = artifact_id
    artifact.uri = f"/root/TextExampleGen/examples/{artifact_id}"
    artifact.set_int_custom_property("span", span)
    if version is not None:
        artifact.set_int_custom_property("version", version)
    return artifact


def ids(artifacts):
    return [a.id for a in artifacts]


def test_window_is_the_last_n_spans_oldest_first():
    found = [examples(1, 1), examples(2, 2), examples(3, 3), examples(4, 4)]
    assert ids(select_window(found, 1)) == [4]
    assert ids(select_window(found, 2)) == [3, 4]
    assert ids(select_window(list(reversed(found)), 3)) == [2, 3, 4]
    assert ids(select_window(found, 10)) == [1, 2, 3, 4]


def test_a_span_read_twice_counts_once_newest_version_then_newest_read():
    found = [examples(1, 1), examples(2, 2), examples(5, 2), examples(3, 3, version=2), examples(6, 3, version=1)]
    assert ids(select_window(found, 3)) == [1, 5, 3]


def test_spans_nobody_read_are_left_out_and_logged(caplog):
    with caplog.at_level(logging.WARNING, logger="deepseek_tfx.components.span_window"):
        assert ids(select_window([examples(1, 1), examples(4, 4)], 3)) == [4]
    assert "no Examples for span(s) [2, 3]" in caplog.text


def test_bad_inputs_are_named():
    unspanned = standard_artifacts.Examples()
    unspanned.id, unspanned.uri = 7, "/root/x"
    with pytest.raises(RuntimeError, match=r"Examples artifact #7 \(/root/x\) has no span property"):
        select_window([unspanned], 2)
    with pytest.raises(ValueError, match="num_spans must be >= 1, got 0"):
        select_window([examples(1, 1)], 0)


def test_strategy_resolves_only_the_window_and_nothing_without_examples():
    strategy = LastSpansStrategy(num_spans=2)
    found = [examples(1, 1), examples(2, 2), examples(3, 3)]
    assert ids(strategy.resolve_artifacts(None, {"examples": found})["examples"]) == [2, 3]
    assert strategy.resolve_artifacts(None, {"examples": []}) is None
