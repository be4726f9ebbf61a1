"""The quiet console's lines (pipeline/console.py), fed the records a run emits; the real run is test_run_report."""

import io
import logging

from deepseek_tfx.pipeline import console


def _console(states):
    stream = io.StringIO()
    quiet = console.QuietConsole("/unused.log", states.get, stream=stream)
    quiet.expect(["TextExampleGen", "Transform", "Trainer"])
    return quiet, stream


def _record(name, level, message):
    return logging.LogRecord(name, level, __file__, 1, message, None, None)


def test_one_line_per_component_as_it_ends_and_none_for_resolvers():
    quiet, stream = _console({"TextExampleGen": "ran", "Transform": "cached", "Trainer": "skipped"})
    lines = console._ComponentLines(quiet)
    for node in ("TextExampleGen", "warm_start_model_resolver", "Transform", "Trainer"):
        lines.emit(_record("absl", logging.INFO, f"Component {node} is running."))
        lines.emit(_record("absl", logging.INFO, f"Component {node} is finished."))
    printed = stream.getvalue().splitlines()
    assert [line.split()[1:3] for line in printed] == [["TextExampleGen", "ran"], ["Transform", "cached"],
                                                       ["Trainer", "skipped"]]
    assert printed[0].startswith("[1/3] ") and printed[0].endswith(" s")  # ran: with its time
    assert printed[1].rstrip().endswith("cached")  # cached and skipped: no time


def test_trainer_progress_is_thinned_and_warnings_shown():
    quiet, stream = _console({})
    lines = console._TrainerLines(quiet)
    lines.emit(_record("deepseek_tfx.trainer_module.trainer", logging.INFO, "Model: 10 parameters"))
    for step in range(25, 301, 25):
        lines.emit(_record("deepseek_tfx.trainer_module.train_loop", logging.INFO, f"step {step}/300 loss 1.0"))
        lines.emit(_record("deepseek_tfx.trainer_module.trainer", logging.INFO, f"step {step} eval loss 1.0"))
    lines.emit(_record("deepseek_tfx.pipeline.local_runner", logging.INFO, "Removed the checkpoints of ..."))
    lines.emit(_record("deepseek_tfx.pipeline.local_runner", logging.WARNING, "Retention skipped: ..."))
    printed = [line.split(" ", 1)[1] for line in stream.getvalue().splitlines()]
    steps = [line for line in printed if line.startswith("step ")]
    assert steps[0].startswith("step 25/300") and steps[-1].startswith("step 300/300")
    assert len(steps) <= console.PROGRESS_LINES + 1 and not any("eval loss" in line for line in steps)
    assert printed[0] == "Model: 10 parameters" and printed[-1] == "Retention skipped: ..."
    assert not any("Removed the checkpoints" in line for line in printed)  # other INFO: the log only
