"""The guest program of the ``subprocess`` environment, and the wire it speaks.

The engine starts this file as ``python -P guest.py '<limits as JSON>'`` in a child
process (one per environment, reused across blocks) and talks to it in line-delimited
JSON: one message per line, each a frozen pydantic model of this module.

    engine -> guest (stdin):   init, execute, load_context, add_history, set_variable,
                               reset_answer, answer_content, reply
    guest -> engine (stdout):  ready, done, ok, failed, answer, subcall, tool_call

Invariants:
    - The guest's stdout carries the protocol and nothing else: file descriptor 1 is moved
      aside at start and pointed at stderr, so a stray ``print`` from a model's thread, a
      C library or a grandchild process can never corrupt a message. Model prints are
      captured per block by `ReplSession`.
    - Every request of the engine gets exactly one answer, in order, except ``reply``
      (which answers the guest's own ``subcall``/``tool_call``) and ``execute``, whose
      answer (``done``) may come after any number of ``subcall``/``tool_call`` messages.
      Those carry ids, so several threads of one block may wait on the engine at once.
    - Blocks run on the main thread (so a ``SIGXCPU`` handler can stop them); a reader
      thread handles every other request, so the engine can ask for ``answer_content``
      and deliver replies while a block runs.
    - End of input means the engine is gone: the guest exits at once, whatever runs
      (with the ``os._exit`` bound before model code ran). The engine's watcher kills
      a guest that does not (its code held its own input open): `rlm_graph_subprocess.reaper`.
    - Resource limits are applied before the first request is read, and the hard limits
      equal the soft ones (model code cannot raise them), except the CPU limit, which is
      a per-block soft limit: past it the block gets `CPULimitExceeded`, a
      ``BaseException`` that ``except Exception`` does not catch. The hard stop is the
      engine's: it watches the guest's CPU time and kills a guest whose block goes on
      past the limit (an unprivileged process cannot raise a hard ``RLIMIT_CPU`` again for
      the next block, so a per-block hard rlimit cannot live here).
    - ``no_new_privs`` is set at start: nothing the guest runs gains privileges (setuid
      programs, file capabilities).

Only the pure layer of rlm-graph is imported here (`rlm_graph.repl`, `rlm_graph.contracts`):
no trio, no httpx, no opentelemetry.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import queue
import resource
import signal
import sys
import threading
from collections.abc import Callable, Mapping
from typing import IO, TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from rlm_graph.contracts import SubcallRequest
from rlm_graph.repl import LimitStop
from rlm_graph.repl.crossing import (
    MessageTooLarge,
    json_arguments,
    pipe_line,
    pipe_weight,
    raised_as,
)

if TYPE_CHECKING:
    from rlm_graph.contracts import ExecResult
    from rlm_graph.repl import ReplSession

__all__ = [
    "AddHistory",
    "Answer",
    "AnswerContent",
    "Done",
    "Execute",
    "Failed",
    "GuestMessage",
    "HostMessage",
    "Init",
    "LoadContext",
    "Ok",
    "Ready",
    "Reply",
    "ResetAnswer",
    "SetVariable",
    "Subcall",
    "ToolCall",
    "apply_limits",
    "main",
]

_WIRE = ConfigDict(frozen=True, extra="forbid")

# -- engine -> guest ------------------------------------------------------------------


class Init(BaseModel):
    """The first message: build the REPL session.

    ``data_tools`` are values (JSON), ``code_tools`` Python source exec'd in the guest
    (each must define its own name), ``proxy_tools`` names of callables that stay in the
    engine's process and are reached through ``tool_call``.
    """

    model_config = _WIRE
    op: Literal["init"] = "init"
    scratch_dir: str
    output_cap: int = 1_000_000
    subcalls: bool = True
    cpu_seconds: float | None = None
    max_message: int | None = None
    data_tools: dict[str, Any] = Field(default_factory=dict)
    code_tools: dict[str, str] = Field(default_factory=dict)
    proxy_tools: dict[str, str | None] = Field(default_factory=dict)


class Execute(BaseModel):
    model_config = _WIRE
    op: Literal["execute"] = "execute"
    code: str


class LoadContext(BaseModel):
    """Load ``context_{index}`` from a file the engine wrote: raw text, or JSON."""

    model_config = _WIRE
    op: Literal["load_context"] = "load_context"
    index: int
    path: str
    format: Literal["text", "json"]


class AddHistory(BaseModel):
    model_config = _WIRE
    op: Literal["add_history"] = "add_history"
    index: int
    messages: list[dict[str, str]]


class SetVariable(BaseModel):
    model_config = _WIRE
    op: Literal["set_variable"] = "set_variable"
    name: str
    value: Any


class ResetAnswer(BaseModel):
    model_config = _WIRE
    op: Literal["reset_answer"] = "reset_answer"


class AnswerContent(BaseModel):
    model_config = _WIRE
    op: Literal["answer_content"] = "answer_content"


class Reply(BaseModel):
    """The engine's answer to a ``subcall`` or ``tool_call``: a value, or an error text."""

    model_config = _WIRE
    op: Literal["reply"] = "reply"
    id: int
    value: Any = None
    error: str | None = None


