"""Reading rules of TextExampleGen: formats, document splitting, chunking and bad input."""

import gzip
import json

import pytest

from deepseek_tfx.components import text_corpus
from deepseek_tfx.components.text_corpus import CorpusError, FileStats, chunk_document, read_documents


def docs_of(path, max_chars=4096, field="text"):
    stats = FileStats(path=str(path))
    return list(read_documents(str(path), stats, max_chars, field)), stats


def test_plain_text_splits_on_blank_lines_and_keeps_inner_whitespace(tmp_path):
    path = tmp_path / "a.txt"
    path.write_text("First  doc\n\tline two\n\n\n\nSecond doc\n   \nThird\n")
    docs, stats = docs_of(path)
    assert docs == ["First  doc\n\tline two", "Second doc", "Third"]
    assert (stats.documents, stats.bytes) == (3, sum(len(d.encode()) for d in docs))


def test_markdown_jsonl_and_gzip(tmp_path):
    (tmp_path / "n.md").write_text("# Title\n\nBody text\n")
    with gzip.open(tmp_path / "d.jsonl.gz", "wt") as f:
        f.write(json.dumps({"text": "one\n\nstill one"}) + "\n\n" + json.dumps({"text": "two"}) + "\n")
    assert docs_of(tmp_path / "n.md")[0] == ["# Title", "Body text"]
    assert docs_of(tmp_path / "d.jsonl.gz")[0] == ["one\n\nstill one", "two"]


def test_jsonl_errors_name_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"text": "ok"}\n{"body": "no text"}\n')
    with pytest.raises(CorpusError, match=r"bad.jsonl:2: expected an object with a string field 'text'"):
        docs_of(path)
    path.write_text("{not json\n")
    with pytest.raises(CorpusError, match=r"bad.jsonl:1: not valid JSON"):
        docs_of(path)


def test_binary_file_is_an_error_naming_it(tmp_path):
    path = tmp_path / "image.txt"
    path.write_bytes(b"GIF89a\x00\x01\x02" * 10)
    with pytest.raises(CorpusError, match=r"image.txt: binary data \(NUL byte at offset 6\)"):
        docs_of(path)


def test_invalid_utf8_is_replaced_and_counted(tmp_path):
    path = tmp_path / "latin1.txt"
    path.write_bytes("caf\xe9 ok\n\nna\xefve\n".encode("latin-1") + "real \ufffd kept\n".encode())
    docs, stats = docs_of(path)
    assert docs == ["caf\ufffd ok", "na\ufffdve\nreal \ufffd kept"]
    assert stats.replaced_invalid_utf8 == 2  # the genuine U+FFFD in the input is not counted


def test_a_20_mb_single_line_is_chunked(tmp_path):
    path = tmp_path / "one_line.txt"
    word = "abcdefghi "
    path.write_text(word * 2_000_000)  # 20 MB, no newline at all
    docs, stats = docs_of(path, max_chars=4096)
    assert stats.documents == 1 and stats.chunked_documents == 1
    assert max(len(d) for d in docs) <= 4096
    assert "".join(docs) == (word * 2_000_000).strip("\n")


def test_chunking_prefers_whitespace_and_is_lossless():
    text = "word " * 100 + "x" * 300
    chunks = chunk_document(text, 128)
    assert "".join(chunks) == text
    assert all(len(c) <= 128 for c in chunks)
    assert chunks[0].endswith(" ")


def test_listing_errors_and_skipped_files(tmp_path):
    with pytest.raises(CorpusError, match="corpus not found"):
        text_corpus.list_corpus_files(str(tmp_path / "missing"))
    (tmp_path / "photo.png").write_bytes(b"\x89PNG")
    with pytest.raises(CorpusError, match="no text files in corpus"):
        text_corpus.list_corpus_files(str(tmp_path))
    (tmp_path / "a.txt").write_text("hi\n")
    files, skipped = text_corpus.list_corpus_files(str(tmp_path))
    assert [p.rsplit("/", 1)[1] for p in files] == ["a.txt"]
    assert [p.rsplit("/", 1)[1] for p in skipped] == ["photo.png"]


def test_jsonl_that_is_valid_json_but_not_text_names_the_file_and_line(tmp_path):
    surrogate = tmp_path / "surrogate.jsonl"
    surrogate.write_text('{"text": "fine"}\n{"text": "broken \\ud800 here"}\n')
    with pytest.raises(CorpusError, match=r"surrogate.jsonl:2: field 'text' holds a lone surrogate '\\ud800' at "
                                          r"character 7, which is not valid Unicode"):
        docs_of(surrogate)
    deep = tmp_path / "deep.jsonl"
    deep.write_text('{"text": "fine"}\n' + "[" * 200_000 + "]" * 200_000 + "\n")
    with pytest.raises(CorpusError, match=r"deep.jsonl:2: JSON nested too deeply to read"):
        docs_of(deep)


