"""`kill` of ``rlm-graph batch --executor ray``: the command's own stop (docs/cli.md: 143
and how to resume), not Ray's. A real CLI process joining a real local Ray cluster, a
fake OpenAI server over real HTTP, a real signal."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.batch import KEY, BatchServer, items, local_cli_args, wait_for_lines, write_items
from tests.support.terminal import as_from_a_terminal

pytestmark = pytest.mark.ray


@pytest.mark.processes
@pytest.mark.parametrize(
    ("stop", "code"), [(signal.SIGTERM, 143), (signal.SIGHUP, 129)], ids=["SIGTERM", "SIGHUP"]
)
def test_a_stopping_signal_to_a_ray_batch_stops_it_as_the_cli_says(
    ray_cluster: Any, tmp_path: Path, stop: signal.Signals, code: int
) -> None:
    write_items(tmp_path / "in.jsonl", items(30))
    out = tmp_path / "out.jsonl"
    address = ray_cluster.get_runtime_context().gcs_address
    with BatchServer(latency=0.2) as server:
        # --concurrency 2: this driver's workers need CPUs the test process's pool leaves.
        args = local_cli_args(
            server, tmp_path, "--concurrency", "2", "--executor", "ray", "--ray-address", address
        )
        process = subprocess.Popen(
            [sys.executable, "-m", "rlm_graph.cli", *args],
            env={**os.environ, "OPENAI_API_KEY": KEY},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=as_from_a_terminal(),
        )
        try:
            wait_for_lines(out, 3, process)  # type: ignore[arg-type]
        finally:
            process.send_signal(stop)  # `kill PID`: the process alone
            _, err = process.communicate(timeout=120)
    # Ray's handler, put in place by ray.init, exited at once: 1, or 134 with its dump.
    assert process.returncode == code, err
    done = len(out.read_text().splitlines())
    said = f"rlm-graph batch: interrupted ({stop.name}) after {done} items; rerun"
    assert said in err, err
    after = err.split("rerun the same command to resume", 1)[1]
    assert after.strip() == "", after  # no traceback of Ray's after the command's last line