HostMessage = Annotated[
    Init | Execute | LoadContext | AddHistory | SetVariable | ResetAnswer | AnswerContent | Reply,
    Field(discriminator="op"),
]

# -- guest -> engine ------------------------------------------------------------------


class Ready(BaseModel):
    model_config = _WIRE
    type: Literal["ready"] = "ready"
    pid: int
    cwd: str


class Done(BaseModel):
    """A block finished; ``result`` holds the fields of an `ExecResult`."""

    model_config = _WIRE
    type: Literal["done"] = "done"
    result: dict[str, Any]


class Ok(BaseModel):
    model_config = _WIRE
    type: Literal["ok"] = "ok"


class Failed(BaseModel):
    model_config = _WIRE
    type: Literal["failed"] = "failed"
    error: str


class Answer(BaseModel):
    model_config = _WIRE
    type: Literal["answer"] = "answer"
    content: str


class Subcall(BaseModel):
    """``llm_query`` and friends, to be served by the engine's scheduler: the one
    `SubcallRequest` every environment hands over, with the id its reply will carry."""

    model_config = _WIRE
    type: Literal["subcall"] = "subcall"
    id: int
    request: SubcallRequest


class ToolCall(BaseModel):
    """A call of a custom tool that lives in the engine's process."""

    model_config = _WIRE
    type: Literal["tool_call"] = "tool_call"
    id: int
    name: str
    args: list[Any] = Field(default_factory=list)
    kwargs: dict[str, Any] = Field(default_factory=dict)


GuestMessage = Annotated[
    Ready | Done | Ok | Failed | Answer | Subcall | ToolCall, Field(discriminator="type")
]

_HOST = TypeAdapter(HostMessage)

# -- limits ---------------------------------------------------------------------------

_MB = 1024 * 1024


def apply_limits(limits: Mapping[str, Any]) -> None:
    """Set this process's resource limits (soft = hard, so code cannot raise them).

    Args:
        limits: ``memory_limit_mb`` (address space), ``max_open_files``,
            ``max_file_size_mb``, ``max_processes``; a missing or ``None`` entry leaves
            that limit alone.
            Core dumps are always off.
    """
    table = (
        ("memory_limit_mb", resource.RLIMIT_AS, _MB),
        ("max_open_files", resource.RLIMIT_NOFILE, 1),
        ("max_file_size_mb", resource.RLIMIT_FSIZE, _MB),
        ("max_processes", resource.RLIMIT_NPROC, 1),
    )
    for key, which, unit in table:
        value = limits.get(key)
        if value is not None:
            amount = int(value * unit)
            resource.setrlimit(which, (amount, amount))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    # A write past the file-size limit should fail with an OSError the model can read,
    # not kill the REPL.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)


