"""The pipeline's frozen schema: ``deepseek-tfx schema show|freeze|reset``.

SchemaGen infers a schema from each run's own data, so ExampleValidator could never
flag a bad new span. After the first run whose model is pushed, the local runner
freezes that run's schema here (``OUTPUT/schema/``), with the text ranges the data
checks need (components.data_checks.text_constraints, from the same run's
post-transform statistics); from then on the pipeline imports both (ImportSchemaGen)
instead of inferring them. ``freeze`` takes them again from the latest pushed model's
run, ``reset`` goes back to inferring.

Files (pipeline.pipeline.SCHEMA_FILE, TEXT_SCHEMA_FILE): ``schema.pbtxt`` (the raw
examples) and ``text_schema.pbtxt`` (document bytes and token-count ranges).
"""

from __future__ import annotations

import os

from tfx.dsl.io import fileio
from tfx.utils import io_utils

from deepseek_tfx.components import data_checks, mlmd
from deepseek_tfx.components.mlmd import SCHEMA_KEY
from deepseek_tfx.pipeline.pipeline import SCHEMA_FILE, TEXT_SCHEMA_FILE

FILES = (SCHEMA_FILE, TEXT_SCHEMA_FILE)


class SchemaError(RuntimeError):
    """The schema cannot be frozen or shown; the message says why."""


def is_frozen(schema_dir: str) -> bool:
    """Whether both frozen files are there (a half-written freeze is never left: see freeze)."""
    return all(fileio.exists(os.path.join(schema_dir, name)) for name in FILES)


def freeze(store, schema_dir: str, margin: float) -> dict[str, str]:
    """Freezes the schema of the latest pushed model's run into ``schema_dir``; returns the files written.

    The raw schema is the one that model's Trainer was given; the text ranges come from the post-transform
    statistics of the data it was trained on. Both files are written beside each other first and moved in
    only when complete.
    """
    pushed = mlmd.latest_pushed_model(store)
    if pushed is None:
        raise SchemaError("no model has been pushed yet: the schema is frozen from a pushed model's run")
    model = mlmd.producer_inputs(store, [pushed], mlmd.MODEL_KEY)[0]
    schemas = mlmd.producer_inputs(store, [model], SCHEMA_KEY)
    statistics = mlmd.training_statistics(store, model)
    if not schemas or not statistics:
        raise SchemaError(f"the run of the pushed model {model.uri} recorded no schema or post-transform "
                          "statistics in ML Metadata")
    raw = data_checks.read_schema(schemas[0].uri)
    text = data_checks.text_constraints(data_checks.load_statistics(statistics[0].uri), margin)
    fileio.makedirs(schema_dir)
    written = {}
    for name, proto in ((SCHEMA_FILE, raw), (TEXT_SCHEMA_FILE, text)):
        path = os.path.join(schema_dir, name)
        io_utils.write_pbtxt_file(path + ".tmp", proto)
        written[name] = path
    for path in written.values():
        fileio.rename(path + ".tmp", path, overwrite=True)
    return written


def show(schema_dir: str) -> str:
    """Both frozen files, as text."""
    if not is_frozen(schema_dir):
        raise SchemaError(f"no frozen schema in {schema_dir}: each run infers its schema until a run pushes a "
                          "model (or `deepseek-tfx schema freeze`)")
    parts = []
    for name in FILES:
        with fileio.open(os.path.join(schema_dir, name)) as f:
            parts.append(f"# {os.path.join(schema_dir, name)}\n{f.read()}")
    return "\n".join(parts)


def reset(schema_dir: str) -> list[str]:
    """Removes the frozen files (the next run infers its schema again); returns those removed."""
    removed = []
    for name in FILES:
        path = os.path.join(schema_dir, name)
        if fileio.exists(path):
            fileio.remove(path)
            removed.append(path)
    return removed
