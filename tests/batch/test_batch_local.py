"""Batches on the local executor, against a fake OpenAI server over real HTTP."""

from __future__ import annotations

import gc
import io
import json
import os
import pickle
import pty
import subprocess
import sys
import threading
import tracemalloc
from collections.abc import Iterator
from datetime import date
from pathlib import Path
from typing import Any

import pytest

from rlm_graph import ConfigError, PluginError, _files, run_batch
from rlm_graph.batch import BatchItem, BatchResult, BatchSummary, ResultsFile, scan_items
from rlm_graph.batch.results import BatchError
from rlm_graph.cli import main
from rlm_graph.testing import FakeOpenAIServer
from tests.support.batch import (
    FAIL,
    KEY,
    BatchServer,
    cli_args,
    expected,
    items,
    kill_and_resume,
    local_cli_args,
    read_lines,
    rlm_kwargs,
    write_items,
)
from tests.support.terminal import read_until_closed


@pytest.mark.slow
def test_forty_items_each_get_their_own_answer_and_the_provider_limit_holds() -> None:
    with BatchServer(latency=0.01) as server:
        results = list(run_batch(items(40), rlm_kwargs(server, max_concurrent=3), concurrency=8))
    assert sorted(r.id for r in results) == sorted(f"item-{i}" for i in range(40))
    for result in results:
        assert result.error is None
        assert result.answer == expected(result.id)
        assert result.usage.calls == 3  # root turn + two sub-calls
        assert result.executor == "local"
    assert len(server.requests) == 120
    # 8 completions x 2 sub-calls could put 16 requests in flight; the provider allows 3.
    assert 1 < server.peak_in_flight <= 3


def test_an_item_whose_provider_fails_is_recorded_and_the_others_finish() -> None:
    with BatchServer() as server:
        results = {
            r.id: r for r in run_batch(items(6, fail=(2,)), rlm_kwargs(server), concurrency=3)
        }
    failed = results.pop("item-2")
    assert failed.answer is None and failed.error is not None
    assert failed.error.type == "ProviderError" or failed.error.type.startswith("Provider")
    assert "refused" in failed.error.message and KEY not in failed.error.message
    assert all(r.ok and r.answer == expected(r.id) for r in results.values())
    summary = BatchSummary.of([failed, *results.values()])
    assert (summary.answered, summary.failed) == (5, 1)


@pytest.mark.slow
def test_results_stream_as_items_finish_not_at_the_end() -> None:
    with BatchServer(latency=0.05) as server:
        stream = run_batch(items(6), rlm_kwargs(server), concurrency=1)
        first = next(stream)
        # One at a time: when the first result arrives, most items have not been asked yet.
        assert server.root_turns[first.id] == 1 and sum(server.root_turns.values()) < 6
        rest = list(stream)
    assert len(rest) == 5


def test_closing_the_iterator_stops_the_batch() -> None:
    with BatchServer(latency=0.02) as server:
        stream = run_batch(items(30), rlm_kwargs(server), concurrency=2)
        next(stream)
        stream.close()  # type: ignore[attr-defined]
        # The batch's loop is over when close() returns: nothing is left to send.
        assert not [t for t in threading.enumerate() if t.name == "rlm-graph-batch"]
        asked = len(server.requests)
    # The server has stopped and joined its handlers: whatever was sent has arrived.
    assert len(server.requests) == asked
    assert sum(server.root_turns.values()) < 30


def test_per_item_limit_overrides_apply_to_that_item_only() -> None:
    batch = items(3)
    batch[1]["max_tokens"] = 10
    with BatchServer() as server:
        results = {r.id: r for r in run_batch(batch, rlm_kwargs(server), concurrency=3)}
    assert results["item-1"].stop_reason == "max_tokens"
    assert results["item-0"].stop_reason is None and results["item-2"].answer == expected("item-2")


def test_skip_ids_resume_in_python() -> None:
    with BatchServer() as server:
        results = list(run_batch(items(5), rlm_kwargs(server), skip_ids=["item-0", "item-3"]))
    assert sorted(r.id for r in results) == ["item-1", "item-2", "item-4"]
    assert set(server.root_turns) == {"item-1", "item-2", "item-4"}


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ([{"id": "a", "query": "q"}], "exactly one of 'context' and 'context_file'"),
        (
            [{"id": "a", "context": "c", "query": "q", "temperature": 1}],
            "unknown key(s) 'temperature'",
        ),
        ([{"id": "a", "context": "c", "query": "q"}] * 2, "id 'a' is given twice"),
        ([{"id": "a", "context": "c", "query": "q", "max_iterations": 0}], "max_iterations"),
        ([{"id": "a", "context": None, "query": "q"}], "'context' must be a string"),
        ([{"id": "a", "context": "c", "query": 7}], "'query' must be the question as a string"),
        ([{"id": "a", "context": "c"}], "'query' (the question, a string) is missing"),
    ],
)
def test_bad_items_name_the_problem(bad: list[dict[str, object]], message: str) -> None:
    with BatchServer() as server, pytest.raises(ConfigError) as caught:
        list(run_batch(bad, rlm_kwargs(server)))
    assert message in str(caught.value)


