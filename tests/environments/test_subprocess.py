"""The ``subprocess`` environment, end to end: real guest processes, the scripted
provider, and the environment's boundaries (timeout, memory, secrets, crash, network,
working directory, contexts sent once, sub-calls under the provider limit)."""

from __future__ import annotations

import os
import socket
import time
from typing import Any

import pytest
import trio

from rlm_graph import RLM, NodeKind, NodeStatus
from rlm_graph.contracts import ChatRequest
from rlm_graph.errors import ConfigError
from rlm_graph_subprocess import SubprocessEnvironment
from tests.support.guests import Spy, alive, engine, feedback, processes_running
from tests.support.scripts import is_root_turn, repl, scripted, turn_number

pytestmark = pytest.mark.processes  # every test starts a guest process

# -- boundaries ------------------------------------------------------------------------


async def test_an_endless_block_is_stopped_at_its_timeout_and_the_run_answers(spy: Spy) -> None:
    rlm = engine(
        [
            repl("import os\nprint(f'pid={os.getpid()}')\nmine = 1"),
            repl("while True:\n    pass"),
            repl("FINAL(context + ' ' + str('mine' in globals()))"),
        ],
        spy,
        environment_kwargs={"timeout": 0.5},
    )
    result = await rlm.acompletion("still here")
    assert result.response == "still here False"  # context restored, the model's state lost
    told = feedback(rlm, 2)
    assert "TimeoutError: the block ran longer than 0.5 s" in told
    assert "the REPL was restarted and its variables are lost" in told
    stopped = list(result.graph.records(NodeKind.REPL_BLOCK))[1]
    assert stopped.status == NodeStatus.ERROR and stopped.error_type == "TimeoutError"
    assert spy.envs[0].restarts == 1
    assert not alive(spy.envs[0].guest_pids[0])


async def test_a_memory_bomb_is_stopped_by_the_memory_limit() -> None:
    bomb = "chunks = []\nwhile True:\n    chunks.append(bytearray(16 * 1024 * 1024))"
    rlm = engine(
        [repl(bomb), repl("del chunks\nFINAL('survived')")],
        environment_kwargs={"memory_limit_mb": 300, "timeout": 20},
    )
    result = await rlm.acompletion("ctx")
    assert result.response == "survived"
    assert "MemoryError" in feedback(rlm, 1)


async def test_the_guest_sees_no_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    planted = {
        "OPENAI_API_KEY": "sk-planted-1",
        "MY_TOKEN": "planted-2",
        "DB_PASSWORD": "planted-3",
        "AWS_SECRET_ACCESS_KEY": "planted-4",
        "LC_API_KEY": "planted-5",
    }
    for name, value in planted.items():
        monkeypatch.setenv(name, value)
    rlm = engine(
        [repl("import os\nFINAL(repr(dict(os.environ)))")],
        environment_kwargs={"env": {"GREETING": "hello"}},
    )
    seen = eval((await rlm.acompletion("ctx")).response)
    assert not set(planted) & set(seen)
    assert not set(planted.values()) & set(seen.values())
    assert seen["GREETING"] == "hello"
    assert set(seen) <= {
        "PATH",
        "LANG",
        "LANGUAGE",
        "TZ",
        "PYTHONPATH",
        "HOME",
        "TMPDIR",
        "GREETING",
        "PYTHONDONTWRITEBYTECODE",
        "MALLOC_ARENA_MAX",
    } | {name for name in seen if name.startswith("LC_")}


def test_asking_to_pass_a_secret_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="MY_TOKEN look like secrets"):
        SubprocessEnvironment(bridge=None, env={"MY_TOKEN": "x"})  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="memory_limit_mb: .*at least 200 MB"):
        SubprocessEnvironment(bridge=None, memory_limit_mb=10)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="Known keywords: timeout, memory_limit_mb"):
        SubprocessEnvironment(bridge=None, timout=5)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["timeout", "cpu_seconds", "start_timeout", "max_message_mb"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), 0])
def test_a_limit_that_is_no_positive_finite_number_is_a_config_error(
    name: str, value: float
) -> None:
    """NaN passed the check that refused 0 (it compares false): cpu_seconds=nan turned
    the CPU limit off, the others failed at the first block with no keyword named."""
    with pytest.raises(ConfigError, match=f"{name}: must be a positive finite number"):
        SubprocessEnvironment(bridge=None, **{name: value})  # type: ignore[arg-type]
    if name == "timeout":
        with pytest.raises(ConfigError, match="timeout must be a positive finite number"):
            RLM("scripted", {"responses": ["x"]}, environment_kwargs={"timeout": value})


