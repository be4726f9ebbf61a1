"""The ``deepseek-tfx`` command line."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import re
import sys
import warnings
from collections.abc import Sequence

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# google-api-core warns about Python 3.10 on every import, also in each Beam worker process.
os.environ.setdefault("PYTHONWARNINGS", "ignore::FutureWarning")

DEFAULT_OUTPUT = "./deepseek_tfx_output"
EXIT_USAGE = 2
EXIT_FAILED = 1


def _build_parser() -> argparse.ArgumentParser:
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
    _add_output_arg(run, "output directory")
    _add_config_args(run)
    _add_local_args(run)
    run.set_defaults(func=_cmd_run)

    retrain = sub.add_parser(
        "retrain", help="retrain on the latest span of new data; push only when better",
        description="Run the pipeline on the latest span of CORPUS (CORPUS/span-N/...): reuse the blessed "
                    "model's tokenizer, warm-start from the latest blessed model, gate against it and push "
                    "only a better model. With no new span, nothing re-executes. Schedule it with cron or a "
                    "systemd timer (see the README).")
    retrain.add_argument("--corpus", required=True, metavar="DIR", help="directory holding span-1/, span-2/, ...")
    _add_output_arg(retrain, "output directory, the same for every retraining")
    _config_flag(retrain, "--last-spans", "pipeline", "last_spans", type=int, metavar="N")
    _add_config_args(retrain)
    _add_local_args(retrain)
    retrain.set_defaults(func=_cmd_run)

    compile_ = sub.add_parser(
        "compile", help="compile the pipeline for Vertex AI Pipelines or Kubeflow Pipelines",
        description="Compile the same pipeline with TFX's KubeflowV2DagRunner: a PipelineJob JSON (vertex) or "
                    "a pipeline-spec YAML (kubeflow).")
    compile_.add_argument("--engine", choices=("vertex", "kubeflow"), required=True)
    compile_.add_argument("--image", required=True, help="pipeline image (built from the Dockerfile)")
    compile_.add_argument("--pipeline-root", required=True, metavar="URI", help="e.g. gs://bucket/root")
    compile_.add_argument("--corpus", required=True, metavar="URI", help="corpus directory, e.g. gs://bucket/corpus")
    compile_.add_argument("--corpus-pattern", default="span-{SPAN}/*", metavar="GLOB",
                          help="files under --corpus (default: span-{SPAN}/*, the latest span at each run)")
    compile_.add_argument("--serving-dir", metavar="URI",
                          help="Pusher destination (default: PIPELINE_ROOT/serving_model/deepseek)")
    compile_.add_argument("--output", metavar="FILE", help="default: deepseek-tfx.json (vertex) or .yaml (kubeflow)")
    compile_.add_argument("--eval-corpus", metavar="URI",
                          help="a directory of reference eval text (e.g. gs://bucket/reference): no candidate is "
                               "blessed that is worse on it than the last blessed model by more than "
                               "pipeline.reference_bpb_tolerance")
    _add_config_args(compile_)
    compile_.add_argument("--vertex-training-replicas", type=int, metavar="N",
                          help="train as a Vertex AI custom job with N replicas (chief + N-1 workers, "
                               "MultiWorkerMirroredStrategy); needs --project and --region")
    compile_.add_argument("--vertex-machine-type", metavar="TYPE",
                          help="each training replica's machine, e.g. a2-highgpu-1g (default: n1-standard-8)")
    compile_.add_argument("--vertex-accelerator-type", metavar="TYPE",
                          help="each replica's accelerators, Vertex AI's names, e.g. NVIDIA_TESLA_T4, NVIDIA_L4, "
                               "NVIDIA_H100_80GB, TPU_V3 (default: none)")
    compile_.add_argument("--vertex-accelerator-count", type=int, default=0, metavar="N",
                          help="accelerators per replica (with --vertex-accelerator-type)")
    compile_.add_argument("--dataflow", action="store_true",
                          help="run the data components on Dataflow; needs --project and --region")
    compile_.add_argument("--project", help="Google Cloud project (for --vertex-training-replicas, --dataflow)")
    compile_.add_argument("--region", help="Google Cloud region (for --vertex-training-replicas, --dataflow)")
    compile_.add_argument("--beam-arg", action="append", default=[], metavar="ARG", help="extra Beam option")
    compile_.set_defaults(func=_cmd_compile)

    submit = sub.add_parser(
        "submit", help="submit a compiled pipeline to Vertex AI or Kubeflow, once or on a schedule",
        description="Run a compiled pipeline (see compile) on Vertex AI Pipelines (google-cloud-aiplatform) or "
                    "Kubeflow Pipelines (kfp.Client), or schedule it with --schedule CRON.")
    submit.add_argument("--engine", choices=("vertex", "kubeflow"), required=True)
    submit.add_argument("--package", required=True, metavar="FILE", help="the compiled pipeline")
    submit.add_argument("--project", help="Google Cloud project (vertex)")
    submit.add_argument("--region", help="Google Cloud region (vertex)")
    submit.add_argument("--pipeline-root", metavar="URI", help="pipeline root (vertex)")
    submit.add_argument("--host", metavar="URL", help="Kubeflow Pipelines endpoint (kubeflow)")
    submit.add_argument("--schedule", metavar="CRON", help="e.g. '0 3 * * *': schedule instead of running once")
    submit.set_defaults(func=_cmd_submit)

    lineage = sub.add_parser(
        "lineage", help="show what the latest pushed model was made from",
        description="Print the provenance of the latest pushed model, from ML Metadata.")
    _add_output_arg(lineage, "output directory of the runs")
    _add_metadata_arg(lineage)
    lineage.set_defaults(func=_cmd_lineage)

    generate = sub.add_parser(
        "generate", help="generate text from a served model, or from a pushed version loaded here",
        description="Call the `generate` signature of a model served by TensorFlow Serving, over REST (--server) "
                    "or gRPC (--grpc), or of a pushed version directory loaded in this process (--model-dir).")
    target = generate.add_mutually_exclusive_group(required=True)
    target.add_argument("--server", metavar="URL",
                        help="REST endpoint, e.g. http://localhost:8501 (localhost:8501 means http://)")
    target.add_argument("--grpc", metavar="HOST:PORT", help="gRPC endpoint, e.g. localhost:8500")
    target.add_argument("--model-dir", metavar="DIR",
                        help="a pushed version, e.g. OUTPUT/serving_model/deepseek/1764547200 (no server needed)")
    generate.add_argument("--rest-format", choices=("columns", "rows"), default="columns",
                          help='REST body: "inputs" columns (default) or "instances" rows (as Vertex AI sends)')
    generate.add_argument("--model", default="deepseek", help="served model name (default: deepseek)")
    generate.add_argument("--max-new-tokens", type=int, default=64, metavar="N")
    generate.add_argument("--temperature", type=float, default=0.0, metavar="T", help="0 = greedy (default)")
    generate.add_argument("--top-k", type=int, default=0, metavar="K", help="0 = no cut (default)")
    generate.add_argument("--seed", type=int, default=0)
    generate.add_argument("prompt", nargs="+", help="one or more prompts")
    generate.set_defaults(func=_cmd_generate)

    tflite = sub.add_parser(
        "export-tflite", help="write a TensorFlow Lite model of a pushed version, for phones and edge devices",
        description="Convert a pushed SavedModel version to TensorFlow Lite with two signatures, prefill and decode "
                    "(the compressed MLA cache in and out), beside its SentencePiece model. Generate from it with "
                    "python -m deepseek_tfx.serving.tflite_runner --model DIR --prompt TEXT.")
    tflite.add_argument("--model-dir", required=True, metavar="DIR",
                        help="a pushed version, e.g. OUTPUT/serving_model/deepseek/1764547200")
    tflite.add_argument("--output", required=True, metavar="DIR", help="where model.tflite and the tokenizer go")
    tflite.add_argument("--quantize", choices=("none", "float16", "dynamic-int8"), default="none",
                        help="weights in float16, or int8 with dynamic-range activations (default: none, float32)")
    tflite.add_argument("--tokenizer-model", metavar="FILE",
                        help="the SentencePiece model, for versions exported before it was copied into them")
    tflite.set_defaults(func=_cmd_export_tflite)

    report_cmd = sub.add_parser(
        "report", help="write the HTML report of a run",
        description="Write OUTPUT/reports/<run id>.html for a run (default: the latest): the DAG, the data, the "
                    "tokenizer, training curves, the evaluation and the gate's decision, the pushed versions, and "
                    "sample generations. run and retrain write it after every run.")
    _add_output_arg(report_cmd, "output directory of the runs")
    report_cmd.add_argument("--run", metavar="ID", help="the run id (default: the latest run)")
    _add_metadata_arg(report_cmd)
    report_cmd.set_defaults(func=_cmd_report)

    schema = sub.add_parser(
        "schema", help="show, freeze or reset the pipeline's frozen schema",
        description="The first run that pushes a model freezes its schema and the text ranges of the data checks "
                    "in OUTPUT/schema; later runs import them (ImportSchemaGen). show prints them, freeze takes them "
                    "again from the latest pushed model's run, reset goes back to inferring each run's schema.")
    schema.add_argument("action", choices=("show", "freeze", "reset"))
    _add_output_arg(schema, "output directory of the runs")
    _add_metadata_arg(schema)
    _add_config_args(schema)
    schema.set_defaults(func=_cmd_schema)

    config = sub.add_parser(
        "config", help="print the effective configuration",
        description="Print every field of every section as run would use it (the dataclass defaults, the preset, "
                    "then --config files, flags and --set), each with its docstring.")
    config.add_argument("action", choices=("show",))
    _add_config_args(config)
    config.set_defaults(func=_cmd_config)

    serve_config = sub.add_parser(
        "serve-config", help="pin the version TF Serving serves, or go back to the latest",
        description="Rewrite OUTPUT/serving_model/models.config (and batching.config, kubernetes.yaml). --pin makes "
                    "TF Serving serve that version, and every later run keeps the pin (and the version directory) "
                    "until --unpin. With neither, print the versions and the pin.")
    _add_output_arg(serve_config, "output directory of the runs")
    serve_config.add_argument("--model-name", metavar="NAME",
                              help="the model directory under OUTPUT/serving_model (default: PipelineConfig's "
                                   "model_name)")
    pin = serve_config.add_mutually_exclusive_group()
    pin.add_argument("--pin", type=int, metavar="VERSION", help="serve this pushed version")
    pin.add_argument("--unpin", action="store_true", help="serve the latest version again")
    serve_config.set_defaults(func=_cmd_serve_config)
    return parser


def _add_metadata_arg(parser) -> None:
    parser.add_argument("--metadata", choices=("sqlite", "mysql"), default="sqlite",
                        help="ML Metadata store: OUTPUT/metadata.sqlite, or MySQL from "
                             "DEEPSEEK_TFX_MYSQL_{HOST,PORT,DATABASE,USER,PASSWORD}")


def _add_output_arg(parser, what: str) -> None:
    parser.add_argument("--output", default=DEFAULT_OUTPUT, metavar="DIR", help=f"{what} (default: {DEFAULT_OUTPUT})")


_CONFIG_FLAGS = [  # (flag, section, field, argparse options): shortcuts for --set SECTION.FIELD=VALUE
    ("--preset", "pipeline", "preset", {"metavar": "NAME"}),
    ("--train-steps", "pipeline", "train_steps", {"type": int, "metavar": "N"}),
    ("--eval-fraction", "pipeline", "eval_fraction", {"type": float, "metavar": "F"}),
    ("--max-bits-per-byte", "pipeline", "max_bits_per_byte", {"type": float, "metavar": "X"}),
    ("--max-perplexity", "pipeline", "max_perplexity", {"type": float, "metavar": "X"}),
    ("--regression-tolerance", "pipeline", "regression_tolerance", {"type": float, "metavar": "X"}),
    ("--bpb-regression-tolerance", "pipeline", "bpb_regression_tolerance", {"type": float, "metavar": "X"}),
    ("--keep-versions", "pipeline", "keep_versions", {"type": int, "metavar": "N"}),
    ("--tokenizer", "tokenizer", "kind", {"choices": ("sentencepiece", "byte")}),
    ("--tokenizer-model", "tokenizer", "model_type", {"choices": ("bpe", "unigram")}),
    ("--vocab-size", "tokenizer", "vocab_size", {"type": int, "metavar": "N"}),
    ("--retrain-tokenizer", "pipeline", "retrain_tokenizer", {"action": "store_true"}),
    ("--tune", "tune", "enabled", {"action": "store_true"}),
    ("--tune-trials", "tune", "trials", {"type": int, "metavar": "N"}),
]


def _config_flag(parser, flag: str, section: str, name: str, **options) -> None:
    """A flag for ``section.name``: its help is the field's docstring and its default the dataclass's."""
    from deepseek_tfx.pipeline import settings

    doc = settings.field_docs(settings.SECTIONS[section]).get(name, "")
    value = settings.default(section, name)
    shown = ("the preset's" if name == "train_steps" else "none") if value is None else value
    parser.add_argument(flag, dest=f"{section}.{name}", default=argparse.SUPPRESS,
                        help=f"{doc} (default: {shown}; = --set {section}.{name}=...)".replace("%", "%%"), **options)


def _add_config_args(parser) -> None:
    """The configuration options shared by run, retrain, compile and config show (pipeline/settings.py)."""
    parser.add_argument("--config", action="append", default=[], metavar="FILE",
                        help="YAML or JSON file with pipeline:, model:, train:, tokenizer:, serving: sections of "
                             "fields to change (repeatable; later files win)")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE", dest="assignments",
                        help="change one field after the files and flags, e.g. --set train.learning_rate=1e-3 "
                             "(repeatable); `deepseek-tfx config show` lists every field")
    for flag, section, name, options in _CONFIG_FLAGS:
        _config_flag(parser, flag, section, name, **options)


def _add_local_args(parser) -> None:
    """Beam and ML Metadata options shared by run and retrain."""
    parser.add_argument("--beam-arg", action="append", default=[], metavar="ARG",
                        help="extra Beam pipeline option, repeatable, e.g. --beam-arg=--runner=DataflowRunner")
    _add_metadata_arg(parser)
    parser.add_argument("--wait", action="store_true",
                        help="when another run holds the output directory, wait for it to end (default: exit 2 "
                             "at once, naming that run)")
    parser.add_argument("--verbose", action="store_true",
                        help="print every library's output too (default: one line per component, the Trainer's "
                             "progress and the summary; the rest goes to OUTPUT/logs/<run id>.log)")
    parser.add_argument("--eval-corpus", metavar="PATH_OR_GLOB",
                        help="a fixed reference eval corpus, read whole: no candidate is blessed that is worse on it "
                             "than the last blessed model by more than pipeline.reference_bpb_tolerance (default: "
                             "the eval split of the first blessed run's data)")


def _config_from_args(args):
    """The PipelineConfig of --config files, then the flags, then --set assignments."""
    from deepseek_tfx.pipeline import settings

    flags = [f"{key}={value}" for key, value in vars(args).items() if "." in key]
    return settings.load(args.config, [*flags, *args.assignments])


def _cmd_config(args) -> int:
    from deepseek_tfx.pipeline import settings
    from deepseek_tfx.trainer_module.config import ConfigError

    try:
        print(settings.show(_config_from_args(args)), end="")
    except ConfigError as e:
        print(f"deepseek-tfx: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    return 0


def _cmd_generate(args) -> int:
    from deepseek_tfx.serving import client

    options = dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                   seed=args.seed)
    try:
        if args.server:
            texts = client.rest_generate(args.server, args.model, args.prompt, rest_format=args.rest_format,
                                         **options)
        elif args.grpc:
            texts = client.grpc_generate(args.grpc, args.model, args.prompt, **options)
        else:
            texts = client.local_generate(args.model_dir, args.prompt, **options)
        if len(texts) != len(args.prompt):
            raise ValueError(f"answered {len(texts)} text(s) for {len(args.prompt)} prompt(s)")
    except Exception as e:  # connection refused, HTTP error, unknown model, bad input: say who said what
        print(f"deepseek-tfx: error: {args.server or args.grpc or args.model_dir}: {_first_line(e)}", file=sys.stderr)
        return EXIT_FAILED
    for prompt, text in zip(args.prompt, texts, strict=True):
        print(prompt + text)
    return 0


def _cmd_export_tflite(args) -> int:
    from deepseek_tfx.trainer_module import tflite_export

    try:
        path = tflite_export.export_tflite(args.model_dir, args.output, args.quantize, args.tokenizer_model)
    except (tflite_export.ExportError, OSError) as e:
        print(f"deepseek-tfx: error: {_first_line(e)}", file=sys.stderr)
        return EXIT_FAILED
    print(f"wrote {path} ({os.path.getsize(path) / 1e6:.2f} MB, quantize {args.quantize})")
    print(f"try it:  python -m deepseek_tfx.serving.tflite_runner --model {args.output} --prompt 'First Citizen:'")
    return 0


def _first_line(error: Exception) -> str:
    """An error's message; for TensorFlow's errors, the assertion's text without the graph trace."""
    message = getattr(error, "message", None) or str(error)
    found = re.search(r"assertion failed: (.*)", message)
    return re.sub(r"\]\s*\[", " ", found.group(1)).strip("[] ") if found else message


