"""Builds what the Trainer's ``run_fn`` receives, without a pipeline: a real Transform output.

tf.Transform (DirectRunner, in this process) runs the project's
``preprocessing_fn`` with the byte tokenizer over a few hundred documents and
writes the transform graph and gzipped TFRecords of transformed examples, the
layout TFX's Transform writes. ``fn_args`` then mirrors TFX's FnArgs.
"""

from __future__ import annotations

import os
import types

import apache_beam as beam
import tensorflow as tf
import tensorflow_transform as tft
import tensorflow_transform.beam as tft_beam
from tensorflow_transform.tf_metadata import dataset_metadata, metadata_io, schema_utils

from deepseek_tfx.trainer_module.preprocessing import preprocessing_fn

RAW_SPEC = {"text": tf.io.FixedLenFeature([1], tf.string)}


def _documents(text: str) -> list[str]:
    return [d.strip() for d in text.split("\n\n") if d.strip()]


def build_transform_output(directory: str, text: str, eval_fraction: float = 0.1) -> dict:
    """Transforms ``text`` (blank-line separated documents); returns paths like TFX's Transform outputs."""
    docs = _documents(text)
    n_eval = max(1, int(len(docs) * eval_fraction))
    splits = {"train": docs[:-n_eval], "eval": docs[-n_eval:]}
    metadata = dataset_metadata.DatasetMetadata(schema_utils.schema_from_feature_spec(RAW_SPEC))
    transform_output = os.path.join(directory, "transform_graph")
    with beam.Pipeline() as p, tft_beam.Context(temp_dir=os.path.join(directory, "tmp"), force_tf_compat_v1=False):
        raw = {name: p | f"Create{name}" >> beam.Create([{"text": [d.encode()]} for d in split])
               for name, split in splits.items()}
        (transformed_train, transformed_metadata), transform_fn = (
            (raw["train"], metadata) | tft_beam.AnalyzeAndTransformDataset(
                lambda inputs: preprocessing_fn(inputs, {}), output_record_batches=False))
        transformed_eval, _ = ((raw["eval"], metadata), transform_fn) | tft_beam.TransformDataset(
            output_record_batches=False)
        _ = transform_fn | tft_beam.WriteTransformFn(transform_output)
        coder = tft.coders.ExampleProtoCoder(transformed_metadata.schema)
        for name, pcoll in (("train", transformed_train), ("eval", transformed_eval)):
            _ = (pcoll | f"Encode{name}" >> beam.Map(coder.encode)
                 | f"Write{name}" >> beam.io.WriteToTFRecord(
                     os.path.join(directory, f"Split-{name}", "part"), file_name_suffix=".gz"))
    # TFX's Transform also stores the raw metadata beside the graph (TFTransformOutput reads it).
    metadata_io.write_metadata(metadata, os.path.join(transform_output, tft.TFTransformOutput.RAW_METADATA_DIR))
    return {"transform_output": transform_output,
            "train_files": [os.path.join(directory, "Split-train", "*")],
            "eval_files": [os.path.join(directory, "Split-eval", "*")],
            "documents": {k: len(v) for k, v in splits.items()}}


def fn_args(inputs: dict, run_dir: str, train_steps: int, custom_config: dict,
            base_model: str | None = None) -> types.SimpleNamespace:
    """The FnArgs fields ``run_fn`` reads, under ``run_dir`` in TFX's layout."""
    return types.SimpleNamespace(
        transform_output=inputs["transform_output"], train_files=inputs["train_files"],
        eval_files=inputs["eval_files"], train_steps=train_steps, custom_config=custom_config,
        model_run_dir=os.path.join(run_dir, "Trainer", "model_run", "1"),
        serving_model_dir=os.path.join(run_dir, "Trainer", "model", "1", "Format-Serving"),
        base_model=base_model, eval_steps=None)