async def test_a_crashed_guest_is_reported_and_replaced(spy: Spy) -> None:
    rlm = engine(
        [
            repl("import os\nprint(f'pid={os.getpid()}')"),
            repl("import os\nos._exit(1)"),
            repl("import os\nFINAL(f'{context} pid={os.getpid()}')"),
        ],
        spy,
    )
    result = await rlm.acompletion("the context survives")
    assert result.response.startswith("the context survives pid=")
    told = feedback(rlm, 2)
    assert "EnvironmentCrashed: the REPL process exited with code 1" in told
    assert "variables your code made are lost" in told
    crashed = list(result.graph.records(NodeKind.REPL_BLOCK))[1]
    assert crashed.status == NodeStatus.ERROR and crashed.error_type == "EnvironmentCrashed"
    assert spy.envs[0].restarts == 1
    first, replacement = spy.envs[0].guest_pids
    assert first != replacement
    assert not alive(first) and not alive(replacement)


async def test_what_the_guest_writes_to_stderr_fills_no_disk_and_its_end_is_quoted(
    spy: Spy,
) -> None:
    """A guest's stderr is kept in memory, its last 64 KiB: 30 MB written there put
    nothing on the engine's disk, and a crash still quotes its last words."""

    def disk() -> int:  # a custom tool: runs in the engine, sees the guest's folders
        root = spy.envs[0]._root
        return sum(
            os.path.getsize(os.path.join(folder, name))
            for folder, _, names in os.walk(root)
            for name in names
        )

    flood = "import os\nfor _ in range(30):\n    os.write(2, b'e' * 2**20)\n"
    rlm = engine(
        [
            repl(flood + "print('on disk', disk())"),
            repl("import os\nos.write(2, b'LAST WORDS\\n')\nos._exit(1)"),
            repl("FINAL('done')"),
        ],
        spy,
        custom_tools={"disk": disk},
    )
    result = await rlm.acompletion("ctx")
    assert result.response == "done"
    on_disk = int(feedback(rlm, 1).split("on disk ")[1].split()[0])
    assert on_disk < 2**20
    assert "LAST WORDS" in feedback(rlm, 2)


async def test_the_guest_works_in_its_own_directory_which_is_removed_after(spy: Spy) -> None:
    code = (
        "import os\n"
        "open('notes.txt', 'w').write('kept')\n"
        "FINAL(os.getcwd() + '|' + str(os.path.exists(os.path.join(os.getcwd(), 'notes.txt'))))"
    )
    rlm = engine([repl(code)], spy)
    result = await rlm.acompletion("ctx")
    env = spy.envs[0]
    assert result.response == f"{env.workdir}|True"
    assert env.workdir != os.getcwd()
    assert not os.path.exists(env.workdir)


async def test_the_guest_has_no_network_where_the_platform_allows(spy: Spy) -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        code = (
            "import socket\n"
            "try:\n"
            f"    socket.create_connection(('127.0.0.1', {port}), timeout=2).close()\n"
            "    FINAL('connected')\n"
            "except OSError as exc:\n"
            "    FINAL(f'refused: {exc}')"
        )
        rlm = engine([repl(code)], spy)
        result = await rlm.acompletion("ctx")
    env = spy.envs[0]
    if not env.network_isolated:
        assert env.isolation_report.endswith("host network")
        pytest.skip(env.isolation_report)
    assert result.response.startswith("refused"), result.response
    assert env.isolation_report.endswith("network isolated")


async def test_cancelling_a_block_kills_the_guest_promptly(spy: Spy) -> None:
    rlm = engine(
        [
            repl("import os\nprint(f'pid={os.getpid()}')"),
            repl("answer['content'] = 'half done'\nwhile True:\n    pass"),
        ],
        spy,
        max_timeout=4,  # a cold guest on a loaded machine starts within it
    )
    result = await rlm.acompletion("ctx")
    assert result.stop_reason == "max_timeout"
    assert result.response == "half done"  # asked of the guest before it was killed
    assert not alive(spy.envs[0].guest_pids[0])
    assert not os.path.exists(spy.envs[0].workdir)


