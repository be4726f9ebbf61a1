"""deepseek-tfx: a TFX pipeline that turns a text corpus into a served DeepSeek-style language model."""

from setuptools import setup

setup(
    name="deepseek-tfx",
    version="0.1.0",
    description="TFX pipeline: plain-text corpus -> DeepSeek-style language model -> TensorFlow Serving",
    long_description=open("README.md", encoding="utf-8").read() if __import__("os").path.exists("README.md") else "",
    long_description_content_type="text/markdown",
    python_requires=">=3.10,<3.11",
    packages=["pipeline", "components", "trainer_module", "serving"],
    install_requires=[
        "tfx==1.16.0",
        "tensorflow-text==2.16.1",
        "sentencepiece",
        "dill",
        "kfp-pipeline-spec",  # KubeflowV2DagRunner (compile for Vertex AI / Kubeflow)
    ],
    extras_require={"test": ["pytest"]},
    entry_points={"console_scripts": ["deepseek-tfx=pipeline.cli:main"]},
)