def _cmd_serve_config(args) -> int:
    from deepseek_tfx.pipeline import local_runner
    from deepseek_tfx.serving import tf_serving

    output = local_runner.absolute(args.output)
    layout = local_runner.Layout(output, args.model_name) if args.model_name else local_runner.Layout(output)
    base, name = os.path.dirname(layout.serving_model_dir), layout.model_name
    try:
        if args.pin is not None:
            tf_serving.pin_version(base, name, args.pin)
        elif args.unpin and not tf_serving.unpin_version(base, name):
            print("no version was pinned", file=sys.stderr)
        pinned = tf_serving.pinned_version(base, name)
    except tf_serving.PinError as e:
        print(f"deepseek-tfx: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    versions = tf_serving.numeric_versions(layout.serving_model_dir)
    if not versions:
        print(f"deepseek-tfx: error: no pushed version under {layout.serving_model_dir}", file=sys.stderr)
        return EXIT_USAGE
    paths = tf_serving.write_configs(base, name, pinned)
    print(f"versions: {' '.join(map(str, versions))}")
    print(f"served:   {pinned} (pinned)" if pinned is not None else f"served:   {versions[-1]} (latest)")
    print(f"config:   {paths['models.config']}")
    return 0


def _metadata(args):
    from deepseek_tfx.pipeline import local_runner

    return local_runner.metadata_connection(args.metadata, args.output, dict(os.environ))


def _cmd_run(args) -> int:
    from deepseek_tfx.pipeline import console as console_lib
    from deepseek_tfx.pipeline.config import PIPELINE_NAME
    from deepseek_tfx.trainer_module.config import ConfigError

    try:
        config = _config_from_args(args)
    except (ConfigError, ValueError) as e:
        print(f"deepseek-tfx: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    run_id = console_lib.new_run_id()
    output = os.path.abspath(args.output) if "://" not in args.output else args.output
    log_path = None if args.verbose else console_lib.log_path(output, run_id)
    store = None

    def state_of(node: str) -> str:
        nonlocal store
        from deepseek_tfx.components import mlmd
        from deepseek_tfx.pipeline import run_report

        store = store or mlmd.open_store(metadata)
        executions = mlmd.run_executions(store, PIPELINE_NAME, node, run_id)
        return run_report.state_name(executions[-1]) if executions else "skipped"

    # Entered before TensorFlow is imported, so its start-up noise goes to the log too.
    console = contextlib.nullcontext() if args.verbose else console_lib.QuietConsole(log_path, state_of)
    error, summary = None, None
    with console:
        from deepseek_tfx.components import mlmd
        from deepseek_tfx.components.text_corpus import CorpusError
        from deepseek_tfx.pipeline import local_runner, run_lock, run_report

        try:
            if args.command == "retrain":
                local_runner.require_spans(args.corpus)
            metadata = _metadata(args)
        except (CorpusError, ConfigError, ValueError) as e:
            error = EXIT_USAGE, f"deepseek-tfx: error: {e}"
        else:
            try:
                summary = local_runner.run(
                    output=args.output, config=config, corpus=args.corpus, beam_args=args.beam_arg,
                    metadata=metadata, wait=args.wait, eval_corpus=args.eval_corpus, run_id=run_id,
                    on_prepared=None if args.verbose else lambda local: console.expect(
                        [c.id for c in local.pipeline.components if type(c).__name__ != "Resolver"]))
            except run_lock.RunLockedError as e:
                error = EXIT_USAGE, f"deepseek-tfx: error: {e}"
            except Exception as e:  # a component failed: show the root cause, not Beam's wrapping
                bad_input = _corpus_error(e)
                if bad_input is not None:  # the corpus, found bad by ExampleGen or before: bad input
                    error = EXIT_USAGE, f"deepseek-tfx: error: {bad_input}"
                else:
                    error = EXIT_FAILED, f"deepseek-tfx: pipeline failed: {_root_cause(e)}"
        if error is None:
            try:
                summary["report"] = run_report.build(mlmd.open_store(metadata), PIPELINE_NAME, run_id, output)
            except Exception as e:  # the run happened; a report that cannot be made is said, not fatal
                logging.getLogger("deepseek_tfx").warning("The run report was not written: %s", _root_cause(e))
    if error is not None:
        print(error[1] + (f" (the run's log: {log_path})" if log_path else ""), file=sys.stderr)
        return error[0]
    from deepseek_tfx.pipeline import report

    summary["log_file"] = log_path
    print(report.format_summary(summary))
    return EXIT_FAILED if summary.get("data_checks_passed") is False else 0


def _cmd_compile(args) -> int:
    from deepseek_tfx.pipeline import kubeflow_runner
    from deepseek_tfx.trainer_module.config import ConfigError

    try:
        path = kubeflow_runner.compile_pipeline(
            engine=args.engine, image=args.image, pipeline_root=args.pipeline_root, corpus=args.corpus,
            corpus_pattern=args.corpus_pattern, serving_dir=args.serving_dir, config=_config_from_args(args),
            output=args.output, beam_args=args.beam_arg, vertex_training_replicas=args.vertex_training_replicas,
            vertex_machine_type=args.vertex_machine_type, vertex_accelerator_type=args.vertex_accelerator_type,
            vertex_accelerator_count=args.vertex_accelerator_count,
            dataflow=args.dataflow, project=args.project, region=args.region, eval_corpus=args.eval_corpus)
    except (ConfigError, ValueError) as e:
        print(f"deepseek-tfx: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    print(path)
    return 0


def _cmd_submit(args) -> int:
    from deepseek_tfx.pipeline import kubeflow_runner

    if not os.path.exists(args.package):
        print(f"deepseek-tfx: error: no compiled pipeline at {args.package}; run `deepseek-tfx compile` first",
              file=sys.stderr)
        return EXIT_USAGE
    if args.engine == "vertex":
        missing = [f"--{n.replace('_', '-')}" for n in ("project", "region", "pipeline_root") if not getattr(args, n)]
        if missing:
            print(f"deepseek-tfx: error: --engine vertex needs {' '.join(missing)}", file=sys.stderr)
            return EXIT_USAGE
        result = kubeflow_runner.submit_vertex(args.package, project=args.project, region=args.region,
                                               pipeline_root=args.pipeline_root, schedule=args.schedule)
    else:
        if not args.host:
            print("deepseek-tfx: error: --engine kubeflow needs --host", file=sys.stderr)
            return EXIT_USAGE
        try:
            result = kubeflow_runner.submit_kubeflow(args.package, host=args.host, schedule=args.schedule)
        except RuntimeError as e:
            print(f"deepseek-tfx: error: {e}", file=sys.stderr)
            return EXIT_FAILED
    print(f"{'scheduled' if args.schedule else 'submitted'}: {getattr(result, 'resource_name', result)}")
    return 0


def _chain(error: BaseException) -> list[BaseException]:
    """``error`` and the errors behind it, outermost first."""
    chain = [error]
    while True:  # `raise ... from None` hides the context: stop there, as Python's own traceback does
        inner = error.__cause__ or (None if error.__suppress_context__ else error.__context__)
        if inner is None or inner in chain:
            return chain
        chain.append(error := inner)


def _corpus_error(error: BaseException) -> str | None:
    """The message of the CorpusError behind ``error``: raised in this process (Beam in memory), or relayed
    as text by a Beam worker process; None when the failure was something else."""
    from deepseek_tfx.components.text_corpus import CorpusError

    chain = _chain(error)
    raised_here = next((e for e in chain if isinstance(e, CorpusError)), None)
    if raised_here is not None:
        return str(raised_here)
    for line in reversed(str(chain[-1]).splitlines()):
        if "CorpusError:" in line:
            return line.split("CorpusError:", 1)[1].strip()
    return None


def _root_cause(error: BaseException) -> str:
    """The innermost error's type and last message line (corpus errors are told apart first: _corpus_error)."""
    error = _chain(error)[-1]
    text = str(error)
    return f"{type(error).__name__}: {text.strip().splitlines()[-1] if text.strip() else ''}"


def _cmd_report(args) -> int:
    from deepseek_tfx.components import mlmd
    from deepseek_tfx.pipeline import local_runner, report, run_report
    from deepseek_tfx.pipeline.config import PIPELINE_NAME

    try:
        store = mlmd.open_store(_metadata(args))
        run_id = args.run or mlmd.latest_run_id(store, PIPELINE_NAME)
        if run_id is None:
            raise report.NothingToReportError(f"no run of {PIPELINE_NAME} in ML Metadata at {args.output}")
        print(run_report.build(store, PIPELINE_NAME, run_id, local_runner.absolute(args.output)))
    except (report.NothingToReportError, ValueError) as e:
        print(f"deepseek-tfx: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    return 0


def _cmd_schema(args) -> int:
    from deepseek_tfx.components import mlmd
    from deepseek_tfx.pipeline import local_runner
    from deepseek_tfx.pipeline import schema as schema_lib
    from deepseek_tfx.trainer_module.config import ConfigError

    schema_dir = local_runner.Layout(local_runner.absolute(args.output)).schema_dir
    try:
        if args.action == "show":
            print(schema_lib.show(schema_dir), end="")
        elif args.action == "reset":
            removed = schema_lib.reset(schema_dir)
            print(f"removed {', '.join(removed)}" if removed else f"no frozen schema in {schema_dir}")
        else:
            margin = _config_from_args(args).data_checks.range_margin
            written = schema_lib.freeze(mlmd.open_store(_metadata(args)), schema_dir, margin)
            print(f"froze {', '.join(written.values())}")
    except (schema_lib.SchemaError, ConfigError, ValueError) as e:
        print(f"deepseek-tfx: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    return 0


def _cmd_lineage(args) -> int:
    from deepseek_tfx.pipeline import report

    try:
        print(report.lineage_text(_metadata(args)))
    except (report.NothingToReportError, ValueError) as e:
        print(f"deepseek-tfx: error: {e}", file=sys.stderr)
        return EXIT_USAGE
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


class _ConsoleHandler(logging.StreamHandler):
    """This project's console handler (a class of its own, so a second main() in one process replaces it)."""


def _setup_logging(quiet_run: bool) -> None:
    """This project's INFO and TFX's progress on the console; in a quiet run (console.QuietConsole) every absl
    record reaches the run's log file, and the console takes what it shows from them."""
    project = logging.getLogger("deepseek_tfx")
    absl_logger = logging.getLogger("absl")
    for logger in (project, absl_logger):  # main() may run more than once in a process (tests)
        for old in [h for h in logger.handlers if isinstance(h, _ConsoleHandler)]:
            logger.removeHandler(old)
        for old in [f for f in logger.filters if isinstance(f, _ProgressFilter)]:
            logger.removeFilter(old)
    handler = _ConsoleHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
    project.setLevel(logging.INFO)
    project.addHandler(handler)
    project.propagate = False
    # absl's verbosity, not only the logger's level: TensorFlow sets the verbosity to FATAL around saving and
    # back to what absl says it was, which would otherwise silence every later INFO record (TFX's progress).
    from absl import logging as absl_logging

    absl_logging.set_verbosity(absl_logging.INFO)
    if not quiet_run:
        absl_logger.addFilter(_ProgressFilter())
    logging.getLogger("apache_beam.runners.portability.local_job_service").addFilter(_DropBeamWorkerChatter())


def main(argv: Sequence[str] | None = None) -> int:
    warnings.filterwarnings("ignore", category=FutureWarning)
    args = _build_parser().parse_args(argv)
    _setup_logging(quiet_run=args.command in ("run", "retrain") and not args.verbose)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