class CPULimitExceeded(LimitStop):
    """Raised in a block that used more CPU seconds than ``cpu_seconds``.

    A ``BaseException`` (`rlm_graph.repl.LimitStop`): ``except Exception`` in model code
    does not catch it, and the engine kills a guest that keeps running regardless.
    """


_in_block = threading.Event()


def _on_sigxcpu(signum: int, frame: object) -> None:
    if _in_block.is_set():
        raise CPULimitExceeded("the block used more CPU time than its limit (cpu_seconds)")


def _arm_cpu_limit(seconds: float | None) -> None:
    """Allow the coming block ``seconds`` of CPU time from now (a soft limit)."""
    if seconds is None:
        return
    usage = resource.getrusage(resource.RUSAGE_SELF)
    soft = math.ceil(usage.ru_utime + usage.ru_stime + seconds)
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))
    _in_block.set()


def _disarm_cpu_limit() -> None:
    """Between blocks the process may use CPU (loading a context) without limit."""
    _in_block.clear()
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    resource.setrlimit(resource.RLIMIT_CPU, (hard, hard))


# -- the guest ------------------------------------------------------------------------


class _Waiter:
    """One sub-call in flight: the block's thread waits on ``event``."""

    __slots__ = ("error", "event", "value")

    def __init__(self) -> None:
        self.event = threading.Event()
        self.value: Any = None
        self.error: str | None = None


class _Protocol:
    """The guest's end of the pipe: writes messages, matches replies to waiters."""

    def __init__(self, out: IO[bytes]) -> None:
        self._out = out
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._waiters: dict[int, _Waiter] = {}
        self.block_running = False
        self.max_message: int | None = None  # the engine's cap (`Init`), bytes

    def encode(self, message: BaseModel) -> bytes:
        """``message`` as its line on the pipe; `MessageTooLarge` past the engine's cap
        (its bytes and its values, as the engine weighs it: `pipe_weight`), which would
        kill this guest and lose the REPL's state."""
        line = pipe_line(message)
        if self.max_message is not None:
            weight = pipe_weight(line, self.max_message)
            if weight > self.max_message:
                raise MessageTooLarge(weight, self.max_message)
        return line

    def send(self, message: BaseModel) -> None:
        self.write(self.encode(message))

    def write(self, line: bytes) -> None:
        with self._lock:
            self._out.write(line)
            self._out.flush()

    def call(self, make: Any) -> Any:
        """Send ``make(id)`` (a ``subcall``/``tool_call``) and wait for its reply."""
        if not self.block_running:
            raise RuntimeError("llm_query and custom tools can only be called while a block runs")
        waiter = _Waiter()
        with self._lock:
            call_id = next(self._ids)
        line = self.encode(make(call_id))  # too large: the call's error, in the block
        with self._lock:
            self._waiters[call_id] = waiter
        self.write(line)
        waiter.event.wait()
        if waiter.error is not None:
            raise raised_as(waiter.error)
        return waiter.value

    def deliver(self, reply: Reply) -> None:
        with self._lock:
            waiter = self._waiters.pop(reply.id, None)
        if waiter is not None:  # a reply for a call whose block already ended
            waiter.value, waiter.error = reply.value, reply.error
            waiter.event.set()

    def fail_waiting(self, reason: str) -> None:
        """Release threads a finished block left waiting on the engine."""
        with self._lock:
            waiters, self._waiters = self._waiters, {}
        for waiter in waiters.values():
            waiter.error = reason
            waiter.event.set()


class _PipeCaller:
    """`SubcallCaller` that sends each call up the pipe and blocks for the reply."""

    def __init__(self, protocol: _Protocol) -> None:
        self.protocol = protocol

    def call(self, request: SubcallRequest) -> Any:
        return self.protocol.call(lambda i: Subcall(id=i, request=request))

    def call_tool(self, name: str, args: list[Any], kwargs: dict[str, Any]) -> Any:
        return self.protocol.call(lambda i: ToolCall(id=i, name=name, args=args, kwargs=kwargs))


