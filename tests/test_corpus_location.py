"""How a --corpus argument maps onto ExampleGen's input_base and pattern."""

import pytest

from deepseek_tfx.pipeline import corpus


def test_file_directory_glob_and_spans(tmp_path):
    (tmp_path / "a.txt").write_text("x\n")
    assert corpus.resolve(str(tmp_path / "a.txt")) == (str(tmp_path), "a.txt")
    assert corpus.resolve(str(tmp_path)) == (str(tmp_path), "*")
    assert corpus.resolve(str(tmp_path / "*.txt")) == (str(tmp_path), "*.txt")
    (tmp_path / "drops" / "span-1").mkdir(parents=True)
    (tmp_path / "drops" / "span-2").mkdir()
    assert corpus.resolve(str(tmp_path / "drops")) == (str(tmp_path / "drops"), "span-{SPAN}/*")
    assert corpus.resolve(str(tmp_path / "drops" / "span-{SPAN}" / "*.md")) == \
        (str(tmp_path / "drops"), "span-{SPAN}/*.md")


def test_default_corpus_is_builtin_and_stable(tmp_path):
    path = corpus.write_default_corpus(str(tmp_path))
    first = open(path, encoding="utf-8").read()
    mtime = (tmp_path / "pydoc_topics.txt").stat().st_mtime_ns
    assert len(first) > 100_000 and "\n\n" in first
    assert corpus.write_default_corpus(str(tmp_path)) == path
    assert (tmp_path / "pydoc_topics.txt").stat().st_mtime_ns == mtime  # unchanged file, TFX cache holds
    files, skipped = corpus.check(str(tmp_path), "*")
    assert files == [path] and skipped == []


def test_pre_flight_reads_only_the_latest_span(tmp_path):
    """ExampleGen reads the latest span; an older span's problems are not this run's (it was read before)."""
    for span, content in ((1, b"\x7fELF\x00binary"), (2, b"Old text.\n"), (10, b"New text.\n")):
        (tmp_path / f"span-{span}").mkdir()
        (tmp_path / f"span-{span}" / "part.txt").write_bytes(content)
    files, _ = corpus.check(str(tmp_path), "span-{SPAN}/*")
    assert files == [str(tmp_path / "span-10" / "part.txt")]  # by number: 10 after 2


def test_remote_outputs_stay_remote(tmp_path, monkeypatch):
    """TensorFlow's ram:// filesystem stands in for gs://: the layout, the default corpus and the pipeline's
    paths stay on it, and nothing named after the scheme appears on the local disk."""
    from ml_metadata.proto import metadata_store_pb2

    from deepseek_tfx.pipeline import local_runner
    from deepseek_tfx.pipeline.config import PipelineConfig

    monkeypatch.chdir(tmp_path)
    fake_store = metadata_store_pb2.ConnectionConfig()
    fake_store.fake_database.SetInParent()
    local = local_runner.prepare(output="ram://bucket/out", config=PipelineConfig(preset="tiny"), metadata=fake_store)
    assert local.layout.pipeline_root == "ram://bucket/out/pipeline_root"
    assert local.layout.serving_model_dir == "ram://bucket/out/serving_model/deepseek"
    assert local.corpus == "ram://bucket/out/default_corpus/pydoc_topics.txt"
    assert local.pipeline.pipeline_info.pipeline_root == "ram://bucket/out/pipeline_root"
    assert local.beam_args[1] == "--direct_running_mode=multi_processing"  # size unknown on a remote store
    assert list(tmp_path.iterdir()) == []  # no ./ram:/bucket/out
    with pytest.raises(ValueError, match="cannot live on ram://bucket/out: use --metadata mysql"):
        local_runner.metadata_connection("sqlite", "ram://bucket/out", {})
    with pytest.raises(ValueError, match="cannot live on ram://bucket/out2"):  # no store given: the same refusal
        local_runner.prepare(output="ram://bucket/out2", config=PipelineConfig(preset="tiny"))
    assert list(tmp_path.iterdir()) == []


def test_mysql_settings_name_the_variable():
    from deepseek_tfx.pipeline import local_runner

    env = {"DEEPSEEK_TFX_MYSQL_HOST": "h", "DEEPSEEK_TFX_MYSQL_PORT": "abc", "DEEPSEEK_TFX_MYSQL_DATABASE": "d",
           "DEEPSEEK_TFX_MYSQL_USER": "u"}
    with pytest.raises(ValueError, match="DEEPSEEK_TFX_MYSQL_PORT must be a port number, got 'abc'"):
        local_runner.mysql_connection(env)
    with pytest.raises(ValueError, match="DEEPSEEK_TFX_MYSQL_HOST"):
        local_runner.mysql_connection({k: v for k, v in env.items() if k != "DEEPSEEK_TFX_MYSQL_HOST"})


def test_beam_mode_is_sized_on_uncompressed_bytes(tmp_path):
    """A 70 KB .gz holding 70 MB of text runs Beam with worker processes, as 70 MB of plain text would."""
    import gzip

    from deepseek_tfx.pipeline import local_runner
    from deepseek_tfx.pipeline.config import PipelineConfig

    text = b"Some words on a line.\n\n" * 3_000_000  # 69 MB
    with gzip.open(tmp_path / "big.txt.gz", "wb", compresslevel=1) as f:
        f.write(text)
    assert (tmp_path / "big.txt.gz").stat().st_size < 1_000_000
    assert corpus.uncompressed_size(str(tmp_path / "big.txt.gz")) == len(text)
    local = local_runner.prepare(output=str(tmp_path / "out"), config=PipelineConfig(preset="tiny"),
                                 corpus=str(tmp_path / "big.txt.gz"))
    assert local.beam_args[1] == "--direct_running_mode=multi_processing"


def test_pre_flight_reads_zero_padded_spans_and_skips_an_empty_newest_one(tmp_path):
    for span, content in (("span-01", b"\x7fELF\x00binary"), ("span-07", b"Newest text.\n"), ("span-08", None)):
        (tmp_path / span).mkdir()
        if content is not None:
            (tmp_path / span / "part.txt").write_bytes(content)
    files, _ = corpus.check(str(tmp_path), "span-{SPAN}/*")  # span-08 has no files yet: TFX reads span 7
    assert files == [str(tmp_path / "span-07" / "part.txt")]
