"""TFLiteExporter: an optional step after the Pusher that converts the pushed version to TensorFlow Lite.

Input: the Pusher's ``pushed_model``. Output: ``tflite_model`` (a Model artifact) holding what
``deepseek-tfx export-tflite`` writes (``model.tflite``, ``tokenizer.model``, ``tflite_config.json``;
trainer_module.tflite_export). When the Pusher pushed nothing (the model was not blessed), the step writes
nothing and marks its output ``exported`` = 0. On by ``PipelineConfig.export_tflite``.
"""

from __future__ import annotations

import os
import tempfile

from absl import logging
from tfx import types
from tfx.dsl.components.base import base_component, base_executor, executor_spec
from tfx.types import artifact_utils, standard_artifacts
from tfx.types.component_spec import ChannelParameter, ComponentSpec, ExecutionParameter

from deepseek_tfx.components.mlmd import (
    PUSHED_DESTINATION_PROPERTY,
    PUSHED_MODEL_KEY,
    PUSHED_PROPERTY,
    TFLITE_EXPORTED_PROPERTY,
    TFLITE_MODEL_KEY,
    TFLITE_QUANTIZE_PROPERTY,
)

QUANTIZE_KEY = "quantize"


class TFLiteExporterSpec(ComponentSpec):
    PARAMETERS = {QUANTIZE_KEY: ExecutionParameter(type=str)}
    INPUTS = {PUSHED_MODEL_KEY: ChannelParameter(type=standard_artifacts.PushedModel)}
    OUTPUTS = {TFLITE_MODEL_KEY: ChannelParameter(type=standard_artifacts.Model)}


class _Executor(base_executor.BaseExecutor):
    def Do(self, input_dict, output_dict, exec_properties) -> None:  # noqa: N802
        import tensorflow as tf  # noqa: PLC0415

        from deepseek_tfx.trainer_module import tflite_export  # noqa: PLC0415

        pushed = artifact_utils.get_single_instance(input_dict[PUSHED_MODEL_KEY])
        output = artifact_utils.get_single_instance(output_dict[TFLITE_MODEL_KEY])
        if not pushed.get_int_custom_property(PUSHED_PROPERTY):
            output.set_int_custom_property(TFLITE_EXPORTED_PROPERTY, 0)
            logging.info("Nothing was pushed: no TensorFlow Lite export")
            return
        source = pushed.get_string_custom_property(PUSHED_DESTINATION_PROPERTY)
        quantize = exec_properties[QUANTIZE_KEY]
        with tempfile.TemporaryDirectory() as tmp:  # converted locally, then copied (the URI may be a bucket)
            local = os.path.join(tmp, "tflite")
            tflite_export.export_tflite(source, local, quantize)
            tf.io.gfile.makedirs(output.uri)
            for name in os.listdir(local):
                tf.io.gfile.copy(os.path.join(local, name), os.path.join(output.uri, name), overwrite=True)
        output.set_int_custom_property(TFLITE_EXPORTED_PROPERTY, 1)
        output.set_string_custom_property(TFLITE_QUANTIZE_PROPERTY, quantize)
        output.set_string_custom_property("source", source)
        logging.info("TensorFlow Lite model (%s) of %s written to %s", quantize, source, output.uri)


class TFLiteExporter(base_component.BaseComponent):
    """Converts the pushed model to TensorFlow Lite (trainer_module.tflite_export).

    Args:
        pushed_model: the Pusher's ``pushed_model`` channel.
        quantize: none (float32), float16 or dynamic-int8.
    """

    SPEC_CLASS = TFLiteExporterSpec
    EXECUTOR_SPEC = executor_spec.ExecutorClassSpec(_Executor)

    def __init__(self, pushed_model, quantize: str = "none"):
        super().__init__(spec=TFLiteExporterSpec(
            pushed_model=pushed_model, quantize=quantize,
            tflite_model=types.Channel(type=standard_artifacts.Model)))