def _proxy(caller: _PipeCaller, name: str, description: str | None) -> Any:
    def tool(*args: Any, **kwargs: Any) -> Any:
        json_arguments(name, args, kwargs)
        return caller.call_tool(name, list(args), kwargs)

    tool.__name__ = tool.__qualname__ = name
    tool.__doc__ = description or f"The custom tool {name!r} (runs in the engine's process)."
    return tool


class Guest:
    """The REPL session and the loop that serves the engine's requests."""

    def __init__(self, protocol: _Protocol) -> None:
        self.protocol = protocol
        self.session: ReplSession | None = None
        self.cpu_seconds: float | None = None
        self.blocks: queue.Queue[Execute] = queue.Queue()

    # -- the reader thread ---------------------------------------------------------------

    def read(self, stdin: IO[bytes], _exit: Callable[[int], Any] = os._exit) -> None:
        """Serve requests until the engine closes the pipe, then exit the process (with
        the ``os._exit`` there was before model code ran: code that replaces it does not
        keep the guest alive past its engine this way)."""
        try:
            for line in stdin:
                self.handle(_HOST.validate_json(line))
        finally:
            _exit(0)

    def handle(self, message: Any) -> None:
        if isinstance(message, Execute):
            self.blocks.put(message)
        elif isinstance(message, Reply):
            self.protocol.deliver(message)
        elif isinstance(message, AnswerContent):
            content = self.session.answer_content() if self.session is not None else ""
            try:
                self.protocol.send(Answer(content=content))
            except MessageTooLarge as exc:
                self.protocol.send(Answer(content=f"[answer['content'] not sent: {exc}]"))
        else:
            self.protocol.send(self._apply(message))

    def _apply(self, message: Any) -> BaseModel:
        try:
            if isinstance(message, Init):
                self._init(message)
                return Ready(pid=os.getpid(), cwd=os.getcwd())
            session = self._session()
            if isinstance(message, LoadContext):
                session.add_context(_load(message), message.index)
            elif isinstance(message, AddHistory):
                session.add_history(message.messages, message.index)
            elif isinstance(message, SetVariable):
                session.set_variable(message.name, message.value)
            elif isinstance(message, ResetAnswer):
                session.reset_answer()
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - reported to the engine
            return Failed(error=f"{type(exc).__name__}: {exc}")
        return Ok()

    def _session(self) -> ReplSession:
        if self.session is None:
            raise RuntimeError("the guest got a request before init")
        return self.session

    def _init(self, init: Init) -> None:
        from rlm_graph.repl import ReplSession

        caller = _PipeCaller(self.protocol)
        tools: dict[str, tuple[Any, str | None]] = {
            name: (value, None) for name, value in init.data_tools.items()
        }
        for name, description in init.proxy_tools.items():
            tools[name] = (_proxy(caller, name, description), description)
        session = ReplSession(
            caller,
            scratch_dir=init.scratch_dir,
            tools=tools,
            output_cap=init.output_cap,
            subcalls=init.subcalls,
        )
        for name, code in init.code_tools.items():
            # Each tool's code runs in its own copy of the namespace, so its helpers and
            # imports do not show up among the model's variables.
            scope = dict(session.ns)
            exec(compile(code, f"<tool {name}>", "exec"), scope)  # noqa: S102 - the user's tool
            session.tools[name] = (scope[name], None)
            session.ns[name] = scope[name]
        self.cpu_seconds = init.cpu_seconds
        self.protocol.max_message = init.max_message
        self.session = session

    # -- the main thread -----------------------------------------------------------------

    def run_blocks(self) -> None:
        """Run blocks on the main thread, one at a time, as the reader queues them."""
        while True:
            block = self.blocks.get()
            session = self._session()
            self.protocol.block_running = True
            try:
                _arm_cpu_limit(self.cpu_seconds)
                result = _execute(session, block.code)
            finally:
                _disarm_cpu_limit()
                self.protocol.block_running = False
                self.protocol.fail_waiting("the block ended before this call returned")
            try:
                self.protocol.write(self._done(result))
            except MemoryError:
                sys.stderr.write("guest: out of memory while reporting a block; exiting\n")
                os._exit(3)

    def _done(self, result: ExecResult) -> bytes:
        """A block's result as its line on the pipe; one over the engine's cap (a final
        answer or an ``answer["content"]`` of megabytes) goes without them, the block
        failed saying why, rather than killing the guest with the REPL's state."""
        try:
            return self.protocol.encode(Done(result=result.model_dump()))
        except MessageTooLarge as exc:
            said = f"the block's answer was not sent: {exc}"
            smaller = result.model_copy(
                update={
                    "final_answer": None,
                    "final_json": None,
                    "answer_content": f"[{said}]",
                    "error": f"MessageTooLarge: {said}",
                    "stderr": result.stderr + f"MessageTooLarge: {said}\n",
                }
            )
            return self.protocol.encode(Done(result=smaller.model_dump()))


