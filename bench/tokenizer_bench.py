"""Tokenizer benchmark (issue 3) on ../shared/data/tinyshakespeare.txt.

Runs the pipeline (tiny model, few steps: only the data stages matter here),
then reads from ML Metadata the wall times of the TokenizerGen and Transform
executions and the number of tokens Transform wrote, and measures in the same
process the raw `sentencepiece` encode speed and the in-graph tensorflow_text
speed of the same model on the same text.

    python -m bench.tokenizer_bench [--output DIR] [--vocab-size N]
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import time


CORPUS = pathlib.Path(__file__).resolve().parents[1].parent / "shared" / "data" / "tinyshakespeare.txt"


def _seconds(execution) -> float:
    return (execution.last_update_time_since_epoch - execution.create_time_since_epoch) / 1000.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default="/tmp/deepseek_tfx_tokenizer_bench")
    parser.add_argument("--vocab-size", type=int, default=2048)
    args = parser.parse_args()

    from deepseek_tfx.components import mlmd  # first: the project package sets TF_USE_LEGACY_KERAS

    from deepseek_tfx.pipeline import local_runner, report
    from deepseek_tfx.pipeline.config import PIPELINE_NAME, PipelineConfig
    from deepseek_tfx.trainer_module.config import TokenizerConfig
    from deepseek_tfx.trainer_module.tokenizer import load_tokenizer

    import sentencepiece as spm
    import tensorflow as tf

    shutil.rmtree(args.output, ignore_errors=True)
    config = PipelineConfig(preset="tiny", train_steps=5, max_bits_per_byte=None,
                            tokenizer=TokenizerConfig(vocab_size=args.vocab_size))
    local_runner.run(output=args.output, config=config, corpus=str(CORPUS))
    store = mlmd.open_store(local_runner.sqlite_connection(os.path.join(args.output, "metadata.sqlite")))
    tokenizer_exec = mlmd.node_executions(store, PIPELINE_NAME, "TokenizerGen")[-1]
    transform_exec = mlmd.node_executions(store, PIPELINE_NAME, "Transform")[-1]
    tokenizer_artifact = mlmd.execution_artifacts(store, tokenizer_exec.id)["tokenizer"][0]
    stats = mlmd.execution_artifacts(store, transform_exec.id)["post_transform_stats"][0]
    tokens = report.transformed_token_count(stats.uri)
    transform_s = _seconds(transform_exec)

    tokenizer = load_tokenizer(tokenizer_artifact.uri)
    documents = [d for d in CORPUS.read_text().split("\n\n") if d.strip()]
    processor = spm.SentencePieceProcessor(model_proto=tokenizer.model_proto)
    start = time.perf_counter()
    raw_tokens = sum(len(ids) for ids in processor.encode(documents))
    raw_s = time.perf_counter() - start
    batch = tf.constant(documents)
    tokenizer.tokenize(batch[:8])  # warm up
    start = time.perf_counter()
    graph_tokens = int(tf.size(tokenizer.tokenize(batch).flat_values))
    graph_s = time.perf_counter() - start

    print(f"corpus: {CORPUS.name}, {CORPUS.stat().st_size:,} bytes, {len(documents):,} documents; "
          f"vocabulary {mlmd.prop(tokenizer_artifact, 'vocab_size')} "
          f"({mlmd.prop(tokenizer_artifact, 'tokenizer_type')}), "
          f"{mlmd.prop(tokenizer_artifact, 'sample_size'):,} sampled lines")
    print(f"TokenizerGen component wall time: {_seconds(tokenizer_exec):.1f} s")
    print(f"Transform component wall time: {transform_s:.1f} s for {tokens:,} tokens "
          f"-> {tokens / transform_s:,.0f} tokens/s")
    print(f"raw sentencepiece encode: {raw_tokens:,} tokens in {raw_s:.3f} s -> {raw_tokens / raw_s:,.0f} tokens/s")
    print(f"in-graph tensorflow_text encode: {graph_tokens:,} tokens in {graph_s:.3f} s "
          f"-> {graph_tokens / graph_s:,.0f} tokens/s")
    print(f"Transform step / raw sentencepiece speed ratio: {(tokens / transform_s) / (raw_tokens / raw_s):.4f}")


if __name__ == "__main__":
    main()
