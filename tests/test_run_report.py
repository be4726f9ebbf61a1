"""The quiet console and the run report, on real `deepseek-tfx run`s of the tiny preset on the built-in corpus.

The first run is what `make run` does on a fresh output (tiny preset): its terminal output is counted. The
report it writes is rendered in headless Chromium with networking off; every section must be there and every
plot must be non-blank. A second run with an unreachable bound shows the not-blessed summary.
"""

import base64
import io
import os
import pathlib
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from deepseek_tfx.pipeline import run_report
from tests.conftest import skip_outside_ci

pytestmark = pytest.mark.slow

CLI = pathlib.Path(sys.executable).parent / "deepseek-tfx"
OPTIONS = ["--preset", "tiny", "--max-bits-per-byte", "7.0"]
MAX_LINES = 40
COMPONENT_LINE = re.compile(r"^\[ *\d+/\d+\] ")  # [ 4/10] Transform  ran  10.1 s


def _cli(*args, timeout=900):
    env = {**os.environ, "PYTHONWARNINGS": "ignore::FutureWarning"}
    return subprocess.run([str(CLI), *args], capture_output=True, text=True, env=env, timeout=timeout)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    output = tmp_path_factory.mktemp("report") / "out"
    first = _cli("run", "--output", str(output), *OPTIONS)
    unreachable = _cli("run", "--output", str(output), *OPTIONS, "--set", "pipeline.max_bits_per_byte=0.5")
    return {"output": output, "first": first, "unreachable": unreachable}


def _path(printed: str, label: str) -> pathlib.Path:
    match = re.search(rf"^  {label}:\s+(\S+)", printed, re.MULTILINE)
    assert match, f"no {label} line in:\n{printed}"
    return pathlib.Path(match.group(1))


def test_a_fresh_run_prints_one_line_per_component_and_the_summary(runs):
    first = runs["first"]
    printed = first.stdout + first.stderr
    assert first.returncode == 0, printed
    lines = printed.splitlines()
    assert len(lines) <= MAX_LINES, f"{len(lines)} lines:\n{printed}"
    components = [line.split("] ", 1)[1] for line in lines if COMPONENT_LINE.match(line)]
    names = [line.split()[0] for line in components]
    assert names[:3] == ["TextExampleGen", "StatisticsGen", "SchemaGen"] and names[-1] == "Pusher", printed
    assert all(re.search(r"\bran\s+\d+\.\d s$", line) for line in components), components  # a fresh output: all ran
    assert any(line.split(" ", 1)[1].startswith("step 30/30 ") for line in lines), printed  # the Trainer's progress
    assert "blessed:       yes" in printed and "cuFFT" not in printed and "WARNING" not in printed
    log = _path(printed, "log")
    assert log.parent == runs["output"] / "logs" and len(log.read_text().splitlines()) > 5 * MAX_LINES
    assert "Component Transform is finished" in log.read_text()  # what the console left out is in the log
    assert _path(printed, "report").exists()
    assert f"tensorboard --logdir {runs['output']}" in printed


def test_a_not_blessed_run_names_the_failed_bound(runs):
    printed = runs["unreachable"].stdout
    assert runs["unreachable"].returncode == 0, printed + runs["unreachable"].stderr
    assert re.search(r"blessed:       no \(bits_per_byte \d+\.\d{4} above the bound 0\.5\)", printed), printed
    assert "pushed model:  none (not blessed)" in printed
    # only the gate ran again
    states = dict(line.split("] ", 1)[1].split()[:2] for line in printed.splitlines() if COMPONENT_LINE.match(line))
    assert states["Trainer"] == "cached" and states["Evaluator"] == "ran", printed


def _chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if not found:
        skip_outside_ci("headless Chromium is not installed (Debian's chromium package; .ci/run installs it)")
    return found


def _non_blank(image: Image.Image) -> bool:
    pixels = np.asarray(image.convert("L"), dtype=np.float32)
    return pixels.std() > 5.0 and len(np.unique(pixels)) > 8


def test_the_report_renders_offline_with_every_section_and_plot(runs, tmp_path):
    report = _path(runs["first"].stdout, "report")
    html = report.read_text()
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", html)  # nothing to fetch
    offline = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
               "--proxy-server=127.0.0.1:9", "--proxy-bypass-list=<-loopback>",  # networking off
               "--host-resolver-rules=MAP * ~NOTFOUND"]
    dom = subprocess.run([_chromium(), *offline, "--dump-dom", report.as_uri()], capture_output=True, text=True,
                         timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    for section, title in run_report.SECTIONS.items():
        assert f'<section id="{section}"><h2>{title}</h2>' in dom.stdout, section
    screenshot = tmp_path / "report.png"
    shot = subprocess.run([_chromium(), *offline, "--window-size=1200,9000", f"--screenshot={screenshot}",
                           report.as_uri()], capture_output=True, text=True, timeout=120)
    assert shot.returncode == 0 and screenshot.exists(), shot.stderr[-2000:]
    assert _non_blank(Image.open(screenshot))

    plots = re.findall(r'<img class="plot" alt="plot" src="data:image/png;base64,([^"]+)"', dom.stdout)
    # documents per span, document length, pieces, loss, learning rate, gradient norm, tokens/s, MFU,
    # expert load, evaluation bars, history
    assert len(plots) >= 11, len(plots)
    for plot in plots:
        assert _non_blank(Image.open(io.BytesIO(base64.b64decode(plot))))
    assert "<svg" in dom.stdout and dom.stdout.count("<rect") >= 10  # the DAG, a box per node
    for expected in ("<h3>Loss</h3>", "Expert load per MoE layer", "greedy", "seed 3", "BitsPerByte &lt;= 7",
                     "<b>blessed</b>", "TextExampleGen", "Pusher"):
        assert expected in html, expected
