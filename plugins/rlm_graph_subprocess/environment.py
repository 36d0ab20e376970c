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
    - The guest runs behind the strongest `isolation` plan the machine accepts (its own
      PID namespace and ``/proc``; uid 65534 when the engine is root). Its working
      folder is then its own, and the folder of contexts readable by its group only;
      with a private ``/tmp``, the working folder lives on that tmpfs (capped with it,
      gone with the guest) and the engine's copy of it stays empty.
    - A block whose guest keeps using CPU past ``cpu_seconds`` (plus `_CPU_GRACE`) is
      killed by the engine, whatever the block's code catches; so is a guest that uses
      as much while the engine waits on a data request, or that does not answer one
      within `_request_seconds`: every wait on the guest is bounded.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import trio
from pydantic import ValidationError

from rlm_graph import scratch
from rlm_graph.contracts import ExecResult, Message, SubcallBridge, image_json_default
from rlm_graph.errors import ConfigError, EnvironmentCrashed
from rlm_graph.repl.clip import clip_error, clipped_result

from .boundaries import GuestLimits, guest_environ
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
from .isolation import Isolation, choose_isolation
from .notes import (
    OUT_OF_STEP,
    REQUEST_CANCELLED,
    cpu_killed,
    cpu_while_waiting,
    describe_exit,
    died_on_request,
    idle_killed,
    message_too_large,
    restarted,
    unanswered,
    with_note,
)
from .process import MAX_UNREAD_BYTES, GuestDied, GuestProcess, MessageTooLarge, Room
from .tools import error_reply, require_json, split_tools

__all__ = ["SubprocessEnvironment"]

_SALVAGE_SECONDS = 0.25
_PRIVATE_TMP = ("/tmp", "/var/tmp", "/dev/shm")
# CPU seconds past cpu_seconds before the engine kills the guest: the guest's own soft
# limit (whole seconds, signalled once a second) gets to stop the block politely first.
_CPU_GRACE = 2.0
_CPU_POLL = 0.2


