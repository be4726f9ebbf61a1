"""Transform and Trainer that also take the ``Tokenizer`` artifact as an input.

Each extends the standard component's spec with a ``tokenizer`` channel and
delegates to the standard executor, after putting the tokenizer's directory
into ``custom_config['tokenizer_dir']``. So the tokenizer is an MLMD input of
both (lineage and caching see it), and no stage guesses another's paths.

The Trainer also takes an optional ``train_steps`` integer: TFX 1.16 cannot put a
RuntimeParameter inside ``train_args`` (a proto), but a plain integer parameter can
be one, so compiled pipelines expose the step count as a runtime parameter; when
set it replaces ``train_args.num_steps``.
"""

from __future__ import annotations

import json
from typing import Any

from tfx import types
from tfx.components.trainer import executor as trainer_executor
from tfx.components.tuner import executor as tuner_executor
from tfx.components.transform import executor as transform_executor
from tfx.dsl.components.base import base_beam_component, base_component, executor_spec
from tfx.extensions.google_cloud_ai_platform import constants
from tfx.extensions.google_cloud_ai_platform.trainer import executor as vertex_executor
from tfx.proto import trainer_pb2
from tfx.types import artifact_utils, standard_artifacts, standard_component_specs
from tfx.types.component_spec import ChannelParameter, ExecutionParameter
from tfx.utils import json_utils, proto_utils

from deepseek_tfx.components.mlmd import TOKENIZER_KEY
from deepseek_tfx.components.tokenizer_gen import Tokenizer
from deepseek_tfx.trainer_module.tokenizer import TOKENIZER_DIR_KEY



TRAIN_STEPS_KEY = "train_steps"


def _with_tokenizer_dir(input_dict, exec_properties) -> tuple[dict, dict]:
    tokenizer = artifact_utils.get_single_instance(input_dict[TOKENIZER_KEY])
    custom = json.loads(exec_properties.get(standard_component_specs.CUSTOM_CONFIG_KEY) or "null") or {}
    custom[TOKENIZER_DIR_KEY] = tokenizer.uri
    exec_properties = {**exec_properties, standard_component_specs.CUSTOM_CONFIG_KEY: json.dumps(custom)}
    if exec_properties.get(TRAIN_STEPS_KEY):  # the runtime parameter wins over train_args
        exec_properties[standard_component_specs.TRAIN_ARGS_KEY] = proto_utils.proto_to_json(
            trainer_pb2.TrainArgs(num_steps=int(exec_properties[TRAIN_STEPS_KEY])))
    return {k: v for k, v in input_dict.items() if k != TOKENIZER_KEY}, exec_properties


class _TransformExecutor(transform_executor.Executor):
    def Do(self, input_dict, output_dict, exec_properties) -> None:  # noqa: N802
        inputs, properties = _with_tokenizer_dir(input_dict, exec_properties)
        super().Do(inputs, output_dict, properties)


class _TrainerExecutor(trainer_executor.GenericExecutor):
    def Do(self, input_dict, output_dict, exec_properties) -> None:  # noqa: N802
        inputs, properties = _with_tokenizer_dir(input_dict, exec_properties)
        super().Do(inputs, output_dict, properties)


class _TunerExecutor(tuner_executor.Executor):
    def Do(self, input_dict, output_dict, exec_properties) -> None:  # noqa: N802
        inputs, properties = _with_tokenizer_dir(input_dict, exec_properties)
        super().Do(inputs, output_dict, properties)


class _VertexTrainerExecutor(vertex_executor.GenericExecutor):
    """Submits the Trainer as a Vertex AI custom job; the job runs ``run_fn`` on every replica."""

    def Do(self, input_dict, output_dict, exec_properties) -> None:  # noqa: N802
        inputs, properties = _with_tokenizer_dir(input_dict, exec_properties)
        super().Do(inputs, output_dict, properties)


DEFAULT_MACHINE_TYPE = "n1-standard-8"


