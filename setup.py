"""deepseek-tfx: a TFX pipeline that turns a text corpus into a served DeepSeek-style language model.

The four top-level folders are installed as one namespace, ``deepseek_tfx.pipeline``,
``deepseek_tfx.components``, ``deepseek_tfx.trainer_module`` and ``deepseek_tfx.serving``,
so that their generic names cannot clash with other distributions in one environment.
"""

import os

from setuptools import setup

_PACKAGES = ("pipeline", "components", "trainer_module", "serving")

setup(
    name="deepseek-tfx",
    version="0.1.0",
    description="TFX pipeline: plain-text corpus -> DeepSeek-style language model -> TensorFlow Serving",
    long_description=open("README.md", encoding="utf-8").read() if os.path.exists("README.md") else "",
    long_description_content_type="text/markdown",
    python_requires=">=3.10,<3.11",
    packages=[f"deepseek_tfx.{name}" for name in _PACKAGES],
    package_dir={f"deepseek_tfx.{name}": name for name in _PACKAGES},
    install_requires=[
        "tfx==1.16.0",
        "tensorflow-text==2.16.1",
        "sentencepiece",
        "dill",
        "kfp-pipeline-spec",  # KubeflowV2DagRunner (compile for Vertex AI / Kubeflow)
        "pymysql",  # the run lock on a shared MySQL ML Metadata store
        "matplotlib",  # the run report's figures
    ],
    # bench: only bench.torch_compare's PyTorch reference loop (`make bench-torch` installs it apart).
    extras_require={"test": ["pytest"], "lint": ["ruff"], "bench": ["torch"]},
    entry_points={"console_scripts": ["deepseek-tfx=deepseek_tfx.pipeline.cli:main"]},
)