class SubprocessEnvironment:
    """A REPL in a child process: killable, resource-limited, without secrets.

    Args:
        bridge: the scheduler's side of the sub-calls.
        tools: custom tools and data, ``{name: (value, description)}``: callables stay in
            this process (the guest gets proxies), source strings that define their own
            name are run in the guest, anything else must be JSON-able data.
        depth: the depth of the completion it serves.
        output_cap: the most characters of printed output kept per block.
        subcalls: ``False`` leaves ``llm_query``, ``llm_query_batched``, ``rlm_query`` and
            ``rlm_query_batched`` out of the guest's REPL, and the engine refuses such a
            request should a guest send one anyway (the "no sub-calls" ablation).
        **limits: the boundaries (see `GuestLimits`): ``timeout``, ``memory_limit_mb``,
            ``cpu_seconds``, ``max_open_files``, ``max_file_size_mb``, ``network``,
            ``env``, ``start_timeout``, ``close_grace``.

    Attributes:
        workdir: the guest's working directory (also ``SCRATCH_DIR``, ``HOME``, ``TMPDIR``).
        isolation: the plan the guest runs under (known after `start`).
        network_isolated: whether the guest runs without network (known after `start`).
        isolation_report: a sentence saying how the guest is kept apart.
        guest_pids: the process id of every guest started, in order.
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
        subcalls: bool = True,
        **limits: Any,
    ) -> None:
        self.check_kwargs(output_cap=output_cap, subcalls=subcalls)
        self.bridge = bridge
        self.subcalls = subcalls
        self.depth = depth
        self.limits = GuestLimits.from_kwargs(limits)
        self._tools = split_tools(tools or {})
        self.output_cap = output_cap
        self._root = scratch.make_folder(f"subprocess-d{depth}")
        self.workdir = os.path.join(self._root, "work")
        self._io = os.path.join(self._root, "io")
        os.mkdir(self.workdir)
        os.mkdir(self._io)
        self.isolation = Isolation()
        self.network_isolated = False
        self.isolation_report = "not started"
        self.guest_pids: list[int] = []
        self.restarts = 0
        self.context_writes = 0
        self._sent_by_dead = 0
        self._guest: GuestProcess | None = None
        self._replay: dict[tuple[str, object], Any] = {}
        self._answer = ""
        self._note: str | None = None  # for the next block: why its state was lost
        self._closed = False

    @classmethod
    def check_kwargs(
        cls, output_cap: int = 1_000_000, subcalls: bool = True, **limits: Any
    ) -> None:
        """Validate ``environment_kwargs`` without starting anything (called when an
        `RLM` is configured).

        Raises:
            ConfigError: an unknown keyword or a bad value.
        """
        if not isinstance(output_cap, int) or output_cap < 1:
            raise ConfigError("subprocess environment: output_cap must be a positive int")
        if not isinstance(subcalls, bool):
            raise ConfigError("subprocess environment: subcalls must be True or False")
        GuestLimits.from_kwargs(limits)

    # -- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        self.isolation = await choose_isolation(self.limits.network)
        self.network_isolated = self.isolation.network
        self.isolation_report = self.isolation.describe()
        if self.isolation.drops_to is not None:
            _hand_over(self._root, self.workdir, self._io, self.isolation.drops_to)
        await self._ensure_guest()

    async def aclose(self) -> None:
        self._closed = True
        guest, self._guest = self._guest, None
        try:
            if guest is not None:
                await guest.aclose(self.limits.close_grace)
                self._sent_by_dead += guest.bytes_sent
        finally:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(scratch.remove, self._root)

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
        if self._guest is not None and self._guest.killed_idle:
            await self._replace_guest()
            self._note = idle_killed(self.limits.cpu_seconds or 0.0)
        if self._guest is None:
            self._guest = await self._spawn()
            for message in list(self._replay.values()):
                await self._request(self._guest, message, again=False)
        return self._guest

    async def _spawn(self) -> GuestProcess:
        init = Init(
            scratch_dir=self.workdir,
            output_cap=self.output_cap,
            subcalls=self.subcalls,
            cpu_seconds=self.limits.cpu_seconds,
            max_message=self._max_message(),
            data_tools=self._tools.data,
            code_tools=self._tools.code,
            proxy_tools=self._tools.proxies,
        )
        plan = self.isolation
        tmp = "/tmp" if plan.private_tmp else None
        guest = await GuestProcess.start(
            prefix=plan.command(
                self._root, self.workdir, self.limits.tmp_options(), self.limits.read_paths
            ),
            rlimits={**self.limits.rlimits(plan.private_tmp), "sandbox": self._sandbox()},
            env=guest_environ(self.workdir, self.limits.env, tmp=tmp),
            cwd=self.workdir,
            init=init,
            start_timeout=self.limits.start_timeout,
            forks=plan.forks,
            max_message=self._max_message(),
            idle_cpu=self.limits.cpu_seconds,
        )
        if guest.guest_pid is not None:
            self.guest_pids.append(guest.guest_pid)
        return guest

    def _sandbox(self) -> dict[str, Any]:
        """The guest's Landlock ruleset (see `landlock.apply`): it writes its working
        folder and private ``/tmp``, reads its contexts and the user's ``read_paths``."""
        plan = self.isolation
        return {
            "abi": plan.landlock,
            "write": [self.workdir, *(_PRIVATE_TMP if plan.private_tmp else ())],
            "read": [self._io, *self.limits.read_paths],
            "proc": plan.pid_namespace,
            "deny_tcp": self.limits.network and not plan.network,
        }

    def _max_message(self) -> int:
        """``max_message_mb``, but never below what a block's result may hold: its
        printed output and errors (``output_cap`` characters each, up to 6 bytes per
        character in JSON) and some room besides."""
        return max(int(self.limits.max_message_mb * 1024 * 1024), 14 * self.output_cap)

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
            # A lone surrogate (not a character) is kept as the guest reads it back.
            with open(path, "w", encoding="utf-8", errors="surrogatepass") as handle:
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
        if self.isolation.drops_to is not None:
            _readable_by_group(path, self.isolation.drops_to)
        self.context_writes += 1
        return path, fmt

    async def add_history(self, messages: Sequence[Message], index: int) -> None:
        history = [m.model_dump() for m in messages]
        await self._remember(("history", index), AddHistory(index=index, messages=history))

    async def set_variable(self, name: str, value: Any) -> None:
        require_json(f"the value of {name!r}", value)
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

    async def _request(self, guest: GuestProcess, message: Any, *, again: bool = True) -> None:
        """Send one data request and check its answer. A guest that dies meanwhile, that
        answers out of step (a line the guest's code wrote to the engine's pipe, a forged
        ``done`` and what followed it, still there), or that does not answer within
        `_request_seconds` or its CPU limit (a block's code stopped its reader, or left
        processes burning CPU) is killed: a fresh one gets the data again, and the model
        is told on its next block. A fresh guest that fails so is the engine's error."""
        answer = await self._exchange(guest, message)
        if isinstance(answer, Ok):
            return
        if isinstance(answer, Failed):
            raise EnvironmentCrashed(
                f"the subprocess REPL could not load {type(message).__name__}: "
                + clip_error(answer.error)
            )
        log = guest.log_tail() if isinstance(answer, GuestDied) else ""
        await self._replace_guest()
        note = _missed(answer, type(message).__name__)
        if not again:  # a fresh guest, which has run no model code
            raise EnvironmentCrashed(
                f"the subprocess REPL failed {type(message).__name__} as it started: {note}"
                + (f"; its log says: {log}" if log else "")
                + ". A large context may need a higher memory_limit_mb, start_timeout or "
                "cpu_seconds"
            )
        self._note = note
        fresh = await self._ensure_guest()  # the remembered data, sent again
        if not any(sent is message for sent in self._replay.values()):
            await self._request(fresh, message, again=False)

    async def _exchange(self, guest: GuestProcess, message: Any) -> Any:
        """``message`` sent and the guest's answer: a message (``None`` for a garbled
        line), a `GuestDied`, or `_Unanswered` past `_request_seconds` or the CPU limit.
        A request cancelled from outside leaves the guest out of step: it is killed."""
        seconds = self._request_seconds()
        watchdog = _CpuWatchdog(guest, self.limits.cpu_seconds)
        answer: Any = _Unanswered(unanswered(type(message).__name__, seconds))
        try:
            with guest.busy(), trio.move_on_after(seconds) as deadline:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(watchdog.watch, nursery.cancel_scope)
                    answer = await _send_and_receive(guest, message, deadline)
                    nursery.cancel_scope.cancel()
        except BaseException:
            with trio.CancelScope(shield=True):
                await self._replace_guest()
            self._note = REQUEST_CANCELLED
            raise
        if watchdog.fired:
            return _Unanswered(cpu_while_waiting(self.limits.cpu_seconds or 0.0))
        return answer

    def _request_seconds(self) -> float:
        """How long the guest may take to answer a data request (and more for a large
        one: `GuestProcess.send`): ``timeout``, at least ``start_timeout``."""
        return max(self.limits.timeout or 0.0, self.limits.start_timeout)

    # -- blocks -------------------------------------------------------------------------

    async def execute(self, code: str) -> ExecResult:
        guest = await self._ensure_guest()
        note, self._note = self._note, None
        with guest.busy():
            return await self._execute(guest, code, note)

    async def _execute(self, guest: GuestProcess, code: str, note: str | None) -> ExecResult:
        timeout = self.limits.timeout if self.limits.timeout is not None else math.inf
        watchdog = _CpuWatchdog(guest, self.limits.cpu_seconds)
        finished: ExecResult | GuestDied | None = None
        try:
            with trio.move_on_after(timeout):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(watchdog.watch, nursery.cancel_scope)
                    finished = await self._run_block(guest, code)
                    nursery.cancel_scope.cancel()
        except BaseException:  # cancelled: the run's deadline, or the caller's
            with trio.CancelScope(shield=True):
                await self._salvage(guest)
                await self._replace_guest()
            self._note = "[the previous block was cancelled and the REPL process killed]"
            raise
        if isinstance(finished, GuestDied):
            return await self._crashed(guest, finished)
        if finished is not None:
            return with_note(finished, note)
        with trio.CancelScope(shield=True):
            await self._salvage(guest)
            await self._replace_guest()
        if watchdog.fired:
            return cpu_killed(self.limits.cpu_seconds or 0.0, self._answer)
        seconds = f"{self.limits.timeout:g}"
        return ExecResult(
            stderr=f"TimeoutError: the block ran longer than {seconds} s; its process was killed\n",
            error=f"TimeoutError: block exceeded {seconds} s",
            timed_out=True,
            restarted=True,
            answer_content=self._answer,
        )

    async def _run_block(self, guest: GuestProcess, code: str) -> ExecResult | GuestDied:
        """Send the block, serve its sub-calls, return its result (or how the guest died)."""
        async with trio.open_nursery() as nursery:
            result = await self._read_block(guest, code, nursery)
            nursery.cancel_scope.cancel()  # calls the guest's threads left waiting on
        if not isinstance(result, GuestDied):
            self._answer = result.answer_content
        return result

    async def _read_block(
        self, guest: GuestProcess, code: str, nursery: trio.Nursery
    ) -> ExecResult | GuestDied:
        # GuestDied is returned here, not raised through the nursery, which would wrap it
        # in an exception group.
        room = Room()
        try:
            await guest.send(Execute(code=code))
            while True:
                message, size = await guest.receive_weighed()
                if isinstance(message, Subcall | ToolCall):
                    # Backpressure, not buffering: nothing more is read from the guest
                    # while its calls in flight fill the room (prompts, bytes).
                    prompts = len(message.request.prompts) if isinstance(message, Subcall) else 1
                    await room.take(prompts, size)
                    nursery.start_soon(self._serve, guest, message, room, (prompts, size))
                elif isinstance(message, Done):  # as sent: a forged one too, clipped
                    return clipped_result(ExecResult(**message.result), self.output_cap)
                else:  # a guest out of step with the protocol is as good as dead
                    return GuestDied(f"the guest sent {type(message).__name__} mid-block")
        except GuestDied as exc:
            return exc
        except (ValidationError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            return GuestDied(f"{type(exc).__name__}")  # a garbled message: as bad as dead

    async def _serve(
        self, guest: GuestProcess, call: Subcall | ToolCall, room: Room, weight: tuple[int, int]
    ) -> None:
        try:
            value = await self._dispatch(call)
            require_json("a tool's result", value)
            reply = Reply(id=call.id, value=value)
        except trio.Cancelled:
            raise
        except Exception as exc:  # noqa: BLE001 - a user's tool may raise anything; the model sees it
            reply = error_reply(call.id, exc)
        finally:
            room.give(*weight)
        try:
            try:
                await guest.send(reply)
            except (ValueError, RecursionError) as exc:  # a value no JSON line carries
                await guest.send(error_reply(call.id, exc))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the guest died; the block's reader reports it

    async def _dispatch(self, call: Subcall | ToolCall) -> Any:
        if isinstance(call, ToolCall):
            return await self.bridge.call_tool(call.name, call.args, call.kwargs)
        if not self.subcalls:  # the guest has no such function: its code wrote to the pipe
            raise PermissionError(
                f"{call.request.fn} is not available in this REPL (subcalls=False)"
            )
        return await self.bridge.call(call.request)

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
            except (GuestDied, ValidationError, trio.BrokenResourceError, trio.ClosedResourceError):
                return  # half a line left by a cut block, or worse: the answer kept is kept

    async def _crashed(self, guest: GuestProcess, died: GuestDied) -> ExecResult:
        if isinstance(died, MessageTooLarge):
            await self._replace_guest()
            return message_too_large(died.limit / (1024 * 1024), self._answer, died.heavy)
        code = await guest.exit_code()
        log = guest.log_tail()
        await self._replace_guest()
        how = describe_exit(code)
        if guest.left_unread:
            how = (
                f"was killed: it left more than {MAX_UNREAD_BYTES // 2**20} MB of the "
                "engine's replies unread (its code stopped the REPL's own reader?)"
            )
        said = f"EnvironmentCrashed: the REPL process {how} while running this block"
        if log:
            said += f"\n[its last words]\n{log}"
        return restarted(said, f"EnvironmentCrashed: the REPL process {how}", self._answer)


class _CpuWatchdog:
    """The engine's hard CPU stop: kills the block when the guest's CPU time since the
    block began passes ``cpu_seconds`` + `_CPU_GRACE`, whatever the block's code catches.

    Polling, not a deadline: CPU time is not on trio's clock. A guest whose pid the
    engine could not learn is not watched (its soft limit still holds).
    """

    def __init__(self, guest: GuestProcess, cpu_seconds: float | None) -> None:
        self.guest = guest
        self.limit = cpu_seconds
        self.fired = False

    async def watch(self, block: trio.CancelScope) -> None:
        last = self.guest.cpu_seconds()
        if self.limit is None or last is None:
            return
        # Growth summed sample by sample: a child that exits unreaped (SIGCHLD ignored)
        # takes its CPU time out of the tree's total, which must not give it back.
        spent = 0.0
        while True:
            await trio.sleep(_CPU_POLL)
            used = self.guest.cpu_seconds()
            if used is None:
                continue
            spent, last = spent + max(0.0, used - last), used
            if spent > self.limit + _CPU_GRACE:
                self.fired = True
                block.cancel()
                return


class _Unanswered:
    """No answer to a request in time (or within the CPU limit): what the model is told."""

    __slots__ = ("note",)

    def __init__(self, note: str) -> None:
        self.note = note


async def _send_and_receive(
    guest: GuestProcess, message: Any, deadline: trio.CancelScope | None = None
) -> Any:
    """``message`` sent, and the guest's next message (``None`` for a garbled line, a
    `GuestDied` if it is gone): returned, never raised through the request's nursery."""
    try:
        await guest.send(message, deadline)
        return await guest.receive()
    except ValidationError:
        return None
    except GuestDied as exc:
        return exc
    except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
        return GuestDied(type(exc).__name__)


def _missed(answer: Any, request: str) -> str:
    """What the model is told of a request its guest failed (``answer``: not ``ok``)."""
    if isinstance(answer, _Unanswered):
        return answer.note
    if isinstance(answer, GuestDied):
        return died_on_request(request)
    return OUT_OF_STEP


def _hand_over(root: str, workdir: str, io: str, uid: int) -> None:
    """Let an unprivileged guest use its folders: the working folder becomes its own;
    the folder of contexts and logs stays the engine's (the guest cannot plant a link
    there for the engine to write through), readable by the guest's group."""
    os.chmod(root, 0o711)
    os.chown(workdir, uid, uid)
    os.chown(io, -1, uid)
    os.chmod(io, 0o750)


def _readable_by_group(path: str, gid: int) -> None:
    os.chown(path, -1, gid)
    os.chmod(path, 0o640)