def vertex_training_config(project: str, region: str, image: str, replicas: int,
                           machine_type: str | None = None, accelerator_type: str | None = None,
                           accelerator_count: int = 0) -> dict[str, Any]:
    """The Trainer's ``custom_config`` keys for TFX's Vertex AI training extension.

    One chief plus ``replicas - 1`` workers of the pipeline image, each a ``machine_type``
    (default n1-standard-8) with ``accelerator_count`` accelerators of ``accelerator_type``
    (Vertex AI's names, e.g. NVIDIA_TESLA_T4, NVIDIA_L4, NVIDIA_H100_80GB, TPU_V3) when given.
    Vertex sets ``TF_CONFIG`` on each replica; ``run_fn`` picks its strategy from what it finds
    (trainer_module.trainer.get_strategy: TPUStrategy on a TPU, MultiWorkerMirrored across
    replicas, Mirrored over several local GPUs) and only the chief exports.
    """
    if replicas < 1:
        raise ValueError(f"--vertex-training-replicas must be >= 1, got {replicas}")
    if accelerator_count < 0 or bool(accelerator_type) != (accelerator_count > 0):
        raise ValueError("--vertex-accelerator-type and --vertex-accelerator-count (>= 1) go together, got "
                         f"{accelerator_type!r} and {accelerator_count}")
    machine = {"machine_type": machine_type or DEFAULT_MACHINE_TYPE}
    if accelerator_type:
        machine.update(accelerator_type=accelerator_type, accelerator_count=accelerator_count)
    container = {"image_uri": image}
    pools = [{"machine_spec": machine, "replica_count": 1, "container_spec": container}]
    if replicas > 1:
        pools.append({"machine_spec": dict(machine), "replica_count": replicas - 1, "container_spec": container})
    return {
        constants.ENABLE_VERTEX_KEY: True,
        constants.VERTEX_REGION_KEY: region,
        vertex_executor.TRAINING_ARGS_KEY: {"project": project, "job_spec": {"worker_pool_specs": pools}},
    }


class TokenizingTransformSpec(standard_component_specs.TransformSpec):
    INPUTS = {**standard_component_specs.TransformSpec.INPUTS,
              TOKENIZER_KEY: ChannelParameter(type=Tokenizer)}


class TokenizingTrainerSpec(standard_component_specs.TrainerSpec):
    INPUTS = {**standard_component_specs.TrainerSpec.INPUTS,
              TOKENIZER_KEY: ChannelParameter(type=Tokenizer)}
    PARAMETERS = {**standard_component_specs.TrainerSpec.PARAMETERS,
                  TRAIN_STEPS_KEY: ExecutionParameter(type=int, optional=True)}


class TokenizingTunerSpec(standard_component_specs.TunerSpec):
    INPUTS = {**standard_component_specs.TunerSpec.INPUTS,
              TOKENIZER_KEY: ChannelParameter(type=Tokenizer)}


class TokenizingTransform(base_beam_component.BaseBeamComponent):
    """TFX Transform whose ``preprocessing_fn(inputs, custom_config)`` gets the tokenizer's directory.

    Args:
        examples, schema: as for Transform.
        tokenizer: channel of the Tokenizer to apply.
        preprocessing_fn: module path of the preprocessing function.
        stats_options_updater_fn: module path of Transform's statistics options updater (optional).
        custom_config: extra configuration for ``preprocessing_fn``.
    """

    SPEC_CLASS = TokenizingTransformSpec
    EXECUTOR_SPEC = executor_spec.BeamExecutorSpec(_TransformExecutor)

    def __init__(self, examples, schema, tokenizer, preprocessing_fn: str,
                 custom_config: dict[str, Any] | None = None, stats_options_updater_fn: str | None = None):
        channel = types.Channel
        super().__init__(spec=TokenizingTransformSpec(
            examples=examples, schema=schema, tokenizer=tokenizer, preprocessing_fn=preprocessing_fn,
            stats_options_updater_fn=stats_options_updater_fn,
            force_tf_compat_v1=0, custom_config=json_utils.dumps(custom_config or {}),
            disable_statistics=0,
            transform_graph=channel(type=standard_artifacts.TransformGraph),
            transformed_examples=channel(type=standard_artifacts.Examples),
            updated_analyzer_cache=channel(type=standard_artifacts.TransformCache),
            pre_transform_schema=channel(type=standard_artifacts.Schema),
            pre_transform_stats=channel(type=standard_artifacts.ExampleStatistics),
            post_transform_schema=channel(type=standard_artifacts.Schema),
            post_transform_stats=channel(type=standard_artifacts.ExampleStatistics),
            post_transform_anomalies=channel(type=standard_artifacts.ExampleAnomalies)))


