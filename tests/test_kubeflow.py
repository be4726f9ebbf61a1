"""Compiling for Vertex AI / Kubeflow Pipelines, and submitting with the engines' clients injected."""

import json
import types

import pytest
import yaml
from google.protobuf import json_format
from kfp.pipeline_spec import pipeline_spec_pb2

from deepseek_tfx.components.tokenizer_consumers import vertex_training_config
from deepseek_tfx.trainer_module.config import ConfigError
from deepseek_tfx.pipeline import cli, kubeflow_runner
from deepseek_tfx.pipeline.config import PipelineConfig

IMAGE = "us-docker.pkg.dev/p/deepseek/deepseek-tfx:1"
NODES = {"TextExampleGen", "StatisticsGen", "SchemaGen", "ExampleValidator", "TokenizerGen", "Transform",
         "DataChecks", "Trainer", "Evaluator", "Pusher"}


def _compile(tmp_path, engine, **kwargs):
    return kubeflow_runner.compile_pipeline(
        engine=engine, image=IMAGE, pipeline_root="gs://bucket/root", corpus="gs://bucket/corpus",
        corpus_pattern="span-{SPAN}/*", serving_dir="gs://bucket/serving/deepseek",
        config=PipelineConfig(preset="tiny", train_steps=7, max_bits_per_byte=3.5),
        output=str(tmp_path / f"p.{'json' if engine == 'vertex' else 'yaml'}"), **kwargs)


def _parameter(spec, task, name):
    value = spec.root.dag.tasks[task].inputs.parameters[name].runtime_value.constant_value
    return getattr(value, value.WhichOneof("value"))


def _spec_of_vertex_job(path):
    job = json.load(open(path))
    json_format.ParseDict(job, pipeline_spec_pb2.PipelineJob())  # valid PipelineJob
    return json_format.ParseDict(job["pipelineSpec"], pipeline_spec_pb2.PipelineSpec())


def _check_spec(spec):
    tasks = set(spec.root.dag.tasks)
    components = {t for t in tasks if "resolver" not in t}
    assert components == NODES
    resolvers = {t.split("-")[0] for t in tasks - components}
    assert resolvers == {"warm_start_model_resolver", "latest_blessed_model_resolver"}
    for name, executor in spec.deployment_spec["executors"].items():
        if "resolver" in name:
            assert "resolver" in executor  # TFX's LatestBlessedModelStrategy, compiled to a query
        else:
            assert executor["container"]["image"] == IMAGE
    assert not any("InfraValidator" in t for t in tasks)
    assert "DataChecks" in spec.root.dag.tasks["Trainer"].dependent_tasks  # which fail on bad data
    assert json.loads(_parameter(spec, "Trainer", "train_args")) == {"num_steps": 7}
    custom = json.loads(_parameter(spec, "Trainer", "custom_config"))
    assert custom["preset"] == "tiny" and custom["model"]["d_model"] == 64
    eval_config = json.loads(_parameter(spec, "Evaluator", "eval_config"))
    bounds = {m["class_name"]: m.get("threshold", {}).get("value_threshold")
              for m in eval_config["metrics_specs"][0]["metrics"]}
    assert bounds["BitsPerByte"] == {"upper_bound": 3.5}
    assert "gs://bucket/serving/deepseek" in _parameter(spec, "Pusher", "push_destination")
    assert "span-{SPAN}/*" in _parameter(spec, "TextExampleGen", "input_config")
    # Runtime parameters, with the compiled values as defaults; each step reads its own.
    defaults = {name: getattr(p.default_value, p.default_value.WhichOneof("kind"))
                for name, p in spec.root.input_definitions.parameters.items()}
    assert defaults == {"corpus": "gs://bucket/corpus", "train_steps": 7, "max_bits_per_byte": 0.0,
                        "max_perplexity": 0.0}
    for task, name, parameter in (("TextExampleGen", "input_base", "corpus"), ("Trainer", "train_steps", None),
                                  ("Evaluator", "max_bits_per_byte", None), ("Evaluator", "max_perplexity", None)):
        assert spec.root.dag.tasks[task].inputs.parameters[name].component_input_parameter == (parameter or name)


