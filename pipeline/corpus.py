"""Where the corpus is: CLI argument -> (input_base, pattern), the default corpus, a pre-flight check.

Accepted ``--corpus`` values:
  * a file: ``data/shakespeare.txt``;
  * a directory: every supported file in it, or, when it holds ``span-<N>``
    subdirectories, the latest span (pattern ``span-{SPAN}/*``);
  * a glob, optionally with ``{SPAN}``: ``data/*.md``, ``drops/span-{SPAN}/*.jsonl``.
"""

from __future__ import annotations

import os
import re

import tensorflow as tf

from deepseek_tfx.components import text_corpus

SPAN_DIR = re.compile(r"^span-(\d+)$")
_GLOB_CHARS = set("*?[{")


def resolve(corpus: str) -> tuple[str, str]:
    """Splits a corpus argument into (input_base, relative pattern).

    Raises:
        text_corpus.CorpusError: the path does not exist.
    """
    if not any(c in corpus for c in _GLOB_CHARS):
        if tf.io.gfile.isdir(corpus):
            base = corpus.rstrip("/")
            return base, "span-{SPAN}/*" if span_numbers(base) else "*"
        if not tf.io.gfile.exists(corpus):
            raise text_corpus.CorpusError(f"corpus not found: nothing exists at {corpus!r}")
        return os.path.dirname(corpus) or ".", os.path.basename(corpus)
    parts = corpus.split("/")
    fixed = 0
    while fixed < len(parts) - 1 and not any(c in parts[fixed] for c in _GLOB_CHARS):
        fixed += 1
    base = "/".join(parts[:fixed]) or ("/" if corpus.startswith("/") else ".")
    return base, "/".join(parts[fixed:])


def span_numbers(base: str) -> list[int]:
    """The N of every ``span-<N>`` directory directly under ``base``, ascending."""
    if not tf.io.gfile.isdir(base):
        return []
    return sorted(int(m.group(1)) for m in (SPAN_DIR.match(name.rstrip("/")) for name in tf.io.gfile.listdir(base))
                  if m)


def uncompressed_size(path: str) -> int:
    """Bytes the file holds as text: a .gz file's size from its trailer (ISIZE, the size modulo 2**32)."""
    size = tf.io.gfile.stat(path).length
    if not path.lower().endswith(".gz") or size < 18:
        return size
    with tf.io.gfile.GFile(path, "rb") as f:
        f.seek(size - 4)
        return max(int.from_bytes(f.read(4), "little"), size)


def _span_reader(glob_pattern: str):
    """path -> the number that stands for ``{SPAN}`` in it (zero-padded or not, as TFX reads it)."""
    regex = re.escape(glob_pattern).replace(r"\{SPAN\}", r"(\d+)")
    regex = re.compile(regex.replace(r"\*", "[^/]*").replace(r"\?", "[^/]"))

    def span_of(path: str) -> int:
        match = regex.fullmatch(path)
        return int(match.group(1)) if match else -1

    return span_of


def check(base: str, pattern: str) -> tuple[list[str], list[str]]:
    """Fails fast, before any component runs, on a corpus that cannot produce documents.

    Checks that supported files exist, that none of the first 1,000 is binary
    (NUL byte in its first 8 KiB), and that not all of them are empty. The
    ExampleGen executor applies the same rules, for runs that skip this check.

    Returns:
        (supported files, skipped files) for the latest span when ``{SPAN}`` is used.

    Raises:
        text_corpus.CorpusError: naming the file or pattern and the problem.
    """
    glob_pattern = os.path.join(base, pattern).replace("{VERSION}", "*")
    files, skipped = text_corpus.list_corpus_files(glob_pattern.replace("{SPAN}", "*"))
    if "{SPAN}" in pattern:  # ExampleGen reads the latest span that has files: check only that one
        span_of = _span_reader(glob_pattern)
        newest = max(span_of(f) for f in files)
        files = [f for f in files if span_of(f) == newest]
        skipped = [f for f in skipped if span_of(f) == newest]
    for path in files[:1000]:
        with tf.io.gfile.GFile(path, "rb") as f:
            head = f.read(text_corpus.BINARY_SNIFF_BYTES)
        if not path.endswith(".gz"):  # compressed bytes are checked after decompression, in ExampleGen
            text_corpus.check_not_binary(path, head)
    if all(tf.io.gfile.stat(path).length == 0 for path in files):
        raise text_corpus.CorpusError(
            f"no documents in corpus {glob_pattern!r}: all {len(files)} text file(s) are empty")
    return files, skipped


def write_default_corpus(directory: str) -> str:
    """Writes the built-in corpus and returns its path.

    The Python documentation topics that every CPython ships in ``pydoc_data``
    (about 0.46 MB of English technical prose), one paragraph per document.
    Deterministic for a given Python version, so reruns hit the TFX cache.
    """
    from pydoc_data import topics  # noqa: PLC0415

    tf.io.gfile.makedirs(directory)
    path = os.path.join(directory, "pydoc_topics.txt")
    text = "\n\n".join(topics.topics[k].strip("\n") for k in sorted(topics.topics)) + "\n"
    if not tf.io.gfile.exists(path) or tf.io.gfile.GFile(path, "r").read() != text:
        tmp = path + ".tmp"
        with tf.io.gfile.GFile(tmp, "w") as f:
            f.write(text)
        tf.io.gfile.rename(tmp, path, overwrite=True)
    return path