class TokenizingTrainer(base_component.BaseComponent):
    """TFX Trainer (generic executor) whose ``run_fn`` finds the tokenizer in ``custom_config``.

    Args:
        examples, transform_graph, schema, base_model, train_args, eval_args: as for Trainer.
        tokenizer: channel of the Tokenizer the examples were made with.
        train_steps: replaces ``train_args.num_steps`` when set (an int or a RuntimeParameter).
        hyperparameters: the Tuner's best_hyperparameters (optional); run_fn applies them.
        run_fn: module path of the run function.
        custom_config: extra configuration for ``run_fn``.
    """

    SPEC_CLASS = TokenizingTrainerSpec
    EXECUTOR_SPEC = executor_spec.ExecutorClassSpec(_TrainerExecutor)

    def __init__(self, examples, transform_graph, schema, tokenizer, run_fn: str,
                 train_args: trainer_pb2.TrainArgs, eval_args: trainer_pb2.EvalArgs | None = None,
                 base_model=None, custom_config: dict[str, Any] | None = None, train_steps=None,
                 hyperparameters=None):
        super().__init__(spec=TokenizingTrainerSpec(
            examples=examples, transform_graph=transform_graph, schema=schema, tokenizer=tokenizer,
            base_model=base_model, hyperparameters=hyperparameters, run_fn=run_fn, train_args=train_args,
            train_steps=train_steps,
            eval_args=eval_args or trainer_pb2.EvalArgs(),
            custom_config=json_utils.dumps(custom_config or {}),
            model=types.Channel(type=standard_artifacts.Model),
            model_run=types.Channel(type=standard_artifacts.ModelRun)))


class VertexTokenizingTrainer(TokenizingTrainer):
    """TokenizingTrainer that trains as a Vertex AI custom job (chief + workers; see vertex_training_config)."""

    EXECUTOR_SPEC = executor_spec.ExecutorClassSpec(_VertexTrainerExecutor)


class TokenizingTuner(base_component.BaseComponent):
    """TFX Tuner whose ``tuner_fn`` finds the tokenizer in ``custom_config`` (trainer_module.tuning).

    Args:
        examples, transform_graph, schema, train_args, eval_args: as for Tuner.
        tokenizer: channel of the Tokenizer the examples were made with.
        tuner_fn: module path of the tuner function.
        custom_config: the model, train and tune configs.
    """

    SPEC_CLASS = TokenizingTunerSpec
    EXECUTOR_SPEC = executor_spec.ExecutorClassSpec(_TunerExecutor)

    def __init__(self, examples, transform_graph, schema, tokenizer, tuner_fn: str,
                 train_args: trainer_pb2.TrainArgs, eval_args: trainer_pb2.EvalArgs | None = None,
                 custom_config: dict[str, Any] | None = None):
        super().__init__(spec=TokenizingTunerSpec(
            examples=examples, transform_graph=transform_graph, schema=schema, tokenizer=tokenizer,
            tuner_fn=tuner_fn, train_args=train_args, eval_args=eval_args or trainer_pb2.EvalArgs(),
            custom_config=json_utils.dumps(custom_config or {}),
            best_hyperparameters=types.Channel(type=standard_artifacts.HyperParameters),
            tuner_results=types.Channel(type=standard_artifacts.TunerResults)))