def test_vertex_compile_is_a_pipeline_job_with_every_component(tmp_path):
    _check_spec(_spec_of_vertex_job(_compile(tmp_path, "vertex")))


def test_kubeflow_compile_is_a_pipeline_spec_yaml(tmp_path):
    path = _compile(tmp_path, "kubeflow")
    spec = json_format.ParseDict(yaml.safe_load(open(path)), pipeline_spec_pb2.PipelineSpec())
    _check_spec(spec)
    assert spec.pipeline_info.name == "deepseek-tfx"


def test_scale_out_switches_reach_the_compiled_steps(tmp_path):
    spec = _spec_of_vertex_job(_compile(tmp_path, "vertex", vertex_training_replicas=3, dataflow=True,
                                        project="proj", region="europe-west4"))
    custom = json.loads(_parameter(spec, "Trainer", "custom_config"))
    assert custom["ai_platform_enable_vertex"] is True and custom["ai_platform_vertex_region"] == "europe-west4"
    pools = custom["ai_platform_training_args"]["job_spec"]["worker_pool_specs"]
    assert [p["replica_count"] for p in pools] == [1, 2]  # chief, then workers: Vertex sets TF_CONFIG
    assert all(p["container_spec"]["image_uri"] == IMAGE for p in pools)
    executors = json_format.MessageToDict(spec.deployment_spec)["executors"]
    assert "_VertexTrainerExecutor" in json.dumps(executors["Trainer_executor"])
    transform_args = json.dumps(executors["Transform_executor"])
    assert "--runner=DataflowRunner" in transform_args and f"--sdk_container_image={IMAGE}" in transform_args
    assert "--temp_location=gs://bucket/root/tmp" in transform_args


def test_accelerators_reach_every_replica_of_the_vertex_training_job(tmp_path):
    spec = _spec_of_vertex_job(_compile(tmp_path, "vertex", vertex_training_replicas=2, project="proj",
                                        region="us-central1", vertex_machine_type="a2-highgpu-2g",
                                        vertex_accelerator_type="NVIDIA_TESLA_A100", vertex_accelerator_count=2))
    pools = json.loads(_parameter(spec, "Trainer", "custom_config"))["ai_platform_training_args"]["job_spec"][
        "worker_pool_specs"]
    assert [p["machine_spec"] for p in pools] == [
        {"machine_type": "a2-highgpu-2g", "accelerator_type": "NVIDIA_TESLA_A100", "accelerator_count": 2}] * 2
    cpu_only = vertex_training_config("p", "r", IMAGE, replicas=1)["ai_platform_training_args"]["job_spec"]
    assert cpu_only["worker_pool_specs"][0]["machine_spec"] == {"machine_type": "n1-standard-8"}
    with pytest.raises(ValueError, match="go together"):
        vertex_training_config("p", "r", IMAGE, replicas=1, accelerator_type="NVIDIA_L4")
    with pytest.raises(ValueError, match="go together"):
        vertex_training_config("p", "r", IMAGE, replicas=1, accelerator_count=4)
    with pytest.raises(ConfigError, match="need --vertex-training-replicas"):
        _compile(tmp_path, "vertex", vertex_accelerator_type="NVIDIA_L4", vertex_accelerator_count=1)


def test_vertex_training_needs_a_replica():
    with pytest.raises(ValueError, match="must be >= 1"):
        vertex_training_config("p", "r", IMAGE, replicas=0)


class _Recorder:
    """Stands in for an engine client: records every call and its arguments."""

    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        def call(*args, **kwargs):
            self.calls.append((name, args, kwargs))
            return types.SimpleNamespace(experiment_id="exp-1", resource_name=f"{name}-result", recorder=self)
        return call


