"""TF Serving configuration and the clients' request format."""

from google.protobuf import text_format
from tensorflow_serving.config import model_server_config_pb2

from pipeline import cli
from serving import client, tf_serving


def test_models_config_is_a_valid_model_server_config(tmp_path):
    paths = tf_serving.write_configs(str(tmp_path), "deepseek")
    config = text_format.Parse(open(paths["models.config"]).read(), model_server_config_pb2.ModelServerConfig())
    (model,) = config.model_config_list.config
    assert (model.name, model.base_path) == ("deepseek", str(tmp_path / "deepseek"))
    assert model.model_version_policy.latest.num_versions == 1
    assert "max_batch_size { value: 8 }" in open(paths["batching.config"]).read()
    assert "-v " in tf_serving.docker_command(str(tmp_path), "deepseek")


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