def test_lines_are_read_in_bounded_pieces_that_end_on_whole_characters(tmp_path):
    """A small .gz inflating to one 48 MB line: memory stays bounded, nothing is lost or mangled."""
    import tracemalloc

    unit = "naïve café, 東京 "  # 1-, 2- and 3-byte UTF-8 characters: pieces must not cut one in two
    line = unit * (48_000_000 // len(unit.encode()))
    path = tmp_path / "one_line.txt.gz"
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write(line)
    assert path.stat().st_size < 1_000_000
    stats = FileStats(path=str(path))
    tracemalloc.start()
    try:
        size = total = 0
        first = last = ""
        for chunk in read_documents(str(path), stats, 4096, max_line_bytes=1 << 20):
            size = max(size, len(chunk))
            total += len(chunk)
            first, last = first or chunk, chunk
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20  # the whole line would be 48 MB of bytes plus its decoded text
    assert size <= 4096 and total == len(line)  # documents lose only surrounding newlines
    assert line.startswith(first) and line.endswith(last)
    assert stats.replaced_invalid_utf8 == 0  # no character cut at a piece boundary
    assert stats.documents == 1 and stats.chunked_documents == 1  # still one document, chunked


def test_pieces_join_back_exactly_at_any_bound(tmp_path):
    text = ("naïve café, 東京\n" * 3 + "\n" + "x" * 5000 + "é" * 3000 + "\n\nlast\n")
    path = tmp_path / "a.txt"
    path.write_text(text, encoding="utf-8")
    for bound in (4096, 4097, 4099, 10_000, 20_000):
        stats = FileStats(path=str(path))
        docs = list(read_documents(str(path), stats, 1 << 20, max_line_bytes=bound))
        assert docs[0] == ("naïve café, 東京\n" * 3).rstrip("\n") and docs[-1] == "last", bound
        assert "".join(docs[1:-1]) == "x" * 5000 + "é" * 3000, bound  # 11,000 bytes: in parts when over the bound
        assert stats.documents == 3 and stats.chunked_documents == (bound < 11_000), bound
        assert stats.replaced_invalid_utf8 == 0


def test_a_jsonl_line_over_the_bound_is_named(tmp_path):
    path = tmp_path / "big.jsonl"
    path.write_text('{"text": "fine"}\n' + json.dumps({"text": "y" * 10_000}) + "\n")
    with pytest.raises(CorpusError, match=r"big.jsonl:2: line longer than 4,096 bytes "
                                          r"\(PipelineConfig.max_line_bytes\)"):
        list(read_documents(str(path), FileStats(path=str(path)), 4096, max_line_bytes=4096))
    exact = tmp_path / "exact.jsonl"  # a line of exactly the bound, newline aside, is whole
    record = json.dumps({"text": "z" * 4084})
    assert len(record) == 4096
    exact.write_text(record + "\n" + record)
    assert [len(d) for d in read_documents(str(exact), FileStats(path=str(exact)), 8192, max_line_bytes=4096)] == \
        [4084, 4084]


def test_a_paragraph_ending_on_a_part_boundary_is_still_one_document(tmp_path):
    path = tmp_path / "two_lines.txt"
    text = "a" * 6000 + "\n" + "b" * 6000 + "\n"  # no blank line: one paragraph, each line a whole part
    path.write_text(text)
    stats = FileStats(path=str(path))
    docs = list(read_documents(str(path), stats, 1 << 20, max_line_bytes=4096))
    assert "".join(docs) == text.rstrip("\n") and stats.documents == 1 and stats.chunked_documents == 1
    path.write_text(text + "\n" + "next paragraph\n")
    stats = FileStats(path=str(path))
    docs = list(read_documents(str(path), stats, 1 << 20, max_line_bytes=4096))
    assert docs[-1] == "next paragraph" and "".join(docs[:-1]) == text.rstrip("\n") and stats.documents == 2


def test_a_cut_piece_of_whitespace_is_not_a_blank_line(tmp_path):
    path = tmp_path / "spaces.txt"
    path.write_text("first\n" + " " * 5000 + "word\n\nsecond\n")
    stats = FileStats(path=str(path))
    docs = list(read_documents(str(path), stats, 1 << 20, max_line_bytes=4096))
    assert stats.documents == 2 and docs[-1] == "second"
    assert "".join(docs[:-1]) == "first\n" + " " * 5000 + "word"
