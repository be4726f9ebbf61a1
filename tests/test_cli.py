"""The CLI's help and its handling of bad corpora: a clear error, exit 2, nothing written or pushed."""

import json
import os

import pytest

from deepseek_tfx.pipeline import cli, report


COMMANDS = {"run": "--corpus", "retrain": "--last-spans", "compile": "--engine", "submit": "--package",
            "lineage": "--metadata", "generate": "--server", "serve-config": "--pin",
            "config": "--set", "schema": "--metadata",
            "report": "--run", "export-tflite": "--quantize"}  # each with an option of its own


def test_the_command_list_is_complete():
    subparsers = next(a for a in cli._build_parser()._actions if a.dest == "command")
    assert set(subparsers.choices) == set(COMMANDS)


@pytest.mark.parametrize("argv", [["--help"], *([command, "--help"] for command in COMMANDS)])
def test_every_command_has_help(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: deepseek-tfx {argv[0] if len(argv) > 1 else ''}".rstrip())
    if len(argv) > 1:
        assert f"\n  {COMMANDS[argv[0]]}" in out.split("options:", 1)[1]  # its own options, documented
    else:
        assert all(command in out for command in COMMANDS)


def test_schema_commands_before_any_push_say_why_they_cannot(tmp_path, capsys):
    output = str(tmp_path / "out")
    assert cli.main(["schema", "show", "--output", output]) == 2
    assert "no frozen schema in" in capsys.readouterr().err
    assert cli.main(["schema", "freeze", "--output", output]) == 2
    assert "no model has been pushed yet" in capsys.readouterr().err
    assert cli.main(["schema", "reset", "--output", output]) == 0
    assert "no frozen schema in" in capsys.readouterr().out


def test_beam_mode_follows_the_corpus_size_and_beam_args_win(tmp_path, monkeypatch):
    """In memory below 64 MB, one process per core above or when the size is unknown; --beam-arg comes last,
    and Beam takes the last of repeated options."""
    from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions

    from deepseek_tfx.pipeline import local_runner
    from deepseek_tfx.pipeline.config import PipelineConfig

    monkeypatch.setattr(os, "cpu_count", lambda: 3)
    below, above = local_runner.IN_MEMORY_BELOW_BYTES - 1, local_runner.IN_MEMORY_BELOW_BYTES
    assert "--direct_running_mode=in_memory" in local_runner.default_beam_args(below)
    for size in (above, None):
        assert local_runner.default_beam_args(size)[1:] == ["--direct_running_mode=multi_processing",
                                                             "--direct_num_workers=3"]
    (tmp_path / "a.txt").write_text("Some text.\n\nMore text.\n")
    local = local_runner.prepare(output=str(tmp_path / "out"), config=PipelineConfig(preset="tiny"),
                                 corpus=str(tmp_path / "a.txt"),
                                 beam_args=["--direct_running_mode=multi_processing", "--direct_num_workers=2"])
    args = local.pipeline.beam_pipeline_args
    assert args[:3] == local_runner.default_beam_args(len("Some text.\n\nMore text.\n"))  # small: in memory
    options = PipelineOptions(args).view_as(DirectOptions)
    assert (options.direct_running_mode, options.direct_num_workers) == ("multi_processing", 2)


def test_keep_versions_reaches_the_config_of_local_runs():
    for flag, expected in (("2", 2), ("0", 0)):
        args = cli._build_parser().parse_args(["run", "--keep-versions", flag])
        assert cli._config_from_args(args).keep_versions == expected


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


def test_summary_says_when_the_infra_validator_stopped_a_blessed_model():
    text = report.format_summary({"blessed": True, "infra_validated": False})
    assert "blessed:       yes" in text and "pushed model:  none (InfraValidator: TF Serving did not load" in text
    assert "pushed model:  none (not blessed)" in report.format_summary({"blessed": False})


def test_summary_says_what_retention_removed():
    pushed = {"pushed_model_path": "/s/deepseek/9", "pushed_version": "9", "serve_command": "docker run ..."}
    lines = report.format_summary({**pushed, "keep_versions": 2, "removed_versions": [5, 7]}).splitlines()
    assert "  retention:     keep 2 pushed versions; removed 5, 7" in lines
    assert "removed none" in report.format_summary({**pushed, "keep_versions": 0, "removed_versions": []})
    assert "retention" not in report.format_summary(pushed)


@pytest.mark.slow
@pytest.mark.parametrize("beam", [[], ["--beam-arg=--direct_running_mode=multi_processing",
                                       "--beam-arg=--direct_num_workers=2"]], ids=["in_memory", "multi_processing"])
def test_a_malformed_jsonl_line_is_bad_input_in_any_beam_mode(tmp_path, capsys, monkeypatch, beam):
    """It passes the pre-flight (which reads only the start) and fails ExampleGen, in this process or in a
    Beam worker: either way exit 2, the file and line named, nothing pushed."""
    from deepseek_tfx.components.text_corpus import CorpusError

    seen = []
    real = cli._corpus_error
    monkeypatch.setattr(cli, "_corpus_error", lambda e: seen.append(e) or real(e))
    corpus = tmp_path / "c"
    corpus.mkdir()
    good = "\n".join(json.dumps({"text": f"Document number {i} has some words in it."}) for i in range(50))
    (corpus / "docs.jsonl").write_text(good + "\n{not json\n")
    output = tmp_path / "out"
    code = cli.main(["run", "--corpus", str(corpus), "--output", str(output), "--preset", "tiny",
                     "--train-steps", "2", *beam])
    err = capsys.readouterr().err
    assert code == cli.EXIT_USAGE
    assert f"deepseek-tfx: error: {corpus / 'docs.jsonl'}:51: not valid JSON" in err
    assert not os.path.exists(output / "serving_model")
    # In memory the CorpusError itself arrives; from a worker process only its text does.
    raised_here = any(isinstance(e, CorpusError) for e in cli._chain(seen[0]))
    assert raised_here == (not beam)


@pytest.mark.slow
def test_a_failed_component_exits_1_and_pushes_nothing(tmp_path, capsys):
    """TokenizerGen fails: 300 pieces cannot cover the characters of a Chinese text."""
    from tests.conftest import LUNYU, shared_file

    code = cli.main(["run", "--corpus", str(shared_file(LUNYU)), "--output", str(tmp_path / "out"),
                     "--preset", "tiny", "--train-steps", "2", "--vocab-size", "300"])
    err = capsys.readouterr().err
    assert code == cli.EXIT_FAILED
    assert "deepseek-tfx: pipeline failed: TokenizerError: TokenizerConfig.vocab_size=300 is too small" in err
    assert not os.path.exists(tmp_path / "out" / "serving_model")


def test_lineage_from_mysql_without_its_variables_names_them(tmp_path, capsys, monkeypatch):
    for name in ("HOST", "PORT", "DATABASE", "USER", "PASSWORD"):
        monkeypatch.delenv(f"DEEPSEEK_TFX_MYSQL_{name}", raising=False)
    assert cli.main(["lineage", "--output", str(tmp_path), "--metadata", "mysql"]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("deepseek-tfx: error: --metadata mysql needs the environment variables")
    assert "DEEPSEEK_TFX_MYSQL_HOST" in err and "Traceback" not in err
