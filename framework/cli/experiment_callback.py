"""A Hydra callback that summarises an experiment's sweep when the multirun ends.

Configured in `conf/experiment/<name>.yaml`:

```yaml
hydra:
  callbacks:
    summarize:
      _target_: schedlab.cli.experiment_callback.SummarizeExperiment
      experiment: ${exp.name}
      publish: ${exp.publish}
```

The summary itself is `experiments/summarize.py` in the source tree (no Hydra there); it runs
in a subprocess over the sweep directory. Where the script is not found (an installed package
without the repository), the callback says so and the sweep's results are left as they are.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

SCRIPT = Path("experiments") / "summarize.py"


def find_script(explicit: str | None = None) -> Path | None:
    """`explicit`, else experiments/summarize.py next to the sources, else under the cwd."""
    if explicit:
        return Path(explicit)
    import schedlab

    here = Path(schedlab.__file__).resolve().parents[1] / SCRIPT  # an editable install
    for path in (here, Path.cwd() / SCRIPT):
        if path.is_file():
            return path
    return None


class SummarizeExperiment(Callback):
    """At the end of a multirun, tabulate and plot the sweep (median, min-max over seeds).

    Args:
        experiment: the experiment's name (`orca`, ...); None: read from the runs' `exp.name`.
        publish: also copy the table and figure to `experiments/results/`.
        script: the summarize script; None: found next to the sources.
    """

    def __init__(self, experiment: str | None = None, publish: bool = False,
                 script: str | None = None) -> None:
        self.experiment = experiment
        self.publish = bool(publish)
        self.script = script

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(str(config.hydra.sweep.dir))
        script = find_script(self.script)
        if script is None or not script.is_file():
            print(f"schedlab: {SCRIPT} not found; summarize later with "
                  f"`python {SCRIPT} {sweep_dir}`", file=sys.stderr)
            return
        cmd = [sys.executable, str(script), str(sweep_dir)]
        if self.experiment:
            cmd += ["--experiment", self.experiment]
        if self.publish:
            cmd.append("--publish")
        done = subprocess.run(cmd, check=False)
        if done.returncode != 0:
            from schedlab.cli import app

            msg = f"summarizing {sweep_dir} failed (exit {done.returncode}): {' '.join(cmd)}"
            app.FAILURES.append(msg)  # the command exits non-zero
            print(f"schedlab: error: {msg}", file=sys.stderr)
