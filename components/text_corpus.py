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
MAX_LINE_BYTES = 1 << 20
"""Default bound on the bytes read as one line (PipelineConfig.max_line_bytes): longer lines are read in pieces."""


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


class _Prefixed(io.RawIOBase):
    """``head``, then the rest of ``stream``, as one raw stream: io.BufferedReader over it gives a bounded
    ``readline(limit)`` (GFile's readline has no limit)."""

    def __init__(self, head: bytes, stream):
        self._head, self._stream = memoryview(head), stream

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        if len(self._head):
            n = min(len(buffer), len(self._head))
            buffer[:n], self._head = self._head[:n], self._head[n:]
            return n
        data = self._stream.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)


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


def _utf8_split(piece: bytes) -> tuple[bytes, bytes]:
    """(whole characters, the incomplete UTF-8 sequence at the end, if any), for a piece cut mid-line."""
    for back in range(1, min(3, len(piece)) + 1):
        byte = piece[-back]
        if byte & 0xC0 == 0x80:  # a continuation byte: look further back for its lead byte
            continue
        if byte >= 0xC0 and (2 if byte < 0xE0 else 3 if byte < 0xF0 else 4) > back:
            return piece[:-back], piece[-back:]
        break
    return piece, b""


def _lines(stream, path: str, max_line_bytes: int) -> Iterator[tuple[bytes, bool, bool]]:
    """(piece, whether it starts its line, whether it ends it): lines of at most ``max_line_bytes`` bytes
    (plus the newline), longer ones in pieces of that size.

    Memory stays bounded whatever the line length (a small .gz can inflate to one huge line); a piece cut
    mid-line ends on a whole UTF-8 character, the rest of the character starting the next piece.
    """
    head = stream.read(BINARY_SNIFF_BYTES)
    check_not_binary(path, head)
    reader = io.BufferedReader(_Prefixed(head, stream))
    pending, carry, starts = None, b"", True
    for chunk in iter(lambda: reader.readline(max_line_bytes + 1), b""):
        piece, carry = carry + chunk, b""
        if not piece.endswith(b"\n"):  # cut at the bound (or the file's end): keep whole characters
            piece, carry = _utf8_split(piece)
            if not piece:
                continue
        if pending is not None:
            yield pending
        ends = piece.endswith(b"\n")
        pending, starts = (piece, starts, ends), ends
    if pending is not None or carry:  # the file's last line ends there, newline or not
        piece, first, _ = pending if pending else (b"", starts, True)
        yield piece + carry, first, True


def _plain_documents(stream, path: str, stats: FileStats, max_line_bytes: int) -> Iterator[tuple[str, bool]]:
    """(text, whether the document ends there): paragraphs (separated by blank lines), a huge one handed on
    in parts of about ``max_line_bytes``; a part's trailing newlines move to the next part, so that a document
    loses only the newlines around it."""
    paragraph: list[str] = []
    size, open_document, newlines = 0, False, ""
    for raw, starts, ends in _lines(stream, path, max_line_bytes):
        line = _decode(raw, stats)
        if starts and ends and not line.strip():  # a blank line: the paragraph ends
            if paragraph or open_document:
                yield "".join(paragraph), True
            paragraph, size, open_document, newlines = [], 0, False, ""
            continue
        paragraph.append(newlines + line)
        size, newlines = size + len(raw), ""
        if size >= max_line_bytes:  # an endless paragraph: pass on what is read so far, keep memory bounded
            text = "".join(paragraph)
            part = text.rstrip("\n")
            yield part, False
            paragraph, size, open_document, newlines = [], 0, True, text[len(part):]
    if paragraph or open_document:
        yield "".join(paragraph), True


def _jsonl_documents(stream, path: str, stats: FileStats, text_field: str,
                     max_line_bytes: int) -> Iterator[str]:
    for number, (raw, starts, ends) in enumerate(_lines(stream, path, max_line_bytes), start=1):
        if not (starts and ends):
            raise CorpusError(f"{path}:{number}: line longer than {max_line_bytes:,} bytes "
                              "(PipelineConfig.max_line_bytes); a JSON record cannot be read in pieces: split it, "
                              "or raise PipelineConfig.max_line_bytes")
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
        yield text, True


def read_documents(path: str, stats: FileStats, max_document_chars: int,
                   text_field: str = "text", max_line_bytes: int = MAX_LINE_BYTES) -> Iterator[str]:
    """Yields the documents (chunked) of one file and fills ``stats`` as it goes.

    Raises:
        CorpusError: the file is binary, unreadable (bad gzip), or malformed JSONL.
    """
    kind = file_format(path)
    if kind is None:
        raise CorpusError(f"{path}: unsupported file type; expected one of {SUPPORTED_SUFFIXES}")
    try:
        with _open_binary(path) as stream:
            docs = (_plain_documents(stream, path, stats, max_line_bytes) if kind == "plain"
                    else _jsonl_documents(stream, path, stats, text_field, max_line_bytes))
            chunks_so_far = 0  # of the document being read (a huge one arrives in several parts)
            for text, ends in docs:
                if not chunks_so_far:
                    text = text.lstrip("\n")
                if ends:
                    text = text.rstrip("\n")
                chunks = chunk_document(text, max_document_chars) if text.strip() else []
                for chunk in chunks:
                    stats.bytes += len(chunk.encode("utf-8"))
                    yield chunk
                chunks_so_far += len(chunks)
                if ends and chunks_so_far:
                    stats.documents += 1
                    stats.chunked_documents += chunks_so_far > 1
                    chunks_so_far = 0
    except (OSError, EOFError, gzip.BadGzipFile, tf.errors.OpError) as e:
        raise CorpusError(f"{path}: cannot be read ({e})") from None