async def test_close_kills_what_the_block_spawned_also_outside_its_group(spy: Spy) -> None:
    marker = f"{os.getpid() % 1000}.4242"  # a sleep no other test starts
    code = (
        "import subprocess\n"
        f"subprocess.Popen(['sleep', '6{marker}'])\n"
        f"subprocess.Popen(['sleep', '7{marker}'], start_new_session=True)\n"
        f"subprocess.Popen(['setsid', 'sh', '-c', '(sleep 8{marker} &) ; sleep 9{marker}'])\n"
        "import time; time.sleep(0.3)\n"
        "FINAL('spawned')"
    )
    rlm = engine([repl(code)], spy)
    result = await rlm.acompletion("ctx")
    assert result.response == "spawned"
    if not spy.envs[0].isolation.pid_namespace:
        pytest.skip(f"no PID namespace here ({spy.envs[0].isolation_report})")
    deadline = time.monotonic() + 2
    while processes_running(marker) and time.monotonic() < deadline:
        await trio.sleep(0.05)
    assert processes_running(marker) == []


# -- the protocol ----------------------------------------------------------------------


async def test_tools_as_functions_code_and_data_and_stray_output() -> None:
    calls: list[tuple[int, int]] = []

    def add(a: int, b: int) -> int:
        calls.append((a, b))
        return a + b

    code = (
        "import os\n"
        "os.write(1, b'not protocol\\n')\n"  # fd 1 of the guest is not the pipe
        "print('printed')\n"
        "FINAL(f'{add(1, 2)}|{double(4)}|{limits[\"n\"]}|{greeting}')"
    )
    rlm = engine(
        [repl(code)],
        custom_tools={
            "add": {"tool": add, "description": "adds two numbers"},
            "double": "def double(x):\n    return 2 * x",
            "limits": {"n": 3},
            "greeting": "hello there",
        },
    )
    result = await rlm.acompletion("ctx")
    assert result.response == "3|8|3|hello there"
    assert calls == [(1, 2)]


async def test_a_tools_arguments_must_be_json_and_its_errors_keep_their_type() -> None:
    """As in the local environment: a set or NaN is not changed on its way (it is a
    TypeError saying why), and a tool's ValueError is a ValueError in the block."""
    seen: list[Any] = []

    def check(value: Any) -> Any:
        seen.append(value)
        if value == "bad":
            raise ValueError("bad value")
        return value

    code = (
        "out = []\n"
        "for value in ({1, 2}, float('nan'), b'raw', 'bad'):\n"
        "    try:\n"
        "        check(value)\n"
        "    except Exception as exc:\n"
        "        out.append(type(exc).__name__)\n"
        "FINAL(' '.join(out) + ' ' + str(check([1, 'two'])))"
    )
    rlm = engine([repl(code)], custom_tools={"check": check})
    result = await rlm.acompletion("ctx")
    assert result.response == "TypeError TypeError TypeError ValueError [1, 'two']"
    assert seen == ["bad", [1, "two"]]  # nothing changed reached the tool


async def test_threads_in_a_block_call_the_engine_concurrently() -> None:
    code = (
        "import threading\n"
        "out = [None] * 4\n"
        "def ask(i):\n"
        "    out[i] = llm_query(f'q{i}')\n"
        "threads = [threading.Thread(target=ask, args=(i,)) for i in range(4)]\n"
        "[t.start() for t in threads]\n"
        "[t.join() for t in threads]\n"
        "FINAL('|'.join(out))"
    )
    # Each call takes 2 s: a loaded machine may start the guest's four threads up to a
    # few tenths of a second apart, and all four are still in flight together.
    rlm = engine([repl(code)], backend_kwargs={"latency": 2.0})
    result = await rlm.acompletion("ctx")
    assert result.response == "sub:q0|sub:q1|sub:q2|sub:q3"
    assert scripted(rlm).peak_in_flight == 4
    calls = list(result.graph.records(NodeKind.LLM_CALL))
    assert len(calls) == 4 and max(c.start for c in calls) < min(c.end for c in calls)  # type: ignore[type-var]


