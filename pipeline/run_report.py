"""The run report: one self-contained HTML page per run, ``OUTPUT/reports/<run id>.html``.

Everything comes from ML Metadata and the artifacts it names (TFDV statistics and
anomalies, the Tokenizer's vocabulary, the ModelRun's TensorBoard events, TFMA's
evaluation, the pushed SavedModel); nothing is parsed from logs. Figures are
matplotlib PNGs inlined as data URIs and the DAG is inline SVG, so the page needs
no network and no script to be read.

Sections (``SECTIONS``): the pipeline DAG with each node's state, duration and
artifacts; the data; the tokenizer; training curves and the expert-load heat map;
the evaluation against the baseline with the gate's decision; the bits per byte of
every pushed version; three sample generations from the pushed model.
"""

from __future__ import annotations

import base64
import datetime
import html
import io
import os
from collections.abc import Callable
from typing import Any

from deepseek_tfx.components import data_checks, mlmd, model_gate
from deepseek_tfx.components.mlmd import prop
from deepseek_tfx.pipeline import console, report
from deepseek_tfx.pipeline.config import EVALUATOR, EXAMPLE_GEN, TRAINER, TRANSFORM

SECTIONS = {"pipeline": "Pipeline", "data": "Data", "tokenizer": "Tokenizer", "training": "Training",
            "evaluation": "Evaluation", "history": "Pushed versions", "samples": "Sample generations"}
SAMPLE_PROMPTS = ("", "First Citizen:\n", "The ")
SAMPLE_SEEDS = (1, 2, 3)
STATE_NAMES = {"COMPLETE": "ran", "CACHED": "cached", "FAILED": "failed", "RUNNING": "running",
               "CANCELED": "canceled", "NEW": "new"}
STATE_COLOURS = {"ran": "#2e7d32", "cached": "#1565c0", "failed": "#c62828", "skipped": "#9e9e9e"}


def report_path(output: str, run_id: str) -> str:
    """Where run ``run_id``'s report goes: ``OUTPUT/reports/<run id>.html``."""
    return os.path.join(output, "reports", console.file_name(run_id) + ".html")


def state_name(execution) -> str:
    """ran / cached / failed / ... for an ML Metadata execution."""
    from ml_metadata.proto import metadata_store_pb2  # noqa: PLC0415

    state = metadata_store_pb2.Execution.State.Name(execution.last_known_state)
    return STATE_NAMES.get(state, state.lower())


# --- figures -------------------------------------------------------------------------------------------------

def _figure(draw: Callable, width: float = 7.0, height: float = 3.0) -> str:
    """An <img> of the matplotlib figure ``draw(axes)`` makes, as an inline PNG."""
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, axes = plt.subplots(figsize=(width, height), dpi=80)
    try:
        draw(axes)
        fig.tight_layout()
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png")
    finally:
        plt.close(fig)
    data = base64.b64encode(buffer.getvalue()).decode()
    return f'<img class="plot" alt="plot" src="data:image/png;base64,{data}">'


def _table(header: list[str], rows: list[list[Any]]) -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _esc(value: Any) -> str:
    return html.escape("n/a" if value is None else str(value))


def _fmt(value: float | None, spec: str = "{:.4f}") -> str:
    return "n/a" if value is None else spec.format(value)


# --- sections ------------------------------------------------------------------------------------------------

def _run_executions(store, pipeline_name: str, run_id: str) -> list[dict]:
    """This run's executions, oldest first: node id, state, seconds, inputs and outputs (artifact ids)."""
    run = store.get_context_by_type_and_name(mlmd.PIPELINE_RUN_CONTEXT, run_id)
    if run is None:
        raise report.NothingToReportError(f"no run {run_id!r} in ML Metadata")
    rows = []
    for execution in sorted(store.get_executions_by_context(run.id), key=lambda e: e.id):
        nodes = [c.name.split(".", 1)[1] for c in store.get_contexts_by_execution(execution.id)
                 if c.name.startswith(f"{pipeline_name}.")]
        if not nodes:
            continue
        rows.append({"node": nodes[0], "state": state_name(execution),
                     "seconds": (execution.last_update_time_since_epoch - execution.create_time_since_epoch) / 1000,
                     "inputs": mlmd.execution_artifacts(store, execution.id, outputs=False),
                     "outputs": mlmd.execution_artifacts(store, execution.id), "id": execution.id})
    return rows


