"""Reading a plain-text corpus into documents.

Formats, chosen by file name:
  * ``.txt``, ``.text``, ``.md``, ``.markdown``, ``.rst``: plain text; documents are
    separated by one or more blank lines.
  * ``.jsonl``: one JSON object per line; its text field (``text`` by default) is
    one document.
  * any of these with ``.gz`` appended: the same, gzip-compressed.

Rules, the same in every runner:
  * Files whose names have none of these suffixes are skipped and counted.
  * A file with a NUL byte in its first 8 KiB is binary: CorpusError naming it.
  * Invalid UTF-8 bytes are replaced with U+FFFD and counted (per file and in
    total), never silently dropped.
  * A document longer than ``max_document_chars`` is split into chunks of at most
    that many characters, at the last whitespace in the chunk's second half when
    there is one.
  * Whitespace-only documents are dropped.

Paths go through ``tf.io.gfile`` so local paths and GCS/S3 URIs both work.
"""

from __future__ import annotations

import dataclasses
import gzip
import io
import json
import os
from collections.abc import Iterator

import tensorflow as tf

PLAIN_SUFFIXES = (".txt", ".text", ".md", ".markdown", ".rst")
JSONL_SUFFIXES = (".jsonl",)
SUPPORTED_SUFFIXES = PLAIN_SUFFIXES + JSONL_SUFFIXES
BINARY_SNIFF_BYTES = 8192


class CorpusError(ValueError):
    """The corpus cannot be read as text; the message names the file and the problem."""


@dataclasses.dataclass
class FileStats:
    """What reading one file produced."""

    path: str
    documents: int = 0
    chunked_documents: int = 0
    bytes: int = 0
    replaced_invalid_utf8: int = 0


def file_format(path: str) -> str | None:
    """Returns 'plain', 'jsonl' or None (unsupported) from the file name."""
    name = path.lower()
    if name.endswith(".gz"):
        name = name[:-3]
    if name.endswith(PLAIN_SUFFIXES):
        return "plain"
    if name.endswith(JSONL_SUFFIXES):
        return "jsonl"
    return None


def list_corpus_files(pattern: str) -> tuple[list[str], list[str]]:
    """Resolves a file, directory or glob to (supported files, skipped files), both sorted.

    Raises:
        CorpusError: nothing exists at ``pattern``, or nothing there is a supported text file.
    """
    if tf.io.gfile.isdir(pattern):
        matches = [os.path.join(pattern, name) for name in tf.io.gfile.listdir(pattern)]
    else:
        matches = tf.io.gfile.glob(pattern)
    if not matches:
        raise CorpusError(f"corpus not found: nothing exists at {pattern!r}")
    files = sorted(m for m in matches if not tf.io.gfile.isdir(m))
    supported = [f for f in files if file_format(f)]
    skipped = [f for f in files if not file_format(f)]
    if not supported:
        raise CorpusError(
            f"no text files in corpus {pattern!r}: found {len(files)} file(s) "
            f"{[os.path.basename(f) for f in files[:5]]} but none ends in "
            f"{', '.join(SUPPORTED_SUFFIXES)} (optionally + .gz)")
    return supported, skipped


def _open_binary(path: str):
    raw = tf.io.gfile.GFile(path, "rb")
    if path.lower().endswith(".gz"):
        return gzip.GzipFile(fileobj=raw, mode="rb")
    return raw


def _decode(data: bytes, stats: FileStats) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        text = data.decode("utf-8", errors="replace")
        stats.replaced_invalid_utf8 += text.count("\ufffd") - data.count("\ufffd".encode())
        return text


def chunk_document(text: str, max_chars: int) -> list[str]:
    """Splits ``text`` into pieces of at most ``max_chars`` characters, preferring whitespace."""
    if len(text) <= max_chars:
        return [text]
    chunks, start = [], 0
    while start < len(text):
        end = min(start + max_chars, len(text))
        if end < len(text):
            cut = max(text.rfind(" ", start + max_chars // 2, end),
                      text.rfind("\n", start + max_chars // 2, end))
            if cut > start:
                end = cut + 1
        chunks.append(text[start:end])
        start = end
    return chunks


def check_not_binary(path: str, head: bytes) -> None:
    """Raises CorpusError naming ``path`` when its first bytes hold a NUL byte."""
    nul = head.find(b"\x00")
    if nul >= 0:
        raise CorpusError(f"{path}: binary data (NUL byte at offset {nul}); not a text file")


def _lines(stream, path: str) -> Iterator[bytes]:
    head = stream.read(BINARY_SNIFF_BYTES)
    check_not_binary(path, head)
    # Complete the sniffed block's last line, then stream the rest line by line.
    yield from io.BytesIO(head + stream.readline())
    yield from stream


def _plain_documents(stream, path: str, stats: FileStats) -> Iterator[str]:
    paragraph: list[str] = []
    for raw in _lines(stream, path):
        line = _decode(raw, stats)
        if line.strip():
            paragraph.append(line)
        elif paragraph:
            yield "".join(paragraph)
            paragraph = []
    if paragraph:
        yield "".join(paragraph)


def _jsonl_documents(stream, path: str, stats: FileStats, text_field: str) -> Iterator[str]:
    for number, raw in enumerate(_lines(stream, path), start=1):
        line = _decode(raw, stats)
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise CorpusError(f"{path}:{number}: not valid JSON ({e.msg})") from None
        except RecursionError:
            raise CorpusError(f"{path}:{number}: JSON nested too deeply to read") from None
        if not isinstance(record, dict) or not isinstance(record.get(text_field), str):
            raise CorpusError(f"{path}:{number}: expected an object with a string field {text_field!r}")
        text = record[text_field]
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:  # valid JSON ("\ud800"), but not text: a lone UTF-16 surrogate
            raise CorpusError(f"{path}:{number}: field {text_field!r} holds a lone surrogate "
                              f"{text[e.start]!r} at character {e.start}, which is not valid Unicode") from None
        yield text


def read_documents(path: str, stats: FileStats, max_document_chars: int,
                   text_field: str = "text") -> Iterator[str]:
    """Yields the documents (chunked) of one file and fills ``stats`` as it goes.

    Raises:
        CorpusError: the file is binary, unreadable (bad gzip), or malformed JSONL.
    """
    kind = file_format(path)
    if kind is None:
        raise CorpusError(f"{path}: unsupported file type; expected one of {SUPPORTED_SUFFIXES}")
    try:
        with _open_binary(path) as stream:
            docs = (_plain_documents(stream, path, stats) if kind == "plain"
                    else _jsonl_documents(stream, path, stats, text_field))
            for doc in docs:
                doc = doc.strip("\n")
                if not doc.strip():
                    continue
                pieces = chunk_document(doc, max_document_chars)
                stats.documents += 1
                stats.chunked_documents += len(pieces) > 1
                for piece in pieces:
                    stats.bytes += len(piece.encode("utf-8"))
                    yield piece
    except (OSError, EOFError, gzip.BadGzipFile, tf.errors.OpError) as e:
        raise CorpusError(f"{path}: cannot be read ({e})") from None

