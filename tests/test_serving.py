"""TF Serving configuration and the clients' request format."""

from google.protobuf import text_format
from tensorflow_serving.config import model_server_config_pb2

from deepseek_tfx.pipeline import cli
from deepseek_tfx.serving import client, tf_serving


def test_models_config_is_a_valid_model_server_config(tmp_path):
    paths = tf_serving.write_configs(str(tmp_path), "deepseek")
    config = text_format.Parse(open(paths["models.config"]).read(), model_server_config_pb2.ModelServerConfig())
    (model,) = config.model_config_list.config
    assert (model.name, model.base_path) == ("deepseek", str(tmp_path / "deepseek"))
    assert model.model_version_policy.latest.num_versions == 1
    assert "max_batch_size { value: 8 }" in open(paths["batching.config"]).read()
    assert paths["docker"] == (f"docker run --rm -p 8500:8500 -p 8501:8501 -v {tmp_path}/deepseek:/models/deepseek "
                               "-e MODEL_NAME=deepseek tensorflow/serving:2.16.1")


def test_kubernetes_manifest_serves_the_pushed_directory(tmp_path):
    import yaml

    paths = tf_serving.write_configs(str(tmp_path), "deepseek", claim_name="models-pvc")
    docs = {d["kind"]: d for d in yaml.safe_load_all(open(paths["kubernetes.yaml"]))}
    assert set(docs) == {"ConfigMap", "Deployment", "Service"}
    pod = docs["Deployment"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == "tensorflow/serving:2.16.1"
    assert {"name": "MODEL_NAME", "value": "deepseek"} in container["env"]
    assert {p["containerPort"] for p in container["ports"]} == {8500, 8501}
    assert container["readinessProbe"]["httpGet"] == {"path": "/v1/models/deepseek", "port": 8501}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["models"]["persistentVolumeClaim"]["claimName"] == "models-pvc"
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts == {"models": "/models", "config": "/config"}  # MODEL_BASE_PATH=/models in the image
    batching = docs["ConfigMap"]["data"]["batching.config"]
    assert "--batching_parameters_file=/config/batching.config" in container["args"]
    assert "max_batch_size { value: 8 }" in batching
    assert docs["Service"]["spec"]["selector"] == docs["Deployment"]["spec"]["selector"]["matchLabels"]


def test_generate_request_and_response_formats():
    body = client.generate_request(["a", "b"], max_new_tokens=5, temperature=0.5, top_k=3, seed=9)
    assert body == {"signature_name": "generate",
                    "inputs": {"prompt": ["a", "b"], "max_new_tokens": 5, "temperature": 0.5, "top_k": 3, "seed": 9}}
    assert client.parse_generate_response({"outputs": ["x", "y"]}) == ["x", "y"]
    assert client.parse_generate_response({"outputs": {"text": ["x"]}}) == ["x"]


def test_generate_command_reports_an_unreachable_server(capsys):
    code = cli.main(["generate", "--server", "http://127.0.0.1:9", "hello"])
    assert code == cli.EXIT_FAILED
    assert "http://127.0.0.1:9" in capsys.readouterr().err
