"""Ctrl-C during `schedlab run`: one line, exit 130, results.json and W&B files kept."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

SCHEDLAB = [sys.executable, "-c", "import sys; from schedlab.cli import main; sys.exit(main())"]


def _as_from_a_terminal() -> None:
    """SIGINT at its default in the child, as a shell's foreground job has it: a suite started
    in the background (`cmd &`, nohup) passes SIGINT on ignored, and Python then leaves it
    ignored."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("detailed", [True, False])
def test_ctrl_c_mid_run_keeps_partial_results_and_exits_130(tmp_path, llama_dir, detailed):
    """Ctrl-C: exit 130, one line counting the requests submitted, results.json marked
    interrupted and a steps.csv row for every step it counts (streaming too, whose rows were
    written as it went and whose requests are not kept)."""
    out = tmp_path / "run"
    env = dict(os.environ, WANDB_MODE="offline", HYDRA_FULL_ERROR="")
    proc = subprocess.Popen(
        [*SCHEDLAB, "run", "model=path", f"model.path={llama_dir}", f"paths.output_dir={out}",
         "logger=wandb", "plots=false", "workload.num_requests=400",
         "workload.arrival.process=poisson", "workload.arrival.rate=20",
         "workload.output_len.max=16", "driver.progress=true",
         f"driver.save_detailed={str(detailed).lower()}"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        preexec_fn=_as_from_a_terminal)
    err = bytearray()

    def read() -> None:
        while chunk := proc.stderr.read1(4096):
            err.extend(chunk)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    deadline = time.monotonic() + 240
    done = re.compile(rb"requests:[^\r\n]*\| *[1-9][0-9]*/400")
    while not done.search(err) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)  # the progress bar shows a request done: the workload is being driven
    proc.send_signal(signal.SIGINT)
    rc = proc.wait(timeout=120)
    reader.join(timeout=10)
    text = err.decode(errors="replace")
    assert rc == 130, text[-2000:]
    assert "Traceback" not in text
    lines = [ln for ln in text.replace("\r", "\n").splitlines() if ln.startswith("schedlab:")]
    assert len(lines) == 1 and "interrupted" in lines[0] and "partial results" in lines[0]
    saved = json.loads((out / "results.json").read_text())
    assert saved["interrupted"] is True
    assert 0 < saved["completed"] < 400
    submitted = int(re.search(r"of (\d+) submitted", lines[0]).group(1))
    assert saved["completed"] <= submitted <= 400
    with open(out / "steps.csv") as f:
        assert sum(1 for _ in f) - 1 == saved["num_steps"] > 0
    runs = list((out / "wandb").glob("offline-run-*/run-*.wandb"))
    assert runs and runs[0].stat().st_size > 0


def test_a_ctrl_c_whose_exception_was_swallowed_still_stops_the_run():
    """SIGINT handled inside a finalizer (an abandoned generator, a `__del__`) has its
    KeyboardInterrupt printed and dropped by Python; the latch raises it again at the run
    loop's next event, so the run stops there instead of going on to the end."""
    from fakes import FakeExecutor

    from schedlab.config import EngineConfig
    from schedlab.engine import Engine
    from schedlab.runs.distributions import WorkloadRequest
    from schedlab.runs.driver import run_workload
    from schedlab.runs.interrupt import InterruptLatch

    eng = Engine(EngineConfig(model="fake"), executor_cls=FakeExecutor)
    work = [WorkloadRequest(list(range(2, 10)), 50, arrival_s=0.01 * i) for i in range(4)]
    outer = signal.signal(signal.SIGINT, signal.default_int_handler)  # as `schedlab run` has it
    try:
        with InterruptLatch() as latch:
            assert signal.getsignal(signal.SIGINT) is not signal.default_int_handler  # watched
            latch.hit = True  # the handler ran; its exception went nowhere
            try:
                run_workload(eng, work, interrupt=latch)
            except KeyboardInterrupt:
                pass
            else:
                raise AssertionError("the run went on to the end after a Ctrl-C")
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # put back
    finally:
        signal.signal(signal.SIGINT, outer)
    assert eng.counters().num_steps == 0


#: a run whose Ctrl-C comes while steps.csv's rows are being handed over, in chunks of 10
#: rows (and, streaming, records taken every 50 steps): right after the third chunk
_MID_HANDOFF = """
import os, signal, sys
import schedlab.cli.steps_csv as steps_csv
import schedlab.cluster.record as record
steps_csv.ROWS_PER_WRITE, record.DRAIN_STEPS = 10, 50
send, sent = steps_csv.StepsCsv._send, []
def kill_third(self, *args):
    send(self, *args)
    sent.append(args)
    if len(sent) == 3:
        os.kill(os.getpid(), signal.SIGINT)
steps_csv.StepsCsv._send = kill_third
from schedlab.cli import main
sys.exit(main())
"""


@pytest.mark.parametrize("detailed", [True, False])
def test_a_ctrl_c_mid_handoff_leaves_each_step_once_in_steps_csv(tmp_path, detailed):
    """A Ctrl-C between two chunks of the rows handed to steps.csv: each step counted in
    results.json is one row, none twice (a detailed run's rest is handed on from where the
    hand-off stopped) and none lost (a streaming run's records taken from the engines are
    handed on before the Ctrl-C is raised)."""
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-c", _MID_HANDOFF, "run", "executor=sim", "model=llama3_8b",
         "hardware=h100", "logger=none", "plots=false", "print_table=false",
         "driver.progress=false", "workload.num_requests=20", f"paths.output_dir={out}",
         f"driver.save_detailed={str(detailed).lower()}"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
        preexec_fn=_as_from_a_terminal)
    assert proc.returncode == 130, proc.stderr[-2000:]
    saved = json.loads((out / "results.json").read_text())
    assert saved["interrupted"] is True
    with open(out / "steps.csv") as f:
        steps = [line.split(",")[0] for line in f][1:]
    assert len(steps) == len(set(steps)) == saved["num_steps"] > 30