def _fake_aiplatform(recorder):
    """A fake ``google.cloud.aiplatform`` whose calls must bind to the real signatures (a wrong keyword fails)."""
    import inspect

    from google.cloud import aiplatform

    def bound(real, *args, **kwargs):
        inspect.signature(real).bind(*args, **kwargs)  # TypeError on an unknown, missing or extra argument
        return kwargs

    class PipelineJob:
        def __init__(self, *args, **kwargs):
            bound(aiplatform.PipelineJob.__init__, object(), *args, **kwargs)  # placeholder self
            recorder.calls.append(("PipelineJob", args, kwargs))

        def submit(self, *args, **kwargs):
            bound(aiplatform.PipelineJob.submit, self, *args, **kwargs)
            recorder.calls.append(("submit", args, kwargs))

        def create_schedule(self, *args, **kwargs):
            bound(aiplatform.PipelineJob.create_schedule, self, *args, **kwargs)
            recorder.calls.append(("create_schedule", args, kwargs))
            return types.SimpleNamespace(resource_name="schedules/1")

    def init(*args, **kwargs):
        bound(aiplatform.init, *args, **kwargs)
        recorder.calls.append(("init", args, kwargs))

    return types.SimpleNamespace(init=init, PipelineJob=PipelineJob)


def test_submit_to_vertex_once_and_on_a_schedule():
    rec = _Recorder()
    kubeflow_runner.submit_vertex("p.json", project="proj", region="us-central1", pipeline_root="gs://b/root",
                                  aiplatform=_fake_aiplatform(rec))
    assert rec.calls == [
        ("init", (), {"project": "proj", "location": "us-central1"}),
        ("PipelineJob", (), {"display_name": "deepseek-tfx", "template_path": "p.json",
                             "pipeline_root": "gs://b/root", "enable_caching": True}),
        ("submit", (), {})]
    rec = _Recorder()
    kubeflow_runner.submit_vertex("p.json", project="proj", region="us-central1", pipeline_root="gs://b/root",
                                  schedule="0 3 * * *", aiplatform=_fake_aiplatform(rec))
    assert rec.calls[-1] == ("create_schedule", (), {"cron": "0 3 * * *", "display_name": "deepseek-tfx-schedule"})
    assert ("submit", (), {}) not in rec.calls


def test_the_vertex_fake_rejects_arguments_the_real_aiplatform_does_not_take():
    fake = _fake_aiplatform(_Recorder())
    with pytest.raises(TypeError):
        fake.init(project="proj", region="us-central1")
    with pytest.raises(TypeError):
        fake.PipelineJob(display_name="deepseek-tfx", template="p.json")
    job = fake.PipelineJob(display_name="deepseek-tfx", template_path="p.json")
    with pytest.raises(TypeError):
        job.submit(wait=True)
    with pytest.raises(TypeError):
        job.create_schedule(cron_expression="0 3 * * *", display_name="s")


def test_submit_to_kubeflow_once_and_on_a_schedule():
    rec = _Recorder()
    hosts = []

    def factory(host):
        hosts.append(host)
        return rec

    kubeflow_runner.submit_kubeflow("p.yaml", host="http://kfp:8080", client_factory=factory)
    assert hosts == ["http://kfp:8080"]
    assert rec.calls == [("create_run_from_pipeline_package", ("p.yaml",),
                          {"arguments": {}, "run_name": "deepseek-tfx", "experiment_name": "deepseek-tfx",
                           "enable_caching": True})]
    rec.calls.clear()
    kubeflow_runner.submit_kubeflow("p.yaml", host="http://kfp:8080", schedule="0 3 * * *", client_factory=factory)
    assert rec.calls == [
        ("create_experiment", (), {"name": "deepseek-tfx"}),
        ("create_recurring_run", (), {"experiment_id": "exp-1", "job_name": "deepseek-tfx-schedule",
                                      "cron_expression": "0 0 3 * * *", "pipeline_package_path": "p.yaml"})]


def test_cli_compile_and_submit_report_missing_arguments(tmp_path, capsys):
    assert cli.main(["submit", "--engine", "vertex", "--package", str(tmp_path / "none.json")]) == cli.EXIT_USAGE
    assert "no compiled pipeline" in capsys.readouterr().err
    (tmp_path / "p.json").write_text("{}")
    assert cli.main(["submit", "--engine", "vertex", "--package", str(tmp_path / "p.json")]) == cli.EXIT_USAGE
    assert "needs --project --region --pipeline-root" in capsys.readouterr().err
    assert cli.main(["compile", "--engine", "vertex", "--image", IMAGE, "--pipeline-root", "gs://b/r",
                     "--corpus", "gs://b/c", "--dataflow"]) == cli.EXIT_USAGE
    assert "need --project and --region" in capsys.readouterr().err