def _dag_svg(nodes: list[dict]) -> str:
    """Components in layers (longest path from a source), an arrow for every artifact one gave another.

    Resolvers (ML Metadata queries, listed in the table) are left out of the picture.
    """
    nodes = [n for n in nodes if not n["node"].endswith("_resolver")]
    producer = {a.id: n["node"] for n in nodes for arts in n["outputs"].values() for a in arts}
    parents = {n["node"]: sorted({producer[a.id] for arts in n["inputs"].values() for a in arts
                                  if a.id in producer and producer[a.id] != n["node"]}) for n in nodes}
    layer: dict[str, int] = {}
    for n in nodes:  # executions run in topological order
        layer[n["node"]] = 1 + max((layer.get(p, 0) for p in parents[n["node"]]), default=-1)
    rows: dict[int, list[str]] = {}
    for n in nodes:
        rows.setdefault(layer[n["node"]], []).append(n["node"])
    box_w, box_h, gap_x, gap_y = 190, 44, 20, 34
    width = max(len(r) for r in rows.values()) * (box_w + gap_x) + gap_x
    height = len(rows) * (box_h + gap_y) + gap_y
    where = {name: (gap_x + i * (box_w + gap_x), gap_y + depth * (box_h + gap_y))
             for depth, names in rows.items() for i, name in enumerate(names)}
    state = {n["node"]: n for n in nodes}
    parts = [f'<svg class="dag" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}">',
             '<defs><marker id="arrow" markerWidth="8" markerHeight="8" refX="7" refY="4" orient="auto">'
             '<path d="M0,0 L8,4 L0,8 z" fill="#555"/></marker></defs>']
    for child, ps in parents.items():
        for p in ps:
            (x1, y1), (x2, y2) = where[p], where[child]
            parts.append(f'<line x1="{x1 + box_w / 2}" y1="{y1 + box_h}" x2="{x2 + box_w / 2}" y2="{y2}" '
                         'stroke="#555" stroke-width="1.2" marker-end="url(#arrow)"/>')
    for name, (x, y) in where.items():
        node = state[name]
        colour = STATE_COLOURS.get(node["state"], "#6a1b9a")
        label = f'{node["state"]} {node["seconds"]:.1f} s'
        parts.append(f'<rect x="{x}" y="{y}" width="{box_w}" height="{box_h}" rx="6" fill="white" '
                     f'stroke="{colour}" stroke-width="2"/>'
                     f'<text x="{x + 8}" y="{y + 18}" font-size="12" font-family="sans-serif">{_esc(name)}</text>'
                     f'<text x="{x + 8}" y="{y + 35}" font-size="11" fill="{colour}" '
                     f'font-family="sans-serif">{_esc(label)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def pipeline_section(store, pipeline_name: str, run_id: str) -> str:
    nodes = _run_executions(store, pipeline_name, run_id)
    known = {c.name.split(".", 1)[1] for c in store.get_contexts_by_type("node")
             if c.name.startswith(f"{pipeline_name}.")}
    skipped = sorted(known - {n["node"] for n in nodes})
    rows = [[_esc(n["node"]), f'<span style="color:{STATE_COLOURS.get(n["state"], "#6a1b9a")}">{_esc(n["state"])}'
             "</span>", f'{n["seconds"]:.1f} s',
             "<br>".join(f"{_esc(key)}: {_esc(mlmd.artifact_type_name(store, a))} <code>{_esc(a.uri)}</code>"
                         for key, arts in n["outputs"].items() for a in arts)] for n in nodes]
    rows += [[_esc(name), '<span style="color:#9e9e9e">skipped</span>', "", "not run in this run"]
             for name in skipped]
    return _dag_svg(nodes) + _table(["node", "state", "duration", "artifacts"], rows)


def _post_transform_statistics(store, pipeline_name: str, run_id: str):
    outputs = mlmd.latest_outputs(store, pipeline_name, TRANSFORM, run_id)
    stats = mlmd.single(outputs, mlmd.POST_TRANSFORM_STATS_KEY)
    return data_checks.load_statistics(stats.uri) if stats is not None else None


def _feature(statistics, name: str):
    return next((f for f in statistics.datasets[0].features if list(f.path.step) == [name]), None)


def data_section(store, pipeline_name: str, run_id: str, summary: dict) -> str:
    parts = [_table(["documents", "bytes", "files", "span(s)", "invalid UTF-8 replaced"], [[
        _esc(summary.get("documents")), _esc(summary.get("bytes")), _esc(summary.get("files")),
        _esc(report.format_spans(summary.get("spans"))), _esc(summary.get("replaced_invalid_utf8"))]])]
    per_span: dict[int, int] = {}
    for execution in mlmd.node_executions(store, pipeline_name, EXAMPLE_GEN):
        for examples in mlmd.execution_artifacts(store, execution.id).get(mlmd.EXAMPLES_KEY, []):
            per_span[mlmd.span(examples)] = prop(examples, "corpus_documents", 0)
    if per_span:
        spans = sorted(per_span)
        parts.append("<h3>Documents per span</h3>" + _figure(lambda ax: (
            ax.bar([str(s) for s in spans], [per_span[s] for s in spans], color="#1565c0"),
            ax.set_xlabel("span"), ax.set_ylabel("documents"))))
    statistics = _post_transform_statistics(store, pipeline_name, run_id)
    num_bytes = _feature(statistics, data_checks.NUM_BYTES) if statistics else None
    if num_bytes is not None and num_bytes.num_stats.histograms:
        buckets = num_bytes.num_stats.histograms[0].buckets
        parts.append("<h3>Document length (UTF-8 bytes, the data trained on)</h3>" + _figure(lambda ax: (
            ax.bar([b.low_value for b in buckets], [b.sample_count for b in buckets],
                   width=[max(b.high_value - b.low_value, 1) for b in buckets], align="edge", color="#2e7d32"),
            ax.set_xlabel("bytes per document"), ax.set_ylabel("documents"))))
    validator = mlmd.single(mlmd.latest_outputs(store, pipeline_name, "ExampleValidator", run_id), "anomalies")
    anomalies = (data_checks.raw_anomaly_reasons(validator.uri, prop(validator, "split_names", "[]"))
                 if validator is not None else [])
    checks = summary.get("data_checks_failed") or []
    verdict = ("n/a" if "data_checks_passed" not in summary else "passed" if summary["data_checks_passed"]
               else "FAILED")
    parts.append(f"<h3>Anomalies</h3><p>ExampleValidator (TFDV): {len(anomalies)} anomal"
                 f"{'y' if len(anomalies) == 1 else 'ies'}; data checks: {verdict}</p>")
    items = anomalies + [r for r in checks if r not in anomalies]
    parts.append("<ul>" + "".join(f"<li>{_esc(r)}</li>" for r in items) + "</ul>" if items else "<p>none</p>")
    return "".join(parts)


def tokenizer_section(store, pipeline_name: str, run_id: str) -> str:
    tokenizer = mlmd.single(mlmd.latest_outputs(store, pipeline_name, "TokenizerGen", run_id), mlmd.TOKENIZER_KEY)
    if tokenizer is None:
        return "<p>No tokenizer in this run.</p>"
    statistics = _post_transform_statistics(store, pipeline_name, run_id)
    tokens = _feature(statistics, data_checks.TOKEN_IDS) if statistics else None
    num_bytes = _feature(statistics, data_checks.NUM_BYTES) if statistics else None
    bytes_per_token = None
    common = getattr(tokens, tokens.WhichOneof("stats")).common_stats if tokens is not None else None
    if common is not None and common.tot_num_values and num_bytes is not None:
        total_bytes = num_bytes.num_stats.mean * num_bytes.num_stats.common_stats.num_non_missing
        bytes_per_token = total_bytes / common.tot_num_values
    parts = [_table(["kind", "vocabulary", "bytes per token", "reused from artifact"], [[
        _esc(prop(tokenizer, "tokenizer_type")), _esc(prop(tokenizer, "vocab_size")), _fmt(bytes_per_token, "{:.2f}"),
        _esc(prop(tokenizer, "reused_from_artifact_id", "no (learned in this span)"))]])]
    pieces = _vocabulary(tokenizer.uri)
    top = list(tokens.string_stats.top_values)[:20] if tokens is not None and tokens.HasField("string_stats") else []
    if top:
        labels = [repr(pieces.get(int(v.value), v.value))[1:-1] for v in top]
        counts = [v.frequency for v in top]
        parts.append("<h3>Most frequent pieces</h3>" + _figure(lambda ax: (
            ax.barh(range(len(labels))[::-1], counts, color="#6a1b9a"),
            ax.set_yticks(range(len(labels))[::-1], labels, fontsize=8), ax.set_xlabel("occurrences")),
            height=4.5))
    return "".join(parts)


def _vocabulary(tokenizer_uri: str) -> dict[int, str]:
    """id -> piece from the Tokenizer artifact's vocabulary file (empty for the byte tokenizer)."""
    import tensorflow as tf  # noqa: PLC0415

    from deepseek_tfx.components.tokenizer_gen import VOCAB_FILE  # noqa: PLC0415

    path = os.path.join(tokenizer_uri, VOCAB_FILE)
    if not tf.io.gfile.exists(path):
        return {}
    with tf.io.gfile.GFile(path) as f:
        return {i: line.split("\t", 1)[0] for i, line in enumerate(f)}


def training_scalars(model_run_uri: str) -> dict[str, list[tuple[int, float]]]:
    """Every scalar of the ModelRun's TensorBoard event files (train/, eval/), by tag: [(step, value)]."""
    import tensorflow as tf  # noqa: PLC0415

    scalars: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(tf.io.gfile.glob(os.path.join(model_run_uri, "*", "events.out.tfevents.*"))):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                if value.HasField("tensor") and not value.tensor.tensor_shape.dim:
                    scalars.setdefault(value.tag, []).append((event.step, float(tf.make_ndarray(value.tensor))))
    return {tag: sorted(points) for tag, points in scalars.items()}


def training_section(store, pipeline_name: str, run_id: str) -> str:
    model_run = mlmd.single(mlmd.latest_outputs(store, pipeline_name, TRAINER, run_id), mlmd.MODEL_RUN_KEY)
    if model_run is None:
        return "<p>No training in this run (see the data checks).</p>"
    scalars = training_scalars(model_run.uri)
    parts = [f"<p>TensorBoard logs: <code>{_esc(model_run.uri)}</code> "
             f"(<code>tensorboard --logdir {_esc(model_run.uri)}</code>)</p>"]

    def curve(title: str, tags: list[str], ylabel: str) -> None:
        present = [t for t in tags if scalars.get(t)]
        if not present:
            return

        def draw(ax):
            for tag in present:
                steps, values = zip(*scalars[tag], strict=True)
                ax.plot(steps, values, marker="o" if len(steps) < 12 else None, label=tag)
            ax.set_xlabel("step")
            ax.set_ylabel(ylabel)
            ax.legend(fontsize=8)
        parts.append(f"<h3>{html.escape(title)}</h3>" + _figure(draw))

    curve("Loss", ["train/loss", "eval/loss"], "loss (nats per token)")
    curve("Learning rate", ["train/learning_rate"], "learning rate")
    curve("Gradient norm", ["train/grad_norm"], "global norm")
    curve("Throughput", ["train/tokens_per_second"], "tokens/s")
    curve("Model FLOPs utilisation", ["train/mfu"], "MFU")
    loads = sorted((int(t.rsplit("/", 1)[1]), t) for t in scalars if t.startswith("moe/load_max_over_mean/"))
    if loads:
        steps = sorted({s for _, t in loads for s, _ in scalars[t]})
        grid = [[dict(scalars[t]).get(s, float("nan")) for s in steps] for _, t in loads]

        def heat(ax):
            image = ax.imshow(grid, aspect="auto", cmap="viridis", interpolation="nearest",
                              extent=(steps[0], steps[-1], len(loads) - 0.5, -0.5))
            ax.set_yticks(range(len(loads)), [f"MoE layer {i}" for i, _ in loads])
            ax.set_xlabel("step")
            ax.figure.colorbar(image, ax=ax, label="max / mean expert load")
        parts.append("<h3>Expert load per MoE layer (busiest expert over the mean; 1 is balanced)</h3>"
                     + _figure(heat, height=1.2 + 0.5 * len(loads)))
    else:
        parts.append("<p>Dense model: no expert load.</p>")
    return "".join(parts)


def evaluation_section(store, pipeline_name: str, run_id: str) -> str:
    outputs = mlmd.latest_outputs(store, pipeline_name, EVALUATOR, run_id)
    evaluation, blessing = mlmd.single(outputs, "evaluation"), mlmd.single(outputs, "blessing")
    if evaluation is None:
        return "<p>No evaluation in this run (see the data checks).</p>"
    values = {}  # (slice label, metric) -> {"candidate": x, "baseline": y}
    for source, label in ((model_gate.NEW, "new data"), (model_gate.REFERENCE, "reference eval set"),
                          (None, "all eval examples")):
        for metric in ("bits_per_byte", "perplexity"):
            found = model_gate.slice_metrics(evaluation.uri, source, metric)
            if found:
                values[label, metric] = found
    rows = [[label, metric, _fmt(v.get("candidate")), _fmt(v.get("baseline"))] for (label, metric), v in values.items()]
    blessed = bool(prop(blessing, "blessed", 0)) if blessing is not None else None
    reasons = report.failed_bounds(evaluation.uri) if blessed is False else []
    thresholds = _thresholds(evaluation.uri)
    parts = [_table(["slice", "metric", "candidate", "baseline (last blessed)"], rows),
             "<h3>Thresholds</h3>" + ("<ul>" + "".join(f"<li>{_esc(t)}</li>" for t in thresholds) + "</ul>"
                                      if thresholds else "<p>n/a</p>"),
             f"<h3>Decision</h3><p><b>{'blessed' if blessed else 'not blessed'}</b>"
             f" (compared by {_esc(prop(evaluation, model_gate.COMPARED_BY))})</p>"]
    if reasons:
        parts.append("<ul>" + "".join(f"<li>{_esc(r)}</li>" for r in reasons) + "</ul>")
    bars = [(label, v) for (label, metric), v in values.items() if metric == "bits_per_byte"]
    if bars:
        def draw(ax):
            xs = range(len(bars))
            for offset, model in ((-0.2, "candidate"), (0.2, "baseline")):
                ax.bar([x + offset for x in xs], [v.get(model, float("nan")) for _, v in bars], width=0.4,
                       label=model)
            ax.set_xticks(list(xs), [label for label, _ in bars])
            ax.set_ylabel("bits per byte")
            ax.legend(fontsize=8)
        parts.append(_figure(draw))
    return "".join(parts)


def _thresholds(evaluation_uri: str) -> list[str]:
    """The thresholds of the EvalConfig the Evaluator ran with (TFMA writes it beside the metrics)."""
    import tensorflow_model_analysis as tfma  # noqa: PLC0415

    try:
        config = tfma.load_eval_result(evaluation_uri).config
    except Exception:
        return []
    lines = []
    for spec in config.metrics_specs:
        for metric in spec.metrics:
            entries = [("all", metric.threshold)] if metric.HasField("threshold") else []
            entries += [(", ".join(f"{k}={v}" for s in p.slicing_specs for k, v in s.feature_values.items()),
                         p.threshold) for p in metric.per_slice_thresholds]
            for where, threshold in entries:
                if threshold.value_threshold.HasField("upper_bound"):
                    lines.append(f"{metric.class_name} <= {threshold.value_threshold.upper_bound.value:g} ({where})")
                if threshold.HasField("change_threshold"):
                    lines.append(f"{metric.class_name} at most {threshold.change_threshold.absolute.value:g} worse "
                                 f"than the baseline ({where})")
    return lines


def history_section(store) -> str:
    rows, points = [], []
    for pushed in mlmd.pushed_models(store):
        model = mlmd.producer_inputs(store, [pushed], mlmd.MODEL_KEY)[0]
        spans = [mlmd.span(a, None) for a in mlmd.trained_examples(store, model)]
        evaluations = [a for i in mlmd.consumer_ids(store, model.id, mlmd.MODEL_KEY)
                       for a in mlmd.execution_artifacts(store, i).get("evaluation", [])]
        bpb = None
        if evaluations:
            metrics = report.evaluation_metrics(evaluations[-1].uri, model_gate.NEW) or report.evaluation_metrics(
                evaluations[-1].uri)
            bpb = metrics.get("bits_per_byte")
        version = prop(pushed, mlmd.PUSHED_VERSION_PROPERTY)
        when = datetime.datetime.fromtimestamp(pushed.create_time_since_epoch / 1000, datetime.timezone.utc)
        rows.append([_esc(version), when.strftime("%Y-%m-%d %H:%M:%S UTC"), _esc(report.format_spans(spans)),
                     _fmt(bpb)])
        points.append((when, bpb, report.format_spans(spans)))
    if not rows:
        return "<p>No version pushed yet.</p>"
    parts = [_table(["version", "pushed", "trained on", "bits per byte (its eval)"], rows)]
    plotted = [(i, w, b, s) for i, (w, b, s) in enumerate(points) if b is not None]
    if plotted:
        def draw(ax):
            ax.plot([i for i, *_ in plotted], [b for _, _, b, _ in plotted], marker="o", color="#2e7d32")
            for i, _, b, spans in plotted:
                ax.annotate(spans, (i, b), textcoords="offset points", xytext=(4, 4), fontsize=8)
            ax.set_xticks([i for i, *_ in plotted], [w.strftime("%m-%d %H:%M") for _, w, _, _ in plotted],
                          fontsize=8, rotation=30)
            ax.set_xlim(-0.5, len(points) - 0.5)
            ax.set_xlabel("pushed (UTC)")
            ax.set_ylabel("bits per byte")
        parts.append(_figure(draw))
    return "".join(parts)


def _sample(text: str) -> str:
    """Generated text with its newlines shown (a small model often emits many)."""
    return "<pre class='sample'>" + _esc(text).replace("\n", "\u21b5\n") + "</pre>"


def samples_section(store) -> str:
    from deepseek_tfx.serving import client  # noqa: PLC0415

    pushed = mlmd.latest_pushed_model(store)
    if pushed is None:
        return "<p>No pushed model to generate from.</p>"
    path = prop(pushed, mlmd.PUSHED_DESTINATION_PROPERTY)
    if not path or not os.path.exists(os.path.join(path, "saved_model.pb")):
        return f"<p>The pushed model {_esc(path)} is no longer on disk.</p>"
    rows = []
    greedy = client.local_generate(path, list(SAMPLE_PROMPTS), max_new_tokens=48, temperature=0.0)
    for prompt, text in zip(SAMPLE_PROMPTS, greedy, strict=True):
        rows.append([f"<code>{_esc(repr(prompt))}</code>", "greedy", _sample(text)])
    for prompt, seed in zip(SAMPLE_PROMPTS, SAMPLE_SEEDS, strict=True):
        [text] = client.local_generate(path, [prompt], max_new_tokens=48, temperature=0.8, top_k=40, seed=seed)
        rows.append([f"<code>{_esc(repr(prompt))}</code>", f"temperature 0.8, top-k 40, seed {seed}", _sample(text)])
    return (f"<p>From <code>{_esc(path)}</code> (version {_esc(prop(pushed, mlmd.PUSHED_VERSION_PROPERTY))})</p>"
            + _table(["prompt", "decoding", "text"], rows))


STYLE = """
body { font-family: sans-serif; max-width: 1100px; margin: 2em auto; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0; } td, th { border: 1px solid #ccc; padding: 3px 8px;
vertical-align: top; font-size: 13px; } th { background: #f3f3f3; } code { font-size: 12px; }
pre { white-space: pre-wrap; margin: 0; } pre.sample { max-height: 7em; overflow: auto; min-width: 40em; }
img.plot { display: block; margin: 0.5em 0; }
section { border-top: 2px solid #1565c0; margin-top: 1.5em; }
"""


def build(store, pipeline_name: str, run_id: str, output: str) -> str:
    """Writes run ``run_id``'s report under ``output/reports`` (whole, then renamed in) and returns its path."""
    import tensorflow as tf  # noqa: PLC0415

    summary = report.run_summary(store, pipeline_name, run_id)
    makers = {"pipeline": lambda: pipeline_section(store, pipeline_name, run_id),
              "data": lambda: data_section(store, pipeline_name, run_id, summary),
              "tokenizer": lambda: tokenizer_section(store, pipeline_name, run_id),
              "training": lambda: training_section(store, pipeline_name, run_id),
              "evaluation": lambda: evaluation_section(store, pipeline_name, run_id),
              "history": lambda: history_section(store),
              "samples": lambda: samples_section(store)}
    body = []
    for key, title in SECTIONS.items():
        body.append(f'<section id="{key}"><h2>{html.escape(title)}</h2>{makers[key]()}</section>')
    page = (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>deepseek-tfx run {html.escape(run_id)}"
            f"</title><style>{STYLE}</style></head><body><h1>deepseek-tfx run report</h1>"
            f"<p>Run <code>{html.escape(run_id)}</code> of pipeline <code>{html.escape(pipeline_name)}</code>; "
            f"{_esc(report.format_spans(summary.get('spans')))}; blessed: "
            f"{_esc({True: 'yes', False: 'no'}.get(summary.get('blessed'), 'n/a'))}</p>"
            + "".join(body) + "</body></html>")
    path = report_path(output, run_id)
    tf.io.gfile.makedirs(os.path.dirname(path))
    with tf.io.gfile.GFile(path + ".tmp", "w") as f:
        f.write(page)
    tf.io.gfile.rename(path + ".tmp", path, overwrite=True)
    return path