def _execute(session: ReplSession, code: str) -> ExecResult:
    """Run a block; a CPU stop that lands outside the model's code still makes a result."""
    try:
        return session.execute(code)
    except CPULimitExceeded as exc:
        from rlm_graph.contracts import ExecResult

        return ExecResult(stderr=f"CPULimitExceeded: {exc}\n", error=f"CPULimitExceeded: {exc}")


def _load(message: LoadContext) -> Any:
    from rlm_graph.contracts import image_json_hook

    # surrogatepass: a text context's lone surrogates arrive as the engine had them
    with open(message.path, encoding="utf-8", errors="surrogatepass") as handle:
        if message.format == "json":
            return json.load(handle, object_hook=image_json_hook)
        return handle.read()


def _take_stdout() -> IO[bytes]:
    """The protocol's own copy of stdout; fd 1 then points at stderr for everyone else."""
    sys.stdout.flush()
    protocol_fd = os.dup(1)
    os.dup2(2, 1)
    return os.fdopen(protocol_fd, "wb", buffering=1024 * 1024)


def _take_stdin() -> IO[bytes]:
    """The protocol's own copy of stdin; fd 0 then reads nothing, so model code that
    reads stdin gets end-of-file instead of the engine's messages."""
    protocol_fd = os.dup(0)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    sys.stdin = open(os.devnull, encoding="utf-8")  # noqa: SIM115 - lives as long as the process
    return os.fdopen(protocol_fd, "rb")


def _restrict(sandbox: Mapping[str, Any]) -> None:
    """``no_new_privs``, then the engine's Landlock ruleset, if any (``landlock.py`` beside
    this file, loaded by path: importing the plugin's package would import trio)."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "landlock.py")
    spec = importlib.util.spec_from_file_location("rlm_graph_guest_landlock", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.apply(sandbox)


def main(argv: list[str] | None = None) -> int:
    """Run the guest: limits and its Landlock ruleset first, then serve the engine on
    stdin/stdout."""
    args = sys.argv[1:] if argv is None else argv
    limits = json.loads(args[0]) if args else {}
    apply_limits(limits)
    signal.signal(signal.SIGXCPU, _on_sigxcpu)
    out = _take_stdout()
    protocol_in = _take_stdin()
    _restrict(limits.get("sandbox") or {})
    guest = Guest(_Protocol(out))
    reader = threading.Thread(target=guest.read, args=(protocol_in,), daemon=True)
    reader.start()
    guest.run_blocks()
    return 0  # pragma: no cover - run_blocks only ends with the process


if __name__ == "__main__":
    sys.exit(main())
