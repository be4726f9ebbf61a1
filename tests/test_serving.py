"""TF Serving configuration and the clients' request format."""

import json
import os

import pytest
from google.protobuf import text_format
from tensorflow_serving.config import model_server_config_pb2

from deepseek_tfx.pipeline import cli
from deepseek_tfx.serving import client, tf_serving


def test_models_config_is_a_valid_model_server_config(tmp_path):
    paths = tf_serving.write_configs(str(tmp_path), "deepseek")
    config = text_format.Parse(open(paths["models.config"]).read(), model_server_config_pb2.ModelServerConfig())
    (model,) = config.model_config_list.config
    assert (model.name, model.base_path) == ("deepseek", "/models/deepseek")  # where the deployments mount it
    assert model.model_version_policy.latest.num_versions == 1
    assert "max_batch_size { value: 8 }" in open(paths["batching.config"]).read()
    assert paths["docker"] == (
        f"docker run --rm -p 8500:8500 -p 8501:8501 -v {tmp_path}:/models -e MODEL_NAME=deepseek "
        "tensorflow/serving:2.16.1 --model_config_file=/models/models.config --model_config_file_poll_wait_seconds=60 "
        "--enable_batching=true --batching_parameters_file=/models/batching.config")


def test_kubernetes_manifest_serves_the_mounted_serving_base_with_its_configs(tmp_path):
    import yaml

    paths = tf_serving.write_configs(str(tmp_path), "deepseek", claim_name="models-pvc")
    docs = {d["kind"]: d for d in yaml.safe_load_all(open(paths["kubernetes.yaml"]))}
    assert set(docs) == {"Deployment", "Service"}
    pod = docs["Deployment"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == "tensorflow/serving:2.16.1"
    assert {p["containerPort"] for p in container["ports"]} == {8500, 8501}
    # /v1/models/NAME answers 200 while a version is still LOADING; the metadata endpoint only once it is loaded.
    assert container["readinessProbe"]["httpGet"] == {"path": "/v1/models/deepseek/metadata", "port": 8501}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["models"]["persistentVolumeClaim"]["claimName"] == "models-pvc"
    assert container["volumeMounts"] == [{"name": "models", "mountPath": "/models", "readOnly": True}]
    # models.config (with any pin) and batching.config are read from the mounted serving base
    assert "--model_config_file=/models/models.config" in container["args"]
    assert "--batching_parameters_file=/models/batching.config" in container["args"]
    assert "--enable_batching=true" in container["args"]
    assert docs["Service"]["spec"]["selector"] == docs["Deployment"]["spec"]["selector"]["matchLabels"]


def test_generate_request_and_response_formats():
    body = client.generate_request(["a", "b"], max_new_tokens=5, temperature=0.5, top_k=3, seed=9)
    assert body == {"signature_name": "generate",
                    "inputs": {"prompt": ["a", "b"], "max_new_tokens": [5, 5], "temperature": [0.5, 0.5],
                               "top_k": [3, 3], "seed": [9, 9]}}
    with pytest.raises(ValueError, match="rest_format must be one of"):
        client.generate_request(["a"], rest_format="csv")
    assert client.parse_generate_response({"outputs": ["x", "y"]}) == ["x", "y"]
    assert client.parse_generate_response({"outputs": {"text": ["x"]}}) == ["x"]


def test_generate_command_reports_an_unreachable_server(capsys):
    code = cli.main(["generate", "--server", "http://127.0.0.1:9", "hello"])
    assert code == cli.EXIT_FAILED
    assert "http://127.0.0.1:9" in capsys.readouterr().err


def _version(base, version, max_batch_size=None):
    path = os.path.join(base, "deepseek", str(version))
    os.makedirs(os.path.join(path, "assets.extra"))
    open(os.path.join(path, "saved_model.pb"), "wb").close()
    if max_batch_size:
        with open(os.path.join(path, "assets.extra", "deepseek_config.json"), "w") as f:
            json.dump({"serving": {"max_batch_size": max_batch_size}}, f)


def _policy(paths):
    config = text_format.Parse(open(paths["models.config"]).read(), model_server_config_pb2.ModelServerConfig())
    return config.model_config_list.config[0].model_version_policy


def test_batching_config_follows_the_served_versions_limit(tmp_path):
    _version(str(tmp_path), 100, max_batch_size=4)
    _version(str(tmp_path), 200, max_batch_size=16)
    batching = open(tf_serving.write_configs(str(tmp_path), "deepseek")["batching.config"]).read()
    assert "max_batch_size { value: 16 }" in batching and "pad_variable_length_inputs: false" in batching
    pinned = open(tf_serving.write_configs(str(tmp_path), "deepseek", pinned=100)["batching.config"]).read()
    assert "max_batch_size { value: 4 }" in pinned  # the pinned version's graph refuses more than 4


def test_a_pin_is_kept_by_later_config_writes_until_it_is_lifted(tmp_path, capsys):
    base = tmp_path / "serving_model"
    _version(str(base), 100)
    _version(str(base), 200)
    assert cli.main(["serve-config", "--output", str(tmp_path), "--pin", "100"]) == 0
    assert "served:   100 (pinned)" in capsys.readouterr().out
    paths = tf_serving.write_configs(str(base), "deepseek", tf_serving.pinned_version(str(base), "deepseek"))
    assert list(_policy(paths).specific.versions) == [100]  # what every later run writes after its push
    with pytest.raises(tf_serving.PinError, match="cannot pin version 150"):
        tf_serving.pin_version(str(base), "deepseek", 150)
    assert cli.main(["serve-config", "--output", str(tmp_path), "--pin", "150"]) == cli.EXIT_USAGE
    assert "holds no SavedModel" in capsys.readouterr().err
    assert tf_serving.pinned_version(str(base), "deepseek") == 100  # a refused pin changes nothing
    assert cli.main(["serve-config", "--output", str(tmp_path), "--unpin"]) == 0
    assert "served:   200 (latest)" in capsys.readouterr().out
    assert _policy(paths).latest.num_versions == 1
    open(tf_serving.pin_file(str(base), "deepseek"), "w").write("{not json")
    assert cli.main(["serve-config", "--output", str(tmp_path)]) == cli.EXIT_USAGE
    assert "is not a pin file written by serve-config" in capsys.readouterr().err