def test_cli_compile_writes_the_package(tmp_path, capsys):
    out = tmp_path / "job.json"
    assert cli.main(["compile", "--engine", "vertex", "--image", IMAGE, "--pipeline-root", "gs://bucket/root",
                     "--corpus", "gs://bucket/corpus", "--output", str(out), "--preset", "tiny"]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    spec = _spec_of_vertex_job(out)
    assert "gs://bucket/root/serving_model/deepseek" in _parameter(spec, "Pusher", "push_destination")


def test_dockerfile_builds_on_the_pinned_tfx_image_with_the_project():
    import pathlib
    import re

    repo = pathlib.Path(__file__).resolve().parents[1]
    dockerfile = (repo / "Dockerfile").read_text()
    tfx_pin = re.search(r"^tfx==(\S+)$", (repo / "constraints.txt").read_text(), re.M).group(1)
    assert re.search(rf"^FROM tensorflow/tfx:{re.escape(tfx_pin)}$", dockerfile, re.M)
    for source in re.findall(r"^COPY (.+) \S+$", dockerfile, re.M):
        for path in source.split():
            assert (repo / path).exists(), f"Dockerfile copies {path}, which is not in the repository"
    assert "-c constraints.txt -e ." in dockerfile and "TF_USE_LEGACY_KERAS=1" in dockerfile
    assert "import tensorflow_text, sentencepiece" in dockerfile


def test_cli_submit_to_kubeflow_without_kfp_client_fails_with_the_message(tmp_path, capsys):
    # No fake client: the real import path runs. The pinned kfp-pipeline-spec leaves a `kfp` namespace package
    # without `Client` (and kfp>=2 cannot be installed here), so submit must fail with the clear message.
    try:
        from kfp import Client  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("kfp>=2 is installed here: this checks the environment without its client")
    package = tmp_path / "p.yaml"
    package.write_text("{}")
    code = cli.main(["submit", "--engine", "kubeflow", "--package", str(package), "--host", "http://127.0.0.1:1"])
    assert code == cli.EXIT_FAILED == 1
    err = capsys.readouterr().err
    assert err.startswith("deepseek-tfx: error: ")
    assert "needs kfp>=2" in err and str(package) in err


def test_the_train_steps_parameter_replaces_train_args_in_the_trainer_executor():
    from tfx.types import standard_artifacts

    from deepseek_tfx.components import tokenizer_consumers

    tokenizer = standard_artifacts.Examples()  # any artifact: only its uri is read
    tokenizer.uri = "/tokenizer"
    properties = {"train_args": '{"num_steps": 7}', "custom_config": "{}", "train_steps": 42}
    _, changed = tokenizer_consumers._with_tokenizer_dir({"tokenizer": [tokenizer]}, properties)
    assert json.loads(changed["train_args"]) == {"num_steps": 42}
    assert json.loads(changed["custom_config"]) == {"tokenizer_dir": "/tokenizer"}
    _, unchanged = tokenizer_consumers._with_tokenizer_dir({"tokenizer": [tokenizer]},
                                                           {**properties, "train_steps": None})
    assert json.loads(unchanged["train_args"]) == {"num_steps": 7}


def test_an_eval_corpus_compiles_as_the_reference_eval_set(tmp_path):
    spec = _spec_of_vertex_job(_compile(tmp_path, "vertex", eval_corpus="gs://bucket/reference/"))
    reference = spec.root.dag.tasks["ReferenceExampleGen"]
    assert "gs://bucket/reference" == _parameter(spec, "ReferenceExampleGen", "input_base")
    assert json.loads(_parameter(spec, "ReferenceExampleGen", "input_config"))["splits"] == [
        {"name": "eval", "pattern": "*"}]
    assert reference.task_info.name == "ReferenceExampleGen"
    evaluator = spec.root.dag.tasks["Evaluator"]
    assert evaluator.inputs.artifacts["reference_examples"].task_output_artifact.producer_task == "ReferenceExampleGen"
    assert _parameter(spec, "Evaluator", "reference_bpb_tolerance") == 0.05