def test_a_bad_item_met_midway_is_raised_after_the_completions_already_running() -> None:
    """`run_batch` reads items lazily, raising a bad one when it reaches it: the
    completions running then (their requests sent and paid for) were cancelled and lost."""
    given = items(6)
    given.insert(4, dict(given[0]))  # item-0 again, met while items 1 to 3 run
    answered = []
    with BatchServer(latency=0.3) as server:
        with pytest.raises(ConfigError, match="id 'item-0' is given twice"):
            for result in run_batch(given, rlm_kwargs(server, max_concurrent=8), concurrency=3):
                answered.append(result.id)
        sent = sorted(server.root_turns)
    assert sorted(answered) == ["item-0", "item-1", "item-2", "item-3"] == sent


def test_bad_configuration_fails_before_any_item_runs() -> None:
    with BatchServer() as server:
        with pytest.raises(PluginError, match="unknown executor 'nope'; registered: local"):
            run_batch(items(2), rlm_kwargs(server), executor="nope")
        with pytest.raises(ConfigError, match="concurrency"):
            run_batch(items(2), rlm_kwargs(server), concurrency=0)
        with pytest.raises(ConfigError, match="'limiter'"):
            run_batch(items(2), {**rlm_kwargs(server), "limiter": object()})
        with pytest.raises(ConfigError, match="unknown keyword"):
            run_batch(items(2), {**rlm_kwargs(server), "max_turns": 3})
    assert server.requests == []


def test_a_partial_last_line_is_cut_off_before_appending(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    whole = BatchResult(id="a", answer="x", started_at=0, finished_at=1, seconds=1).to_line()
    path.write_text(whole + '{"id": "b", "answ')  # killed mid-write
    with ResultsFile(path) as results:
        assert results.done() == {"a"}
        results.append(BatchResult(id="b", answer="y", started_at=0, finished_at=1, seconds=1))
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["id"] for line in lines] == ["a", "b"]
    path.write_text(whole + '{"i')  # killed three bytes into the line
    with ResultsFile(path) as results:
        assert results.done() == {"a"}
    assert path.read_text() == whole
    other = BatchResult(id="b", answer="y", started_at=0, finished_at=1, seconds=1).to_line()
    path.write_text(whole + other.rstrip("\n"))  # killed just before the newline
    with ResultsFile(path) as results:
        assert results.done() == {"a"}
    assert path.read_text() == whole


def test_a_file_that_is_not_a_results_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("my notes\n")
    with pytest.raises(ConfigError, match="not a batch result line"):
        ResultsFile(path).open()
    assert path.read_text() == "my notes\n"


# -- the command line -------------------------------------------------------------------


@pytest.mark.slow
def test_cli_writes_a_line_per_item_a_summary_and_exits_1_on_a_failed_item(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    batch = items(5, fail=(4,))
    batch[0] = {"id": "item-0", "context_file": "ctx0.txt", "query": "question item-no-0."}
    (tmp_path / "ctx0.txt").write_text("ctx0")
    write_items(tmp_path / "in.jsonl", batch)
    with BatchServer() as server:
        code = main(cli_args(server, tmp_path, "--concurrency", "2"))
    assert code == 1
    lines = {line["id"]: line for line in read_lines(tmp_path / "out.jsonl")}
    assert lines["item-0"]["answer"] == expected("item-0")  # read from its context_file
    assert lines["item-4"]["error"]["type"].startswith("Provider")  # type: ignore[index]
    err = capsys.readouterr().err
    assert "4 answered, 1 failed" in err and "p50" in err and "p95" in err
    assert err.count("/5] item-") == 5


def test_cli_bad_input_lines_exit_2_naming_each_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "in.jsonl").write_text(
        '{"id": "a", "context": "c", "query": "q"}\nnot json\n{"id": "a", "context": "c", "query": "q"}\n'
        '{"id": "b", "context_file": "missing.txt", "query": "q"}\n'
        '{"id": "c", "context": "c", "query": "q", "max_iterations": "five"}\n'
    )
    with BatchServer() as server:
        assert main(cli_args(server, tmp_path)) == 2
        assert server.requests == []
    err = capsys.readouterr().err
    assert err.count("\n") == 5  # a heading, then one line per bad line
    assert "in.jsonl:2: not JSON" in err
    assert "in.jsonl:3: id 'a' already used on line 1" in err
    assert "in.jsonl:4: context_file" in err and "is not a file" in err
    assert "in.jsonl:5: bad limit: max_iterations" in err
    assert not (tmp_path / "out.jsonl").exists() or (tmp_path / "out.jsonl").read_text() == ""


