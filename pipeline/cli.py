"""The ``deepseek-tfx`` command line."""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
import warnings
from typing import Optional, Sequence

os.environ["TF_USE_LEGACY_KERAS"] = "1"  # before anything imports TensorFlow
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# google-api-core warns about Python 3.10 on every import, also in each Beam worker process.
os.environ.setdefault("PYTHONWARNINGS", "ignore::FutureWarning")

DEFAULT_OUTPUT = "./deepseek_tfx_output"
EXIT_USAGE = 2
EXIT_FAILED = 1


def _build_parser() -> argparse.ArgumentParser:
    from trainer_module.config import PAPER_PRESETS, PRESETS  # light import: dataclasses only

    parser = argparse.ArgumentParser(
        prog="deepseek-tfx",
        description="Train, evaluate and push a DeepSeek-style language model with a TFX pipeline.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser(
        "run", help="run the whole pipeline locally (Beam DirectRunner)",
        description="Run corpus -> examples -> tokens -> model -> evaluation -> pushed model locally.")
    run.add_argument("--corpus", metavar="PATH_OR_GLOB",
                     help="file, directory (span-N subdirectories: latest span), or glob, optionally "
                          "with {SPAN}; default: the built-in Python documentation corpus")
    run.add_argument("--output", default=DEFAULT_OUTPUT, metavar="DIR",
                     help=f"output directory (default: {DEFAULT_OUTPUT})")
    run.add_argument("--preset", default="small", choices=sorted(set(PRESETS) - set(PAPER_PRESETS)),
                     help="model preset (default: small); the paper-sized presets are counted, not built")
    run.add_argument("--train-steps", type=int, metavar="N", help="trainer steps (default: the preset's)")
    run.add_argument("--eval-fraction", type=float, default=0.1, metavar="F",
                     help="share of documents in the eval split (default: 0.1)")
    run.add_argument("--max-bits-per-byte", type=float, default=4.0, metavar="X",
                     help="bless only below this eval bits per byte (default: 4.0)")
    run.add_argument("--max-perplexity", type=float, metavar="X",
                     help="bless only below this eval perplexity (default: no bound)")
    run.add_argument("--regression-tolerance", type=float, default=0.0, metavar="X",
                     help="bless a candidate at most this much perplexity worse than the last blessed model "
                          "(default: 0)")
    run.add_argument("--bpb-regression-tolerance", type=float, default=0.0, metavar="X",
                     help="the same in bits per byte, used when the two models' tokenizers differ (default: 0)")
    run.add_argument("--keep-versions", type=int, default=5, metavar="N",
                     help="pushed versions kept in the serving directory; 0 keeps all (default: 5)")
    run.add_argument("--tokenizer", choices=("sentencepiece", "byte"), default="sentencepiece",
                     help="learned SentencePiece subwords (default) or plain UTF-8 bytes")
    run.add_argument("--tokenizer-model", choices=("bpe", "unigram"), default="bpe",
                     help="SentencePiece algorithm (default: bpe)")
    run.add_argument("--vocab-size", type=int, default=2048, metavar="N",
                     help="SentencePiece vocabulary size incl. 4 reserved ids and 256 byte pieces "
                          "(default: 2048; reduced, with a warning, when the corpus is too small)")
    run.add_argument("--retrain-tokenizer", action="store_true",
                     help="learn a new tokenizer even if a blessed model exists (default: reuse its tokenizer)")
    run.add_argument("--beam-arg", action="append", default=[], metavar="ARG",
                     help="extra Beam pipeline option, repeatable, e.g. --beam-arg=--runner=DataflowRunner")
    run.add_argument("--metadata", choices=("sqlite", "mysql"), default="sqlite",
                     help="ML Metadata store: OUTPUT/metadata.sqlite, or MySQL from "
                          "DEEPSEEK_TFX_MYSQL_{HOST,PORT,DATABASE,USER,PASSWORD}")
    run.set_defaults(func=_cmd_run)

    lineage = sub.add_parser(
        "lineage", help="show what the latest pushed model was made from",
        description="Print the provenance of the latest pushed model, from ML Metadata.")
    lineage.add_argument("--output", default=DEFAULT_OUTPUT, metavar="DIR",
                         help=f"output directory of the runs (default: {DEFAULT_OUTPUT})")
    lineage.add_argument("--metadata", choices=("sqlite", "mysql"), default="sqlite",
                         help="ML Metadata store (as for run)")
    lineage.set_defaults(func=_cmd_lineage)

    generate = sub.add_parser(
        "generate", help="generate text from a model served by TensorFlow Serving",
        description="Call the served model's `generate` signature over REST (--server) or gRPC (--grpc).")
    target = generate.add_mutually_exclusive_group(required=True)
    target.add_argument("--server", metavar="URL", help="REST endpoint, e.g. http://localhost:8501")
    target.add_argument("--grpc", metavar="HOST:PORT", help="gRPC endpoint, e.g. localhost:8500")
    generate.add_argument("--model", default="deepseek", help="served model name (default: deepseek)")
    generate.add_argument("--max-new-tokens", type=int, default=64, metavar="N")
    generate.add_argument("--temperature", type=float, default=0.0, metavar="T", help="0 = greedy (default)")
    generate.add_argument("--top-k", type=int, default=0, metavar="K", help="0 = no cut (default)")
    generate.add_argument("--seed", type=int, default=0)
    generate.add_argument("prompt", nargs="+", help="one or more prompts")
    generate.set_defaults(func=_cmd_generate)
    return parser


