"""The README's commands and offline examples work as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
BLOCKS = re.findall(r"^```python\n(.*?)^```$", README, re.DOTALL | re.MULTILINE)
OFFLINE = [block for block in BLOCKS if '"scripted"' in block]


def test_the_readme_has_offline_examples() -> None:
    assert len(OFFLINE) >= 2


@pytest.mark.parametrize("index", range(len(OFFLINE)))
def test_readme_example_runs_as_written(index: int, capsys: pytest.CaptureFixture[str]) -> None:
    exec(compile(OFFLINE[index], f"README example {index}", "exec"), {"__name__": "__readme__"})
    assert capsys.readouterr().out.strip()


def test_the_readme_opens_with_two_setup_commands_that_ci_runs() -> None:
    first_block = re.search(r"```sh\n(.*?)```", README, re.DOTALL)
    assert first_block is not None
    commands = [
        line.split("#")[0].strip() for line in first_block.group(1).splitlines() if line.strip()
    ]
    assert commands == ["make demo", "make test"]
    assert "make test" in (ROOT / ".ci" / "run").read_text()
