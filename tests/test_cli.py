"""The CLI's help and its handling of bad corpora: a clear error, exit 2, nothing written or pushed."""

import os

import pytest

from deepseek_tfx.pipeline import cli, report


@pytest.mark.parametrize("argv", [["--help"], ["run", "--help"], ["lineage", "--help"]])
def test_every_command_has_help(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    assert exit_info.value.code == 0
    assert "usage: deepseek-tfx" in capsys.readouterr().out


def _corpus_missing(tmp_path):
    return str(tmp_path / "no_such_corpus")


def _no_text_files(tmp_path):
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "photo.jpg").write_bytes(b"\xff\xd8\xff")
    return str(tmp_path / "c")


def _only_empty_files(tmp_path):
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "a.txt").write_text("")
    (tmp_path / "c" / "b.md").write_text("")
    return str(tmp_path / "c")


def _binary_among_text(tmp_path):
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "a.txt").write_text("Some text.\n")
    (tmp_path / "c" / "model.txt").write_bytes(b"\x7fELF\x00\x00binary")
    return str(tmp_path / "c")


@pytest.mark.parametrize("make_corpus,message", [
    (_corpus_missing, "corpus not found: nothing exists at"),
    (_no_text_files, "no text files in corpus"),
    (_only_empty_files, "all 2 text file(s) are empty"),
    (_binary_among_text, "model.txt: binary data (NUL byte at offset 4)"),
])
def test_bad_corpus_fails_fast_with_a_clear_error(tmp_path, capsys, make_corpus, message):
    output = tmp_path / "out"
    code = cli.main(["run", "--corpus", make_corpus(tmp_path), "--output", str(output), "--preset", "tiny"])
    assert code == cli.EXIT_USAGE
    assert message in capsys.readouterr().err
    assert not os.path.exists(output / "serving_model")
    assert not os.path.exists(output / "pipeline_root")


def test_bad_option_values_name_the_field(tmp_path, capsys):
    code = cli.main(["run", "--output", str(tmp_path), "--eval-fraction", "1.5"])
    assert code == cli.EXIT_USAGE
    assert "PipelineConfig.eval_fraction" in capsys.readouterr().err


def test_lineage_without_runs_says_what_to_do(tmp_path, capsys):
    assert cli.main(["lineage", "--output", str(tmp_path)]) == cli.EXIT_USAGE
    assert "run `deepseek-tfx run` first" in capsys.readouterr().err


def test_bad_last_spans_is_refused_before_anything_runs(tmp_path, capsys):
    (tmp_path / "corpus" / "span-1").mkdir(parents=True)
    (tmp_path / "corpus" / "span-1" / "a.txt").write_text("Some text.\n")
    code = cli.main(["retrain", "--corpus", str(tmp_path / "corpus"), "--output", str(tmp_path / "out"),
                     "--last-spans", "0"])
    assert code == cli.EXIT_USAGE
    assert "PipelineConfig.last_spans: must be >= 1, got 0" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "out" / "pipeline_root")


def test_root_cause_stops_where_the_error_hid_its_context():
    class TokenizerError(ValueError):
        pass

    try:
        try:
            raise RuntimeError("INTERNAL: src/trainer_interface.cc: Vocabulary size is smaller than required_chars")
        except RuntimeError:
            raise TokenizerError("vocab_size=300 is too small") from None
    except TokenizerError as hidden:
        try:
            raise RuntimeError("component failed") from hidden
        except RuntimeError as wrapped:
            assert cli._root_cause(wrapped) == "TokenizerError: vocab_size=300 is too small"


def test_span_lists_read_naturally():
    assert report.format_spans([3]) == "span 3"
    assert report.format_spans([1, 2, 3]) == "spans 1, 2, 3"
    assert report.format_spans([]) == "span n/a"


def test_summary_names_the_spans_trained_on():
    window = report.format_summary({"corpus": "/c/span-{SPAN}/*", "span": 3, "spans": [2, 3], "documents": 246})
    assert "/c/span-{SPAN}/* (spans 2, 3)" in window and "246 documents" in window and "(the newest span)" in window
    single = report.format_summary({"corpus": "/c/a.txt", "span": 0, "spans": [0]})
    assert "/c/a.txt (span 0)" in single and "newest span" not in single