async def test_depth_2_sub_calls_from_guests_respect_the_provider_limit(spy: Spy) -> None:
    def respond(request: ChatRequest) -> str:
        if not is_root_turn(request):
            return f"sub:{request.prompt}"
        if turn_number(request) > 1:
            return repl("FINAL('no answer')")
        if request.depth == 0:
            return repl(
                "r = rlm_query_batched([f'part {i}' for i in range(6)])\nFINAL('|'.join(r))"
            )
        return repl("r = llm_query_batched([context + f' q{i}' for i in range(8)])\nFINAL(r[-1])")

    rlm = RLM(
        "scripted",
        {"respond": respond, "latency": 0.02, "max_concurrent": 3},
        environment="subprocess-spy",
        plugins=[spy],
        max_depth=2,
        max_concurrent_subcalls=3,
    )
    result = await rlm.acompletion("ctx")
    assert result.response == "|".join(f"sub:part {i} q7" for i in range(6))
    assert scripted(rlm).peak_in_flight == 3
    assert len(list(result.graph.records(NodeKind.LLM_CALL))) == 6 * 8
    assert len(spy.envs) == 7  # the root's guest and one per child
    assert all(not os.path.exists(env.workdir) for env in spy.envs)


async def test_a_100_mb_context_reaches_the_guest_once(spy: Spy) -> None:
    context = "0123456789" * 10_000_000
    rlm = engine(
        [
            repl("print(len(context))"),
            repl("print(context[-3:])"),
            repl("FINAL(str(context.count('9')))"),
        ],
        spy,
    )
    result = await rlm.acompletion(context)
    assert result.response == str(10_000_000)
    assert "100000000" in feedback(rlm, 1)
    env = spy.envs[0]
    assert env.context_writes == 1
    assert env.bytes_sent < 20_000  # three blocks and a file name, not 100 MB per block


async def test_a_persistent_session_keeps_one_guest_across_completions(spy: Spy) -> None:
    def root(request: ChatRequest) -> str:
        if "context_1" in request.messages[1].content:
            return repl("FINAL(f'{kept}+{context_1}+{history_0[0][\"role\"]}')")
        return repl("kept = context\nFINAL('first')")

    rlm = engine(root, spy, persistent=True)
    async with rlm:
        assert (await rlm.acompletion("a")).response == "first"
        assert (await rlm.acompletion("b")).response == "a+b+system"
        pid = spy.envs[0].pid
        assert pid is not None and alive(pid)
    assert not alive(pid)


async def test_a_block_past_its_cpu_seconds_is_stopped_and_the_guest_kept() -> None:
    rlm = engine(
        [repl("kept = 1\nwhile True:\n    pass"), repl("FINAL(f'kept={kept}')")],
        environment_kwargs={"cpu_seconds": 0.5},
    )
    result = await rlm.acompletion("ctx")
    assert result.response == "kept=1"
    assert "CPULimitExceeded: the block used more CPU time than its limit" in feedback(rlm, 1)


async def test_a_cpu_stop_inside_the_answers_text_is_the_blocks_error() -> None:
    """Taking a partial answer's text runs the model's __str__ in the block: a CPU stop
    landing there is reported, not swallowed into the answer's placeholder."""
    endless = "class E:\n    def __str__(self):\n        while True:\n            pass\n"
    rlm = engine(
        [
            repl(endless + "answer['content'] = E()\nprint('set')"),
            repl("answer['content'] = ''\nFINAL('x')"),
        ],
        environment_kwargs={"cpu_seconds": 1},
    )
    result = await rlm.acompletion("ctx")
    assert result.response == "x"
    assert "CPULimitExceeded" in feedback(rlm, 1)


async def test_lone_surrogates_cross_the_pipe_without_ending_the_run_or_the_guest() -> None:
    """Text with a lone surrogate (a server's JSON ``\\udcff``, bytes decoded with
    surrogateescape) has no UTF-8: a sub-call's reply, a printed line and a block's code
    holding one cross as U+FFFD, a text context keeps it, and the guest keeps its
    variables (it died, and the run with it)."""
    rlm = engine(
        [
            repl(
                "kept = 41\nsaid = llm_query('q')\nprint('bad byte: ' + b'\\xff'.decode('utf-8', 'surrogateescape'))"
            ),
            repl("# a comment holding \udcff\nFINAL(f'{kept + 1} {len(context)} {said!r}')"),
        ],
        sub=lambda request: "reply \ud800 end",
    )
    result = await rlm.acompletion("doc \udcff")
    assert result.response == "42 5 'reply \ufffd end'"
    assert "bad byte: \ufffd" in feedback(rlm, 2)