def _cmd_generate(args) -> int:
    from serving import client

    options = dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                   seed=args.seed)
    try:
        if args.server:
            texts = client.rest_generate(args.server, args.model, args.prompt, **options)
        else:
            texts = client.grpc_generate(args.grpc, args.model, args.prompt, **options)
    except Exception as e:  # connection refused, HTTP error, unknown model: say which server said what
        print(f"deepseek-tfx: error: {args.server or args.grpc}: {e}", file=sys.stderr)
        return EXIT_FAILED
    for prompt, text in zip(args.prompt, texts):
        print(prompt + text)
    return 0


def _metadata(kind: str, output: str):
    from pipeline import local_runner

    if kind == "mysql":
        return local_runner.mysql_connection(dict(os.environ))
    return local_runner.sqlite_connection(local_runner.Layout(os.path.abspath(output)).metadata_path)


def format_summary(summary: dict) -> str:
    def num(key, fmt="{:,}"):
        value = summary.get(key)
        return "n/a" if value is None else fmt.format(value)

    lines = [
        "",
        "deepseek-tfx run summary",
        f"  corpus:        {summary.get('corpus')} (span {num('span')})",
        f"  read:          {num('documents')} documents, {num('bytes')} bytes from {num('files')} file(s)"
        f"; {num('replaced_invalid_utf8')} invalid UTF-8 sequence(s) replaced",
        f"  tokens:        {num('corpus_tokens')} in the corpus; trained on {num('train_tokens')}",
        f"  training:      {num('train_steps')} steps, {num('parameters')} parameters, "
        f"{num('train_tokens_per_second', '{:,.0f}')} tokens/s (MFU {num('train_mfu', '{:.1%}')}), "
        f"last loss {num('final_train_loss', '{:.4f}')}; {summary.get('warm_start') or 'n/a'}",
        f"  evaluation:    perplexity {num('eval_perplexity', '{:.3f}')}, bits per byte "
        f"{num('eval_bits_per_byte', '{:.4f}')} on {num('eval_examples', '{:,.0f}')} eval examples",
        f"  blessed:       {'yes' if summary.get('blessed') else 'no'}",
    ]
    if summary.get("pushed_model_path"):
        lines.append(f"  pushed model:  {summary['pushed_model_path']} (version {summary['pushed_version']})")
        if summary.get("serve_command"):
            lines.append(f"  serve it:      {summary['serve_command']}")
            lines.append(f"  configs:       {', '.join(sorted(summary.get('serving_configs', {}).values()))}")
    else:
        lines.append("  pushed model:  none (not blessed)")
    lines.append(f"  ML Metadata:   {summary.get('metadata')}")
    return "\n".join(lines)


