"""The ``subprocess`` environment: the REPL in a child Python process, behind boundaries.

One guest process (``guest.py``) per environment, reused across blocks. The engine's side
of every ``llm_query``/``rlm_query``/tool call is served here, on the trio side, through
the completion's bridge, so the tree-wide limits and the provider limiter hold for code
in the guest exactly as for code in the ``local`` environment.

Invariants:
    - What the engine gave the REPL (contexts, histories, variables, tools) is kept as a
      replay log; a fresh guest (after a timeout, a crash or a cancelled block) gets all
      of it again, and only what the model's code made is lost. The model is told so in
      the block's output (``restarted=True``).
    - A context reaches the guest once, as a file in the environment's private folder
      that the guest reads; a restart re-reads the file, it is never re-sent per block.
    - A block that is cut (its ``timeout``, or cancellation of the run) kills the guest's
      process group at once: nothing the block started outlives it. `aclose` is bounded
      in time and removes the working directory.
    - Sub-calls of a block run as tasks of a nursery the block holds open; the block's
      end cancels any the guest left behind.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import trio
from pydantic import ValidationError

from rlm_graph.contracts import ExecResult, Message, SubcallBridge, image_json_default
from rlm_graph.errors import ConfigError, EnvironmentCrashed

from .boundaries import GuestLimits, guest_environ, probe_network_isolation
from .guest import (
    AddHistory,
    Answer,
    AnswerContent,
    Done,
    Execute,
    Failed,
    Init,
    LoadContext,
    Ok,
    Reply,
    ResetAnswer,
    SetVariable,
    Subcall,
    ToolCall,
)
from .process import GuestDied, GuestProcess
from .tools import split_tools

__all__ = ["SubprocessEnvironment"]

_SALVAGE_SECONDS = 0.25
_LOST = (
    "[the REPL process was restarted: variables your code made are lost; context, "
    "history and custom tools are loaded again]"
)


class SubprocessEnvironment:
    """A REPL in a child process: killable, resource-limited, without secrets.

    Args:
        bridge: the scheduler's side of the sub-calls.
        tools: custom tools and data, ``{name: (value, description)}``: callables stay in
            this process (the guest gets proxies), source strings that define their own
            name are run in the guest, anything else must be JSON-able data.
        depth: the depth of the completion it serves.
        output_cap: the most characters of printed output kept per block.
        **limits: the boundaries (see `GuestLimits`): ``timeout``, ``memory_limit_mb``,
            ``cpu_seconds``, ``max_open_files``, ``max_file_size_mb``, ``network``,
            ``env``, ``start_timeout``, ``close_grace``.

    Attributes:
        workdir: the guest's working directory (also ``SCRATCH_DIR``, ``HOME``, ``TMPDIR``).
        network_isolated: whether the guest runs without network (known after `start`).
        isolation_report: a sentence saying how, or why not ("network isolation
            unavailable: ...").
        restarts: how many guests were replaced.
        context_writes: how many context files were written.
        bytes_sent: bytes written to guests' stdin, over every guest.

    Raises:
        ConfigError: an unknown keyword, a bad limit, a tool that cannot cross the pipe.
    """

    def __init__(
        self,
        *,
        bridge: SubcallBridge,
        tools: Mapping[str, tuple[Any, str | None]] | None = None,
        depth: int = 0,
        output_cap: int = 1_000_000,
        **limits: Any,
    ) -> None:
        self.bridge = bridge
        self.depth = depth
        self.limits = GuestLimits.from_kwargs(limits)
        self._tools = split_tools(tools or {})
        self.output_cap = output_cap
        self._root = tempfile.mkdtemp(prefix=f"rlm-graph-subprocess-d{depth}-")
        self.workdir = os.path.join(self._root, "work")
        self._io = os.path.join(self._root, "io")
        os.mkdir(self.workdir)
        os.mkdir(self._io)
        self.network_isolated = False
        self.isolation_report = "not started"
        self.restarts = 0
        self.context_writes = 0
        self._sent_by_dead = 0
        self._guest: GuestProcess | None = None
        self._replay: dict[tuple[str, object], Any] = {}
        self._answer = ""
        self._lost_state = False
        self._closed = False

    @classmethod
    def check_kwargs(cls, output_cap: int = 1_000_000, **limits: Any) -> None:
        """Validate ``environment_kwargs`` without starting anything (called when an
        `RLM` is configured).

        Raises:
            ConfigError: an unknown keyword or a bad value.
        """
        if not isinstance(output_cap, int) or output_cap < 1:
            raise ConfigError("subprocess environment: output_cap must be a positive int")
        GuestLimits.from_kwargs(limits)

    # -- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        network = await probe_network_isolation() if self.limits.network else None
        if network is not None:
            self.network_isolated = network.isolated
            self.isolation_report = network.report
        else:
            self.isolation_report = "network isolation off (network=False)"
        await self._ensure_guest()

    async def aclose(self) -> None:
        self._closed = True
        guest, self._guest = self._guest, None
        try:
            if guest is not None:
                await guest.aclose(self.limits.close_grace)
                self._sent_by_dead += guest.bytes_sent
        finally:
            shutil.rmtree(self._root, ignore_errors=True)

    @property
    def bytes_sent(self) -> int:
        return self._sent_by_dead + (self._guest.bytes_sent if self._guest else 0)

    @property
    def pid(self) -> int | None:
        """The current guest's process id (``None`` between guests)."""
        return self._guest.pid if self._guest is not None else None

    async def _ensure_guest(self) -> GuestProcess:
        if self._closed:
            raise EnvironmentCrashed("this subprocess environment is closed; make a new one")
        if self._guest is None:
            self._guest = await self._spawn()
            for message in list(self._replay.values()):
                await self._request(self._guest, message)
        return self._guest

    async def _spawn(self) -> GuestProcess:
        network = await probe_network_isolation() if self.limits.network else None
        prefix = network.prefix if network is not None else ()
        init = Init(
            scratch_dir=self.workdir,
            output_cap=self.output_cap,
            cpu_seconds=self.limits.cpu_seconds,
            data_tools=self._tools.data,
            code_tools=self._tools.code,
            proxy_tools=self._tools.proxies,
        )
        return await GuestProcess.start(
            prefix=prefix,
            rlimits=self.limits.rlimits(),
            env=guest_environ(self.workdir, self.limits.env),
            cwd=self.workdir,
            log_path=os.path.join(self._io, "guest.log"),
            init=init,
            start_timeout=self.limits.start_timeout,
        )

    async def _replace_guest(self) -> None:
        """Kill the current guest (if any); the next request starts a fresh one."""
        guest, self._guest = self._guest, None
        if guest is not None:
            with trio.CancelScope(shield=True):
                await guest.kill()
            self._sent_by_dead += guest.bytes_sent
            self.restarts += 1

    # -- data in ------------------------------------------------------------------------

    async def add_context(self, value: Any, index: int) -> None:
        path, fmt = await trio.to_thread.run_sync(self._write_context, value, index)
        await self._remember(("context", index), LoadContext(index=index, path=path, format=fmt))

    def _write_context(self, value: Any, index: int) -> tuple[str, Literal["text", "json"]]:
        if isinstance(value, str):
            path = os.path.join(self._io, f"context_{index}.txt")
            with open(path, "w", encoding="utf-8") as handle:
                handle.write(value)
            fmt: Literal["text", "json"] = "text"
        else:
            path = os.path.join(self._io, f"context_{index}.json")
            try:
                with open(path, "w", encoding="utf-8") as handle:
                    json.dump(value, handle, default=image_json_default)
            except (TypeError, ValueError) as exc:
                raise ConfigError(
                    f"subprocess environment: context_{index} cannot be sent to the guest "
                    f"as JSON ({exc}); pass str, or lists and dicts of JSON values"
                ) from None
            fmt = "json"
        self.context_writes += 1
        return path, fmt

    async def add_history(self, messages: Sequence[Message], index: int) -> None:
        history = [m.model_dump() for m in messages]
        await self._remember(("history", index), AddHistory(index=index, messages=history))

    async def set_variable(self, name: str, value: Any) -> None:
        _require_json(f"the value of {name!r}", value)
        await self._remember(("variable", name), SetVariable(name=name, value=value))

    async def reset_answer(self) -> None:
        self._answer = ""
        await self._request(await self._ensure_guest(), ResetAnswer())

    async def answer_content(self) -> str:
        return self._answer

    async def _remember(self, key: tuple[str, object], message: Any) -> None:
        self._replay.pop(key, None)
        self._replay[key] = message
        await self._request(await self._ensure_guest(), message)

    async def _request(self, guest: GuestProcess, message: Any) -> None:
        """Send one data request and check its answer."""
        try:
            await guest.send(message)
            answer = await guest.receive()
        except (GuestDied, trio.BrokenResourceError, trio.ClosedResourceError):
            log = guest.log_tail()
            await self._replace_guest()
            raise EnvironmentCrashed(
                f"the subprocess REPL died while loading data ({type(message).__name__}); "
                f"its log says: {log or '(nothing)'}. A large context may need a higher "
                "memory_limit_mb"
            ) from None
        if isinstance(answer, Failed):
            raise EnvironmentCrashed(
                f"the subprocess REPL could not load {type(message).__name__}: {answer.error}"
            )
        if not isinstance(answer, Ok):
            raise EnvironmentCrashed(f"the subprocess REPL answered {answer!r} out of turn")

    # -- blocks -------------------------------------------------------------------------

    async def execute(self, code: str) -> ExecResult:
        lost, self._lost_state = self._lost_state, False
        guest = await self._ensure_guest()
        timeout = self.limits.timeout if self.limits.timeout is not None else math.inf
        try:
            with trio.move_on_after(timeout):
                result = await self._run_block(guest, code)
                return _with_note(result, lost)
        except GuestDied:
            return await self._crashed(guest)
        except BaseException:  # cancelled: the run's deadline, or the caller's
            with trio.CancelScope(shield=True):
                await self._salvage(guest)
                await self._replace_guest()
            self._lost_state = True
            raise
        with trio.CancelScope(shield=True):
            await self._salvage(guest)
            await self._replace_guest()
        seconds = f"{self.limits.timeout:g}"
        return ExecResult(
            stderr=f"TimeoutError: the block ran longer than {seconds} s; its process was killed\n",
            error=f"TimeoutError: block exceeded {seconds} s",
            timed_out=True,
            restarted=True,
            answer_content=self._answer,
        )

    async def _run_block(self, guest: GuestProcess, code: str) -> ExecResult:
        """Send the block, serve its sub-calls, return its result.

        Raises:
            GuestDied: the guest's output ended before the block's result came.
        """
        async with trio.open_nursery() as nursery:
            result = await self._read_block(guest, code, nursery)
            nursery.cancel_scope.cancel()  # calls the guest's threads left waiting on
        if result is None:
            raise GuestDied("the guest died mid-block")
        self._answer = result.answer_content
        return result

    async def _read_block(
        self, guest: GuestProcess, code: str, nursery: trio.Nursery
    ) -> ExecResult | None:
        # GuestDied is turned into None here, not raised through the nursery, which would
        # wrap it in an exception group.
        try:
            await guest.send(Execute(code=code))
            while True:
                message = await guest.receive()
                if isinstance(message, Subcall | ToolCall):
                    nursery.start_soon(self._serve, guest, message)
                elif isinstance(message, Done):
                    return ExecResult(**message.result)
                else:
                    return None  # a guest out of step with the protocol is as good as dead
        except (GuestDied, ValidationError, trio.BrokenResourceError, trio.ClosedResourceError):
            return None  # a garbled message is as bad as a dead guest

    async def _serve(self, guest: GuestProcess, call: Subcall | ToolCall) -> None:
        try:
            value = await self._dispatch(call)
            _require_json("a tool's result", value)
            reply = Reply(id=call.id, value=value)
        except trio.Cancelled:
            raise
        except Exception as exc:  # noqa: BLE001 - a user's tool may raise anything; the model sees it
            reply = Reply(id=call.id, error=f"{type(exc).__name__}: {exc}")
        try:
            await guest.send(reply)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the guest died; the block's reader reports it

    async def _dispatch(self, call: Subcall | ToolCall) -> Any:
        if isinstance(call, ToolCall):
            return await self.bridge.call_tool(call.name, call.args, call.kwargs)
        if call.fn == "llm_query":
            return await self.bridge.llm_query(call.prompt or "", call.model, call.json_schema)
        if call.fn == "rlm_query":
            return await self.bridge.rlm_query(_text(call.prompt), call.model)
        if call.fn == "llm_query_batched":
            return await self.bridge.llm_query_batched(
                call.prompts or [], call.model, call.json_schema
            )
        return await self.bridge.rlm_query_batched(
            [_text(p) for p in call.prompts or []], call.model
        )

    async def _salvage(self, guest: GuestProcess) -> None:
        """Ask a guest about to be killed for ``answer["content"]``, briefly."""
        if guest.exited:
            return
        with trio.move_on_after(_SALVAGE_SECONDS):
            try:
                await guest.send(AnswerContent())
                while True:
                    message = await guest.receive()
                    if isinstance(message, Answer):
                        self._answer = message.content or self._answer
                        return
            except (GuestDied, trio.BrokenResourceError, trio.ClosedResourceError):
                return

    async def _crashed(self, guest: GuestProcess) -> ExecResult:
        code = await guest.exit_code()
        log = guest.log_tail()
        await self._replace_guest()
        how = _describe_exit(code)
        stderr = f"EnvironmentCrashed: the REPL process {how} while running this block\n"
        if log:
            stderr += f"[its last words]\n{log}\n"
        return ExecResult(
            stderr=stderr + _LOST + "\n",
            error=f"EnvironmentCrashed: the REPL process {how}",
            restarted=True,
            answer_content=self._answer,
        )


def _text(prompt: object) -> str:
    """A child RLM's prompt: text only (its context; images go through ``llm_query``)."""
    if prompt is None:
        return ""
    if not isinstance(prompt, str):
        raise TypeError("rlm_query takes text prompts only; send images with llm_query")
    return prompt


def _with_note(result: ExecResult, lost: bool) -> ExecResult:
    if not lost:
        return result
    note = "[the previous block was cancelled and the REPL process killed]\n" + _LOST + "\n"
    return result.model_copy(update={"stderr": note + result.stderr, "restarted": True})


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "stopped answering"
    if code < 0:
        return f"was killed by signal {-code}"
    return f"exited with code {code}"


def _require_json(what: str, value: Any) -> None:
    try:
        json.dumps(value)
    except (TypeError, ValueError) as exc:
        raise ConfigError(
            f"subprocess environment: {what} cannot cross to the guest as JSON ({exc}); "
            "use str, numbers, lists and dicts"
        ) from None
