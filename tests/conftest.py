"""Shared test setup: TF_USE_LEGACY_KERAS before any TensorFlow import, and the shared corpus."""

import os

os.environ["TF_USE_LEGACY_KERAS"] = "1"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pathlib  # noqa: E402

import pytest  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[1]
SHAKESPEARE = REPO.parent / "shared" / "data" / "tinyshakespeare.txt"


@pytest.fixture(scope="session")
def shakespeare() -> pathlib.Path:
    """The team's real 1.1 MB corpus, read from ../shared (never copied into the project)."""
    if not SHAKESPEARE.exists():
        pytest.skip(f"shared corpus not found at {SHAKESPEARE}")
    return SHAKESPEARE


@pytest.fixture(scope="session")
def trainer_inputs(tmp_path_factory, shakespeare) -> dict:
    """A real Transform output (byte tokenizer) of 60 KB of tinyshakespeare, as run_fn receives it."""
    from tests.trainer_inputs import build_transform_output  # noqa: PLC0415  (imports Beam and tft)

    text = shakespeare.read_bytes()[:60_000].decode("utf-8")
    return build_transform_output(str(tmp_path_factory.mktemp("transform")), text)