def _cmd_run(args) -> int:
    from components.text_corpus import CorpusError
    from pipeline import local_runner
    from pipeline.config import PipelineConfig
    from trainer_module.config import ConfigError, TokenizerConfig

    try:
        tokenizer = TokenizerConfig(kind=args.tokenizer, model_type=args.tokenizer_model,
                                    vocab_size=args.vocab_size)
        config = PipelineConfig(preset=args.preset, train_steps=args.train_steps,
                                eval_fraction=args.eval_fraction, max_bits_per_byte=args.max_bits_per_byte,
                                max_perplexity=args.max_perplexity, tokenizer=tokenizer,
                                retrain_tokenizer=args.retrain_tokenizer,
                                regression_tolerance=args.regression_tolerance,
                                bpb_regression_tolerance=args.bpb_regression_tolerance,
                                keep_versions=args.keep_versions)
        metadata = _metadata(args.metadata, args.output)
    except (ConfigError, ValueError) as e:
        print(f"deepseek-tfx: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    try:
        summary = local_runner.run(output=args.output, config=config, corpus=args.corpus,
                                   beam_args=args.beam_arg, metadata=metadata)
    except CorpusError as e:
        print(f"deepseek-tfx: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except Exception as e:  # a component failed: show the root cause, not Beam's wrapping
        print(f"deepseek-tfx: pipeline failed: {_root_cause(e)}", file=sys.stderr)
        return EXIT_FAILED
    print(format_summary(summary))
    return 0


def _root_cause(error: BaseException) -> str:
    """The innermost error message, with CorpusError messages found even inside Beam's text."""
    while error.__cause__ is not None or error.__context__ is not None:
        error = error.__cause__ or error.__context__
    text = str(error)
    for line in reversed(text.splitlines()):
        if "CorpusError:" in line:
            return line.split("CorpusError:", 1)[1].strip()
    return f"{type(error).__name__}: {text.strip().splitlines()[-1] if text.strip() else ''}"


def _cmd_lineage(args) -> int:
    from pipeline import report

    connection = _metadata(args.metadata, args.output)
    if connection.HasField("sqlite") and not os.path.exists(connection.sqlite.filename_uri):
        print(f"deepseek-tfx: error: no ML Metadata at {connection.sqlite.filename_uri}; "
              "run `deepseek-tfx run` first", file=sys.stderr)
        return EXIT_USAGE
    store = report.open_store(connection)
    pushed = report.latest_pushed_model(store)
    if pushed is None:
        print("deepseek-tfx: error: no pushed model in ML Metadata yet", file=sys.stderr)
        return EXIT_USAGE
    print("\n".join(report.lineage_lines(store, pushed)))
    return 0


class _ProgressFilter(logging.Filter):
    """Keeps TFX's per-component start/finish lines and every warning; drops the rest of its INFO."""

    _KEEP = re.compile(r"^Component \S+ is (running|finished)")

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING or bool(self._KEEP.match(record.getMessage()))


class _DropBeamWorkerChatter(logging.Filter):
    """Beam's DirectRunner relays two harmless warnings from every worker it starts."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return "semi_persistent_directory" not in message and "Discarding unparseable args" not in message


def _setup_logging() -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
    project = logging.getLogger("deepseek_tfx")
    project.setLevel(logging.INFO)
    project.addHandler(handler)
    project.propagate = False
    absl_logger = logging.getLogger("absl")
    absl_logger.setLevel(logging.INFO)
    absl_logger.addFilter(_ProgressFilter())
    logging.getLogger("apache_beam.runners.portability.local_job_service").addFilter(_DropBeamWorkerChatter())


def main(argv: Optional[Sequence[str]] = None) -> int:
    warnings.filterwarnings("ignore", category=FutureWarning)
    _setup_logging()
    args = _build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