@pytest.mark.processes
def test_cli_ray_without_ray_says_how_to_get_it(tmp_path: Path) -> None:
    write_items(tmp_path / "in.jsonl", items(1))
    code = (
        "import sys; sys.modules['ray'] = None\n"
        "from rlm_graph.cli import main\n"
        f"sys.exit(main({['batch', '--input', str(tmp_path / 'in.jsonl'), '--output', str(tmp_path / 'o.jsonl'), '--model', 'm', '--executor', 'ray']!r}))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "pip install 'rlm-graph[ray]'" in done.stderr


@pytest.mark.processes
def test_cli_killed_midway_then_resumed_answers_every_id_exactly_once(tmp_path: Path) -> None:
    with BatchServer(latency=0.02) as server:
        lines = kill_and_resume(server, tmp_path, 40, "--concurrency", "4")
    ids = [line["id"] for line in lines]
    assert sorted(ids) == sorted(f"item-{i}" for i in range(40))  # each exactly once
    assert all(line["answer"] == expected(str(line["id"])) for line in lines)


def test_cli_rerun_skips_failed_items_unless_asked_to_retry_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    write_items(tmp_path / "in.jsonl", items(3, fail=(1,)))
    with BatchServer() as server:
        assert main(local_cli_args(server, tmp_path, "--quiet")) == 1
        assert main(local_cli_args(server, tmp_path, "--quiet")) == 0  # nothing left to run
        assert sum(server.root_turns.values()) == 3
        # The provider is fixed (the item's request is accepted now): retry the failure.
        (tmp_path / "in.jsonl").write_text(
            (tmp_path / "in.jsonl").read_text().replace(f" {FAIL}", "")
        )
        assert main(local_cli_args(server, tmp_path, "--quiet", "--retry-failed")) == 0
    lines = read_lines(tmp_path / "out.jsonl")
    assert [line["id"] for line in lines].count("item-1") == 2  # the old line stays; the last wins
    assert lines[-1]["id"] == "item-1" and lines[-1]["answer"] == expected("item-1")
    assert server.root_turns == {"item-0": 1, "item-1": 2, "item-2": 1}


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_a_terminal_progress_is_one_live_line_and_failures_get_their_own() -> None:
    from rlm_graph.batch import BatchError
    from rlm_graph.cli.batch import BatchProgress

    stream = _Terminal()
    ok = BatchResult(id="a", answer="x", started_at=0, finished_at=1, seconds=1)
    bad = BatchResult(
        id="b",
        started_at=0,
        finished_at=1,
        seconds=1,
        error=BatchError(type="ProviderError", message="refused"),
    )
    with BatchProgress(3, quiet=False, stream=stream) as progress:
        for result in (ok, bad, ok):
            progress.finished(result)
    text = stream.getvalue()
    assert "3/3 done, 1 failed" in text  # the live line's last drawing
    assert "b FAILED ProviderError: refused" in text
    assert "] a ok" not in text  # answered items have no line of their own on a terminal


def test_control_sequences_in_a_failed_items_id_never_reach_the_terminal(tmp_path: Path) -> None:
    hostile = "x\x1b]0;owned\x07\x1b[2J\x1b[31mred\rfake"
    batch = items(2, fail=(0,))
    batch[0]["id"] = hostile
    write_items(tmp_path / "in.jsonl", batch)
    controller, terminal = pty.openpty()
    with BatchServer() as server:
        process = subprocess.Popen(
            [sys.executable, "-m", "rlm_graph.cli", *local_cli_args(server, tmp_path)],
            env={**os.environ, "OPENAI_API_KEY": KEY},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=terminal,  # the progress goes to stderr: a live line on a terminal
        )
        os.close(terminal)
        shown = read_until_closed(controller)
        assert process.wait(timeout=60) == 1
    assert b"xred fake FAILED ProviderError" in shown  # its line, the sequences taken out
    assert b"owned" not in shown and b"\x1b[2J" not in shown and b"\x1b[31m" not in shown
    assert hostile in {line["id"] for line in read_lines(tmp_path / "out.jsonl")}  # kept there


def test_a_failed_item_keeps_the_usage_it_already_spent() -> None:
    from rlm_graph.errors import ProviderError

    def respond(request: object) -> object:
        turns = sum(1 for m in request.messages if m.role == "assistant")  # type: ignore[attr-defined]
        if turns == 0:
            return "```repl\nprint('looked')\n```"
        return ProviderError("the second turn is refused", provider="scripted", status_code=400)

    kwargs = {"backend": "scripted", "backend_kwargs": {"respond": respond}}
    (result,) = run_batch([{"id": "a", "context": "c", "query": "q"}], kwargs)
    assert result.error is not None and "refused" in result.error.message
    assert result.usage.calls == 1  # the first turn was answered (and paid for)
    assert result.usage.input_tokens > 0


def test_an_output_that_is_not_a_results_file_is_never_cut_or_appended_to(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text('{"settings": {"a": 1}}')  # one line, no newline
    with pytest.raises(ConfigError, match="is not a results file"):
        ResultsFile(config).open()
    assert config.read_text() == '{"settings": {"a": 1}}'
    one_item = tmp_path / "one_item.jsonl"
    one_item.write_text('{"id": "q-1", "context": "c", "query": "q"}')  # whole, no newline
    with pytest.raises(ConfigError, match="is not a results file"):
        ResultsFile(one_item).open()
    assert one_item.read_text() == '{"id": "q-1", "context": "c", "query": "q"}'
    inputs = tmp_path / "items.jsonl"
    inputs.write_text('{"id": "a", "context": "c", "query": "q"}\n')  # has ids, is no result
    with pytest.raises(ConfigError, match="items.jsonl:1 is not a batch result line"):
        ResultsFile(inputs).open()
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match="is not a regular file"):
        ResultsFile(fifo).open()  # reading it first would hang


def test_cli_refuses_a_piped_input_and_bad_settings_before_touching_the_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fifo = tmp_path / "in.fifo"
    os.mkfifo(fifo)
    out = tmp_path / "out.jsonl"
    args = ["batch", "--output", str(out), "--backend", "scripted", "--model", "m"]
    assert main([*args, "--input", str(fifo)]) == 2
    assert "is not a regular file; the items are read twice" in capsys.readouterr().err
    write_items(tmp_path / "in.jsonl", items(1))
    assert main([*args, "--input", str(tmp_path / "in.jsonl"), "--concurrency", "0"]) == 2
    assert "concurrency must be a positive integer" in capsys.readouterr().err
    assert main([*args, "--input", str(tmp_path / "in.jsonl"), "--executor", "nope"]) == 2
    assert not out.exists()  # nothing was created for a run that never started


def test_a_second_run_on_the_same_output_is_refused_while_the_first_writes(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    first = ResultsFile(path).open()
    try:
        first.append(BatchResult(id="a", answer="x", started_at=0, finished_at=1, seconds=1))
        with pytest.raises(ConfigError, match="another run is writing --output .*; wait for it"):
            ResultsFile(path).open()
    finally:
        first.close()
    with ResultsFile(path) as again:  # the first has ended: the file is free
        assert again.done() == {"a"}


def test_input_with_a_bom_runs_and_a_line_that_is_not_utf8_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "in.jsonl"
    source.write_bytes(b'\xef\xbb\xbf{"id": "a", "context": "c", "query": "q"}\r\n')
    out = tmp_path / "out.jsonl"
    args = ["batch", "--output", str(out), "--backend", "scripted", "--model", "m", "--quiet"]
    assert main([*args, "--input", str(source)]) in (0, 1)  # it ran (the script may fail)
    assert [line["id"] for line in read_lines(out)] == ["a"]
    source.write_bytes(b'{"id": "b", "context": "c", "query": "q"}\n{"id": "c\xff"}\n')
    assert main([*args, "--input", str(source)]) == 2
    assert "in.jsonl:2: not UTF-8 text (byte 10 of the line)" in capsys.readouterr().err


def test_a_full_disk_stops_the_batch_with_how_to_go_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import errno

    write_items(tmp_path / "in.jsonl", items(3))
    out = tmp_path / "out.jsonl"
    real = ResultsFile.append
    written: list[str] = []

    def append(self: ResultsFile, result: BatchResult) -> None:
        if written:
            raise OSError(errno.ENOSPC, "No space left on device")
        written.append(result.id)
        real(self, result)

    monkeypatch.setattr(ResultsFile, "append", append)
    args = ["batch", "--input", str(tmp_path / "in.jsonl"), "--output", str(out)]
    code = main([*args, "--backend", "scripted", "--model", "m", "--quiet", "--concurrency", "1"])
    assert code == 2
    err = capsys.readouterr().err
    assert "cannot write --output" in err and "No space left on device; 1 results" in err
    assert "rerun the same command: it goes on from there" in err and "Traceback" not in err
    assert [line["id"] for line in read_lines(out)] == written


def test_an_output_that_is_the_input_under_another_name_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same file spelt another way, a symlink or a hard link to it, as --output would
    have the results overwrite the items they come from."""
    write_items(tmp_path / "in.jsonl", items(2))
    before = (tmp_path / "in.jsonl").read_bytes()
    (tmp_path / "soft.jsonl").symlink_to(tmp_path / "in.jsonl")
    os.link(tmp_path / "in.jsonl", tmp_path / "hard.jsonl")
    with BatchServer() as server:
        for other in ("in.jsonl", "soft.jsonl", "hard.jsonl", "./in.jsonl"):
            args = cli_args(server, tmp_path)
            args[args.index("--output") + 1] = str(tmp_path / other)
            assert main(args) == 2
            assert "--output must not be the --input file" in capsys.readouterr().err
        assert server.requests == []
    assert (tmp_path / "in.jsonl").read_bytes() == before


def test_an_answer_with_half_a_character_is_written_and_found_again(tmp_path: Path) -> None:
    """A model reply cut inside an emoji (a lone surrogate from its JSON ``\\ud83d``) has no
    UTF-8: writing its result failed, and every rerun failed at the same item."""
    path = tmp_path / "out.jsonl"
    with ResultsFile(path) as results:
        results.append(
            BatchResult(id="a", answer="7 \ud83d", started_at=0, finished_at=1, seconds=1)
        )
    assert json.loads(path.read_bytes().decode("utf-8"))["answer"] == "7 \ufffd"
    with ResultsFile(path) as again:
        assert again.done() == {"a"}


def test_an_id_with_half_a_character_is_refused_with_its_line(tmp_path: Path) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text('{"id": "a\\ud83d", "context": "c", "query": "q"}\n')
    with pytest.raises(ConfigError, match=r"in.jsonl:1: 'id' .* holds half a character"):
        scan_items(source)


@pytest.mark.parametrize("how", ["close", "drop"])
def test_an_iterator_closed_or_dropped_before_its_first_result_runs_nothing(how: str) -> None:
    with BatchServer() as server:
        stream = run_batch(items(20), rlm_kwargs(server), concurrency=2)
        if how == "close":
            stream.close()  # type: ignore[attr-defined]
        else:
            del stream
            gc.collect()
        assert not [t for t in threading.enumerate() if t.name == "rlm-graph-batch"]
    assert server.requests == []


def test_a_concurrency_far_above_the_items_costs_no_more_than_the_items() -> None:
    def peak_memory(concurrency: int) -> int:
        tracemalloc.start()
        try:
            results = list(run_batch(items(3), rlm_kwargs(server), concurrency=concurrency))
            assert sorted(r.answer or "" for r in results) == [
                expected(f"item-{i}") for i in range(3)
            ]
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    with BatchServer() as server:
        peak_memory(3)  # the first batch of the process pays for its imports
        small, huge = peak_memory(3), peak_memory(50_000)
    # One task per item in flight: a task per unused place was about 1 KiB, 50 MiB here.
    assert huge < small + 8 * 2**20


def test_with_a_journal_items_that_ask_the_same_are_each_answered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Items with the same context and question shared one journaled run: one at a time,
    the second and later replayed the first's answer (a pass@k batch got k copies of
    one). Each item's id is in its run's key; a rerun over the journal replays each."""
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    same = items(1)[0]
    write_items(tmp_path / "in.jsonl", [{**same, "id": f"sample-{k}"} for k in range(4)])
    journal = str(tmp_path / "j.sqlite")
    with BatchServer() as server:
        args = local_cli_args(server, tmp_path, "--quiet", "--concurrency", "1")
        assert main([*args, "--journal", journal]) == 0
        assert server.root_turns == {"item-0": 4}  # each sample asked the model
        (tmp_path / "out.jsonl").unlink()
        capsys.readouterr()
        assert main([*args, "--journal", journal]) == 0
        assert server.root_turns == {"item-0": 4}  # and each was replayed, not asked again
    lines = read_lines(tmp_path / "out.jsonl")
    assert sorted(line["id"] for line in lines) == [f"sample-{k}" for k in range(4)]
    assert {line["answer"] for line in lines} == {expected("item-0")}
    for line in lines:  # what was spent when recorded, and that it was replayed
        usage: Any = line["usage"]
        assert usage["replayed"] == 3 and usage["calls"] == 3
        assert usage["tokens_saved"] == usage["input_tokens"] + usage["output_tokens"] > 0
    saved = sum(line["usage"]["tokens_saved"] for line in lines)  # type: ignore[index]
    assert f"{saved:,} tokens of them replayed from the journal" in capsys.readouterr().err


def test_a_rerun_asks_again_an_item_edited_since_its_line_was_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A rerun compared ids only: an item whose question, context or limits changed
    since (or a results file of another input) was skipped in silence. Each line keeps
    a hash of what its item asked; an item that asks something else now is asked again,
    and said to be. A line written before the hash was kept still counts as done."""
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    batch = items(4)
    write_items(tmp_path / "in.jsonl", batch)
    with BatchServer() as server:
        assert main(local_cli_args(server, tmp_path, "--quiet")) == 0
        capsys.readouterr()
        batch[1]["query"] += " Say it again."
        batch[2]["context"] = "ctx2"  # as it was: not an edit
        batch[3]["max_iterations"] = 7
        write_items(tmp_path / "in.jsonl", batch)
        lines = read_lines(tmp_path / "out.jsonl")
        for line in lines:
            if line["id"] == "item-0":
                del line["asked"]  # item-0's line as an older rlm-graph wrote it
        (tmp_path / "out.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
        assert main(local_cli_args(server, tmp_path, "--quiet")) == 0
        assert server.root_turns == {"item-0": 1, "item-1": 2, "item-2": 1, "item-3": 2}
        err = capsys.readouterr().err
        assert "2 of 4 items already in" in err
        assert "(2 more that ask something else now are asked again); running the other 2" in err
        assert main(local_cli_args(server, tmp_path, "--quiet")) == 0  # all current now
        assert sum(server.root_turns.values()) == 6
    ids = [line["id"] for line in read_lines(tmp_path / "out.jsonl")]
    assert sorted(ids) == ["item-0", "item-1", "item-1", "item-2", "item-3", "item-3"]


def _peak_memory(work: Any) -> int:
    tracemalloc.start()
    try:
        work()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_resume_reads_its_results_file_a_line_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A rerun read the whole results file into memory, twice over (400 MB of results
    peaked at 857 MB with nothing left to run); it reads a line at a time, and still cuts
    off a last line a kill left half written."""
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    batch = items(24)
    write_items(tmp_path / "in.jsonl", batch)
    answer = "x" * 2**20
    lines = [
        BatchResult(id=i["id"], answer=answer, started_at=1, finished_at=2, seconds=1).to_line()
        for i in batch
    ]
    out = tmp_path / "out.jsonl"
    with BatchServer() as server:
        args = local_cli_args(server, tmp_path, "--quiet")
        for _ in range(2):  # the first run of the process pays for its imports
            out.write_text("".join(lines) + lines[0][: 2**19])  # 24 MiB, then a cut line
            peak = _peak_memory(lambda: main(args))
        assert server.requests == []  # every item was done
    assert "24 of 24 items already in" in capsys.readouterr().err
    assert out.read_text() == "".join(lines)  # the cut line is gone, nothing else
    assert peak < 8 * 2**20


def test_a_long_last_line_is_not_read_whole_to_resume_or_to_refuse(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lines were read as the file's iterator gave them, so the line cut by a kill
    was read whole after the last complete one (8 MiB here, as much as an answer); a
    last line past `_WHOLE_TAIL` is taken as cut unread, and a file whose last line
    does not start as a result is refused from its first bytes."""
    monkeypatch.setattr(_files, "_WHOLE_TAIL", 2**20)
    done = BatchResult(id="a", answer="7", started_at=1, finished_at=2, seconds=1).to_line()
    out = tmp_path / "out.jsonl"
    out.write_text(done + '{"id": "b", "answer": "' + "y" * 8 * 2**20)
    peak = _peak_memory(lambda: ResultsFile(out).open().close())
    assert out.read_text() == done and peak < 2**20  # cut off, never read
    out.write_text(done + "z" * 8 * 2**20)
    refusals: list[str] = []

    def refused() -> None:
        with pytest.raises(ConfigError, match="not a results file") as raised:
            ResultsFile(out).open()
        refusals.append(str(raised.value))

    assert _peak_memory(refused) < 2**20 and len(refusals) == 1
    assert out.stat().st_size > 8 * 2**20  # refused: nothing of it cut


def test_the_command_keeps_no_answer_in_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`rlm-graph batch` kept every result, answers included, to print its summary line
    (2,000 answers of 200 KB: 474 MB); 24 answers of 2 MB go through it here."""
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    code = "answer['content'] = context * 2_000_000\nanswer['ready'] = True"

    def respond(body: dict[str, Any]) -> str:
        return f"```repl\n{code}\n```"

    write_items(
        tmp_path / "in.jsonl", [{"id": f"i{n}", "context": "z", "query": "q"} for n in range(24)]
    )
    with FakeOpenAIServer(respond) as server:
        args = local_cli_args(server, tmp_path, "--quiet", "--concurrency", "1")  # type: ignore[arg-type]
        for output in ("warm.jsonl", "out.jsonl"):  # the first run pays for its imports
            args[args.index("--output") + 1] = str(tmp_path / output)
            peak = _peak_memory(lambda: main(args))
    assert "24 answered, 0 failed" in capsys.readouterr().err
    assert (tmp_path / "out.jsonl").stat().st_size > 48_000_000
    assert peak < 16 * 2**20  # the 24 answers held: 50 MB


def test_a_summary_keeps_totals_not_the_answers() -> None:
    """`rlm-graph batch` kept every result, answers included, only to print its summary
    line: memory grew with the answers (2,000 answers of 200 KB: 474 MB)."""

    def results() -> Iterator[BatchResult]:
        for n in range(200):
            answer = "y" * 2**20  # made here, dropped once summed
            cost = 0.5 if n % 2 else None
            yield BatchResult(
                id=str(n), answer=answer, cost=cost, started_at=0, finished_at=n, seconds=n
            )

    summaries: list[BatchSummary] = []
    peak = _peak_memory(lambda: summaries.append(BatchSummary.of(results(), skipped=3)))
    assert peak < 16 * 2**20  # 200 MiB of answers went through it
    summary = summaries[0]
    assert (summary.answered, summary.failed, summary.skipped) == (200, 0, 3)
    assert summary.cost == 50.0 and (summary.p50_seconds, summary.p95_seconds) == (99, 189)


def test_a_line_break_in_an_id_or_an_error_cannot_forge_a_progress_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    batch = items(2, fail=(0,))
    batch[0]["id"] = "e\n[2/2] item-9 ok 0.01 s\u2028[2/2] item-8 ok\x0b[2/2] item-7 ok"
    write_items(tmp_path / "in.jsonl", batch)
    with BatchServer() as server:
        assert main(local_cli_args(server, tmp_path)) == 1
    progress = [line for line in capsys.readouterr().err.splitlines() if line.startswith("[")]
    forged = ("[2/2] item-9", "[2/2] item-8", "[2/2] item-7")
    assert len(progress) == 2 and not any(line.startswith(forged) for line in progress)
    assert any(line.startswith("[") and "e [2/2] item-9 ok" in line for line in progress)


def _line(item: BatchItem, answer: str | None, error: bool = False) -> str:
    return BatchResult(
        id=item.id,
        answer=answer,
        started_at=1.0,
        finished_at=2.0,
        seconds=1.0,
        error=BatchError(type="ProviderError", message="refused") if error else None,
        asked=item.asked(),
    ).to_line()


def test_the_last_line_of_an_id_says_what_it_was_made_for(tmp_path: Path) -> None:
    """An item edited A -> B -> A was skipped (a line for A was in the file), though its
    last line, the one that counts, answered B."""
    a = BatchItem(id="q1", query="Who signed?", context="doc v1")
    b = BatchItem(id="q1", query="Who signed?", context="doc v2")
    path = tmp_path / "out.jsonl"
    path.write_text(_line(a, "for v1") + _line(b, "for v2"))
    with ResultsFile(path).open() as results:
        assert results.done(asked={"q1": a.asked()}) == set()
        assert results.done(asked={"q1": b.asked()}) == {"q1"}
    path.write_text(_line(a, "for v1") + _line(b, None, error=True))  # B failed after A
    with ResultsFile(path).open() as results:
        assert results.done(asked={"q1": b.asked()}) == {"q1"}  # the failure counts as done
        assert results.done(retry_failed=True, asked={"q1": b.asked()}) == set()
        assert results.done(retry_failed=True, asked={"q1": a.asked()}) == {"q1"}


def test_what_an_item_asks_is_the_same_once_its_context_file_is_read(tmp_path: Path) -> None:
    """An executor that ships items elsewhere reads their files first (`loaded`): the
    hash was then of the text, not of the path the rerun's check hashes, so a rerun with
    --executor ray asked every such item again."""
    (tmp_path / "c.txt").write_text("the document")
    item = BatchItem(id="f", query="q", context_file=str(tmp_path / "c.txt"))
    loaded = item.loaded()
    assert loaded.context == "the document" and loaded.context_file is None
    assert loaded.asked() == item.asked()
    assert pickle.loads(pickle.dumps(loaded)).asked() == item.asked()  # as Ray ships it


def test_a_context_file_item_does_not_ask_what_an_inline_context_of_its_shape_asks() -> None:
    """``"context": {"context_file": "c.txt"}`` (a mistake a rerun corrects to
    ``"context_file": "c.txt"``) hashed as the file item: the corrected item was skipped
    and kept the answer about the dict."""
    inline = BatchItem(id="q", query="q", context={"context_file": "c.txt"})
    in_file = BatchItem(id="q", query="q", context_file="c.txt")
    assert inline.asked() != in_file.asked()


def test_a_context_json_cannot_hold_is_answered_in_python() -> None:
    """`run_batch` from Python takes any context the engine does; hashing what it asks
    raised a TypeError after the completion, and the whole batch with it."""
    with BatchServer() as server:
        batch = [
            {"id": "item-0", "query": "question item-no-0.", "context": {"day": date(2020, 1, 2)}},
            {"id": "item-1", "query": "question item-no-1.", "context": "ctx1"},
        ]
        results = list(run_batch(batch, rlm_kwargs(server)))
    assert sorted(r.id for r in results) == ["item-0", "item-1"]
    assert all(r.ok and r.asked for r in results)


def test_a_rerun_does_not_need_the_context_files_of_items_already_done(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The whole-file check refused a rerun whose done item's context file was gone,
    though the rerun would not read it."""
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    (tmp_path / "ctx0.txt").write_text("ctx0")
    (tmp_path / "ctx1.txt").write_text("ctx1")
    batch = [
        {"id": f"item-{n}", "context_file": f"ctx{n}.txt", "query": f"question item-no-{n}."}
        for n in range(2)
    ]
    write_items(tmp_path / "in.jsonl", batch[:1])
    with BatchServer() as server:
        assert main(local_cli_args(server, tmp_path, "--quiet")) == 0
        (tmp_path / "ctx0.txt").unlink()
        write_items(tmp_path / "in.jsonl", batch)
        assert main(local_cli_args(server, tmp_path, "--quiet")) == 0
        assert server.root_turns == {"item-0": 1, "item-1": 1}
        (tmp_path / "ctx1.txt").unlink()  # not done: still refused when it is missing
        write_items(tmp_path / "in.jsonl", [*batch, {**batch[1], "id": "item-2"}])
        assert main(local_cli_args(server, tmp_path, "--quiet")) == 2
    ids = sorted(line["id"] for line in read_lines(tmp_path / "out.jsonl"))
    assert ids == ["item-0", "item-1"]


def test_a_rerun_that_names_the_input_another_way_skips_its_context_file_items(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """What an item asks hashed its context file's path as joined to the folder the
    input was named from: the same file given as ``in.jsonl`` after
    ``/abs/in.jsonl`` asked (and paid for) every such item again."""
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    (tmp_path / "ctx0.txt").write_text("ctx0")
    item = {"id": "item-0", "context_file": "ctx0.txt", "query": "question item-no-0."}
    other = {**item, "id": "item-1", "query": "question item-no-1."}
    write_items(tmp_path / "in.jsonl", [item, other])
    with BatchServer() as server:
        assert main(local_cli_args(server, tmp_path, "--quiet")) == 0
        monkeypatch.chdir(tmp_path)
        relative = local_cli_args(server, tmp_path, "--quiet")
        relative[relative.index("--input") + 1] = "in.jsonl"
        assert main(relative) == 0
        monkeypatch.chdir(tmp_path.parent)
        relative[relative.index("--input") + 1] = f"{tmp_path.name}/in.jsonl"
        assert main(relative) == 0
        assert server.root_turns == {"item-0": 1, "item-1": 1}
    assert "asked again" not in capsys.readouterr().err
    assert len(read_lines(tmp_path / "out.jsonl")) == 2


def test_an_item_edited_to_a_missing_context_file_is_refused_before_it_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Done in --output, but for another context file: it will run again, so the file
    it names now must be there (the check saw only the id, and the item failed later)."""
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    (tmp_path / "ctx0.txt").write_text("ctx0")
    item = {"id": "item-0", "context_file": "ctx0.txt", "query": "question item-no-0."}
    write_items(tmp_path / "in.jsonl", [item])
    with BatchServer() as server:
        assert main(local_cli_args(server, tmp_path, "--quiet")) == 0
        write_items(tmp_path / "in.jsonl", [{**item, "context_file": "moved.txt"}])
        assert main(local_cli_args(server, tmp_path, "--quiet")) == 2
        assert server.root_turns == {"item-0": 1}
    assert "context_file" in capsys.readouterr().err
    assert len(read_lines(tmp_path / "out.jsonl")) == 1


def test_retry_failed_also_reruns_items_a_limit_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An item a limit stopped (a partial answer, ``stop_reason`` set) counted as answered:
    rerun with a larger limit and ``--retry-failed``, it was skipped, and only a new
    ``--output`` could get its whole answer."""
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    write_items(tmp_path / "in.jsonl", items(2))
    with BatchServer() as server:
        main(local_cli_args(server, tmp_path, "--quiet", "--max-tokens", "1"))
        stopped = read_lines(tmp_path / "out.jsonl")
        assert [line["stop_reason"] for line in stopped] == ["max_tokens", "max_tokens"]
        assert main(local_cli_args(server, tmp_path, "--quiet")) == 0
        assert len(read_lines(tmp_path / "out.jsonl")) == 2  # without the flag: done
        assert main(local_cli_args(server, tmp_path, "--quiet", "--retry-failed")) == 0
        assert main(local_cli_args(server, tmp_path, "--quiet", "--retry-failed")) == 0
    lines = read_lines(tmp_path / "out.jsonl")
    assert len(lines) == 4  # each rerun once, then answered in full and skipped
    assert {line["id"]: line["answer"] for line in lines[2:]} == {
        f"item-{i}": expected(f"item-{i}") for i in range(2)
    }
    assert all(line["stop_reason"] is None for line in lines[2:])
