"""How a --corpus argument maps onto ExampleGen's input_base and pattern."""

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
