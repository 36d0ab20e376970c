"""The REPL's namespace and block execution: the guest side of the protocol.

Pure Python (no trio): the local environment runs it in worker threads of the engine's
process, and the subprocess environment runs it in a child process. Both hand it a
`SubcallCaller`, the blocking door back to the scheduler.

Invariants:
    - Model code never changes process-wide state on the engine's behalf: no ``chdir``,
      no ``sys.stdout`` swap per block (see `capture`), no environment variables. Each
      session has a scratch folder, and relative paths resolve in it for ``open`` and for
      the ``os``, ``os.path``, ``pathlib``, ``shutil`` and ``glob`` the REPL's
      ``__import__`` hands out (see `paths`).
    - The protocol's names (``llm_query``..., ``answer``, ``context``) are restored after
      every block, so a model that overwrites one cannot break the next block.
    - A session made with ``subcalls=False`` has no `SUBCALL_NAMES` at all (the paper's
      "REPL, no sub-calls" ablation): code that calls one gets a ``NameError``.
    - Errors in model code are data: the traceback goes to the block's stderr and the
      block's ``error``; only `BlockInterrupted` (cancellation) propagates.
    - Once `ReplSession.stop_thread` named a thread, every ``except`` handler and
      ``finally`` body of the model's code raises `BlockInterrupted` on entry in that
      thread: ``except BaseException: continue`` cannot keep a stopped block alive. (Each
      handler of the model's code starts with a call of ``__rlm_stop_check__``.) A `LimitStop`
      (a limit the environment enforces inside the block) is reported like an error.
"""

from __future__ import annotations

import builtins
import json
import os
import sys
import threading
import traceback
import types
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from ..contracts import ExecResult, Image, SubcallFunction, SubcallRequest, WirePrompt
from ..errors import ConfigError, SchemaMismatch
from ..protocol.schema import AnswerSchema, to_jsonable
from . import compiled
from .capture import CappedBuffer, capture_output
from .clip import clip_error
from .compiled import REPL_FILENAME, STOP_CHECK
from .paths import scratch_import

__all__ = [
    "REPL_FILENAME",
    "RESERVED_NAMES",
    "SUBCALL_NAMES",
    "BlockInterrupted",
    "LimitStop",
    "ReplSession",
    "SubcallCaller",
    "WirePrompt",
]

RESERVED_NAMES = (
    "llm_query",
    "llm_query_batched",
    "rlm_query",
    "rlm_query_batched",
    "SHOW_VARS",
    "FINAL",
    "FINAL_VAR",
    "answer",
    "context",
    "SCRATCH_DIR",
)

SUBCALL_NAMES = ("llm_query", "llm_query_batched", "rlm_query", "rlm_query_batched")
"""The protocol's doors to other models; absent from a session made with ``subcalls=False``."""

_REPL_MODULE = "__repl__"
_FILENAME = REPL_FILENAME


class BlockInterrupted(BaseException):
    """Raised inside a block's thread to stop it (timeout or cancellation).

    A ``BaseException``, so that model code's ``except Exception`` cannot swallow it.
    """


class LimitStop(BaseException):
    """Raised inside a block by the environment when the block passed one of its limits.

    A ``BaseException``, so that model code's ``except Exception`` cannot swallow it; the
    session reports it as the block's error. Code that catches even ``BaseException`` can
    delay it, which is why every environment that raises it also has a stop the code
    cannot see (the subprocess environment kills its guest).
    """


class SubcallCaller(Protocol):
    """The blocking door back to the engine: one `SubcallRequest` in, its answer out
    (text, or the validated JSON value with a schema; a list for the batched functions;
    a failure is an ``"[ERROR] ..."`` string, never an exception)."""

    def call(self, request: SubcallRequest) -> Any: ...


class _Answer(dict[str, Any]):
    """The ``answer`` dict: ``answer["content"]`` and ``answer["ready"]``."""

    def __init__(self) -> None:
        super().__init__(content="", ready=False)

    def __repr__(self) -> str:
        return f"answer(content={self.get('content')!r}, ready={self.get('ready')!r})"


def _check_prompt(name: str, prompt: object) -> str:
    if not isinstance(prompt, str):
        raise TypeError(f"{name}() takes the prompt as a str, got {type(prompt).__name__}")
    return prompt


def _check_prompts(name: str, prompts: object) -> list[str]:
    if isinstance(prompts, str) or not isinstance(prompts, Sequence):
        raise TypeError(f"{name}() takes a list of str prompts, got {type(prompts).__name__}")
    for i, prompt in enumerate(prompts):
        if not isinstance(prompt, str):
            raise TypeError(f"{name}(): prompt {i} is a {type(prompt).__name__}, not a str")
    return list(prompts)


def _image_part(where: str, index: int, item: object, scratch_dir: str) -> dict[str, str]:
    try:
        if isinstance(item, Image):
            image = item
        elif isinstance(item, bytes | bytearray | memoryview):
            image = Image.from_bytes(bytes(item))
        elif isinstance(item, os.PathLike):
            path = os.fspath(item)
            image = Image.from_path(
                path if os.path.isabs(path) else os.path.join(scratch_dir, path)
            )
        elif isinstance(item, dict) and "role" in item and "content" in item:
            raise TypeError(
                f"{where}: part {index} is a chat message; a prompt is text (or text and "
                "images), not a list of messages: pass the text, e.g. "
                "'\\n\\n'.join(m['content'] for m in messages)"
            )
        else:
            raise TypeError(
                f"{where}: part {index} is a {type(item).__name__}; parts are str "
                "(text), image bytes, a pathlib.Path to an image file, or an Image"
            )
    except (OSError, ValueError) as exc:
        raise ValueError(f"{where}: part {index}: {exc}") from None
    return {"media_type": image.media_type, "data": image.base64()}


def _wire_prompt(where: str, prompt: object, scratch_dir: str) -> WirePrompt:
    """A prompt checked and made ready for the engine: text as is, a list of text and
    images (bytes, paths relative to the scratch folder, `Image` values) as parts.
    ``where`` names it in errors (``"llm_query() prompt"``)."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list | tuple):
        return [
            part if isinstance(part, str) else _image_part(where, index, part, scratch_dir)
            for index, part in enumerate(prompt)
        ]
    raise TypeError(
        f"{where} must be a str, or a list of str and images, not {type(prompt).__name__}"
    )


def _wire_prompts(name: str, prompts: object, scratch_dir: str) -> list[WirePrompt]:
    if isinstance(prompts, str) or not isinstance(prompts, Sequence):
        raise TypeError(f"{name}() takes a list of prompts, got {type(prompts).__name__}")
    return [_wire_prompt(f"{name}() prompt {i}", p, scratch_dir) for i, p in enumerate(prompts)]


def _request(
    fn: SubcallFunction,
    prompts: Sequence[WirePrompt],
    model: Any,
    shape: AnswerSchema | None = None,
) -> SubcallRequest:
    """The one value a call of model code becomes (what every environment hands over).

    Raises:
        TypeError: ``model`` is not a model name.
    """
    if model is not None and not isinstance(model, str):
        raise TypeError(f"{fn}(model=...) takes a model name (a str), got {type(model).__name__}")
    schema = shape.json_schema if shape is not None else None
    return SubcallRequest(fn=fn, prompts=tuple(prompts), model=model, json_schema=schema)


def _shape(name: str, schema: Any) -> AnswerSchema:
    """The schema a model's code passed, as a JSON Schema for the engine (which checks a
    JSON Schema dict itself)."""
    try:
        return AnswerSchema(schema, check=False)
    except ConfigError as exc:
        raise TypeError(f"{name}(schema=...): {exc}") from None


def _typed(shape: AnswerSchema, answer: Any) -> Any:
    """The engine's validated JSON answer as the type the code asked for: an instance of
    its pydantic model or dataclass (built here, where the class lives), or JSON data for
    a JSON Schema dict. A failed call stays its ``"[ERROR] ..."`` string."""
    if not shape.typed or (isinstance(answer, str) and answer.startswith("[ERROR]")):
        return answer
    try:
        return shape.validate(answer)
    except SchemaMismatch as exc:  # the class's own validators may refuse what JSON allowed
        return f"[ERROR] SchemaMismatch: {exc}"


class ReplSession:
    """One REPL namespace and the protocol functions in it.

    Args:
        caller: the door to the scheduler for sub-calls.
        scratch_dir: this session's own folder; relative paths given to ``open`` land here.
        tools: custom tools and data, ``{name: (value, description)}``.
        output_cap: most characters of printed output kept per block.
        subcalls: put ``llm_query``, ``llm_query_batched``, ``rlm_query`` and
            ``rlm_query_batched`` in the namespace (default); ``False`` leaves them out,
            so the model's code can reach no other model.
    """

    def __init__(
        self,
        caller: SubcallCaller,
        *,
        scratch_dir: str,
        tools: Mapping[str, tuple[Any, str | None]] | None = None,
        output_cap: int = 1_000_000,
        subcalls: bool = True,
    ) -> None:
        self.caller = caller
        self.scratch_dir = scratch_dir
        self.output_cap = output_cap
        self.tools = dict(tools or {})
        self._final: str | None = None
        self._final_value: Any = None
        self._answer_text: tuple[object, str] = ("", "")
        self._contexts: list[str] = []
        self.answer = _Answer()
        self._stopped: set[int] = set()
        # Classes defined by REPL code say they come from module ``__repl__``; dataclasses,
        # typing and enum look that module up in sys.modules and crash when it is missing.
        # One shared, empty stand-in is enough for them (it holds no session's state).
        if _REPL_MODULE not in sys.modules:
            sys.modules[_REPL_MODULE] = types.ModuleType(_REPL_MODULE, "classes of REPL code")
        self.ns: dict[str, Any] = {"__name__": _REPL_MODULE, "__builtins__": self._builtins()}
        self._protocol = self._protocol_names()
        if not subcalls:
            for name in SUBCALL_NAMES:
                del self._protocol[name]
        self.ns.update(self._protocol)
        for name, (value, _) in self.tools.items():
            self.ns[name] = value

    # -- the namespace ------------------------------------------------------------------

    def _builtins(self) -> dict[str, Any]:
        table = dict(vars(builtins))
        real_open = builtins.open
        scratch = self.scratch_dir

        def open(file: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: A001
            if isinstance(file, str | os.PathLike) and not os.path.isabs(file):
                file = os.path.join(scratch, os.fspath(file))
            return real_open(file, *args, **kwargs)

        def input(prompt: object = "") -> str:  # noqa: A001
            raise EOFError(
                "input() is not available in the REPL: nobody is there to answer; "
                "use the context, llm_query() or the variables you have"
            )

        stopped = self._stopped

        def stop_check() -> None:
            if threading.get_ident() in stopped:
                raise BlockInterrupted("the block was stopped")

        table["open"] = open
        table["input"] = input
        table["__import__"] = scratch_import(scratch)
        table[STOP_CHECK] = stop_check
        return table

    def stop_thread(self, thread_id: int) -> None:
        """Make every handler of the model's code raise `BlockInterrupted` in that thread."""
        self._stopped.add(thread_id)

    def forget_thread(self, thread_id: int) -> None:
        """The thread left the block: code it runs next is not stopped."""
        self._stopped.discard(thread_id)

    def _raise_if_stopped(self, exc: BaseException) -> None:
        """Raise ``exc`` again if it is the environment stopping this thread's block: a
        `BlockInterrupted` after `stop_thread`. One the model's code raised itself (it
        can import the class) is the block's error, as anything it raises is."""
        if isinstance(exc, BlockInterrupted) and threading.get_ident() in self._stopped:
            raise exc

    def _protocol_names(self) -> dict[str, Any]:
        caller = self.caller

        def llm_query(prompt: Any, model: str | None = None, schema: Any = None) -> Any:
            checked = _wire_prompt("llm_query() prompt", prompt, self.scratch_dir)
            if schema is None:
                return caller.call(_request("llm_query", [checked], model))
            shape = _shape("llm_query", schema)
            return _typed(shape, caller.call(_request("llm_query", [checked], model, shape)))

        def llm_query_batched(
            prompts: Sequence[str], model: str | None = None, schema: Any = None
        ) -> list[Any]:
            checked = _wire_prompts("llm_query_batched", prompts, self.scratch_dir)
            if schema is None:
                return list(caller.call(_request("llm_query_batched", checked, model)))
            shape = _shape("llm_query_batched", schema)
            answers = caller.call(_request("llm_query_batched", checked, model, shape))
            return [_typed(shape, answer) for answer in answers]

        def rlm_query(prompt: str, model: str | None = None) -> str:
            checked = _check_prompt("rlm_query", prompt)
            return str(caller.call(_request("rlm_query", [checked], model)))

        def rlm_query_batched(prompts: Sequence[str], model: str | None = None) -> list[str]:
            checked = _check_prompts("rlm_query_batched", prompts)
            return list(caller.call(_request("rlm_query_batched", checked, model)))

        for function in (llm_query, llm_query_batched, rlm_query, rlm_query_batched):
            function.__qualname__ = function.__name__  # what a TypeError calls it
        return {
            "llm_query": llm_query,
            "llm_query_batched": llm_query_batched,
            "rlm_query": rlm_query,
            "rlm_query_batched": rlm_query_batched,
            "SHOW_VARS": self.show_vars,
            "FINAL": self.final,
            "FINAL_VAR": self.final_var,
            "answer": self.answer,
            "SCRATCH_DIR": self.scratch_dir,
        }

    def show_vars(self) -> str:
        """``SHOW_VARS()``: the variables the model made, with their types."""
        hidden = set(self._protocol) | set(self.tools)
        found = {
            name: type(value).__name__
            for name, value in self.ns.items()
            if not name.startswith("_")
            and name not in hidden
            and not isinstance(value, types.ModuleType)
        }
        if not found:
            return "No variables yet. Create some in a ```repl block."
        return "Variables: " + ", ".join(f"{name}: {kind}" for name, kind in found.items())

    def final(self, value: Any) -> str:
        """``FINAL(value)``: finish with ``str(value)`` (and the value itself, as JSON, for a
        typed completion)."""
        self._final = str(value)
        self._final_value = value
        return self._final

    def final_var(self, name: Any) -> str:
        """``FINAL_VAR("name")``: finish with the value of a variable (or with a value)."""
        if not isinstance(name, str):
            return self.final(name)
        key = name.strip().strip("\"'")
        if key in self._protocol and key != "answer":
            return f"FINAL_VAR: {key!r} is the REPL's own, not your variable; call FINAL(value)"
        if key not in self.ns:
            known = ", ".join(
                k for k in self.ns if not k.startswith("_") and k not in self._protocol
            )
            return (
                f"FINAL_VAR: there is no variable {key!r} (variables: {known or 'none'}); "
                "create it first, or call FINAL(value)"
            )
        value = self.ns[key]
        if key == "answer" and value is self.answer:  # the protocol's dict: its content
            value = self.answer.get("content", "")
        return self.final(value)

    # -- data in ------------------------------------------------------------------------

    def set_variable(self, name: str, value: Any) -> None:
        self.ns[name] = value

    def add_context(self, value: Any, index: int) -> None:
        self.ns[f"context_{index}"] = value
        if index == 0:
            self.ns["context"] = value

    def add_history(self, messages: list[dict[str, str]], index: int) -> None:
        self.ns[f"history_{index}"] = messages
        if index == 0 and "history" not in self.tools:
            self.ns["history"] = messages  # the whole first history, not a compaction's

    def reset_answer(self) -> None:
        self.answer.clear()
        self.answer.update(content="", ready=False)
        self._final = None
        self._final_value = None

    def close(self) -> None:
        """Empty the namespace once no block will run again.

        The namespace holds the protocol's functions, which hold the session: a reference
        cycle that only Python's full collection frees, together with everything the
        model's code made. Emptying it lets plain reference counting free the session
        when its environment goes (a batch closes one per completion).
        """
        self.ns.clear()
        self._protocol.clear()
        self._contexts.clear()
        self._final_value = None

    # -- running a block ----------------------------------------------------------------

    def execute(self, code: str) -> ExecResult:
        """Run one block and report what it printed, raised and answered."""
        self._final = None
        self._final_value = None
        error: str | None = None
        with capture_output(self.output_cap) as (out, err):
            try:
                self._run(code, out, err)
            except BaseException as exc:  # the model's own KeyboardInterrupt too: its error
                self._raise_if_stopped(exc)  # the environment stopping the block
                error = _described(exc)
                err.write(self._traceback(exc))
            notes = self._restore_names()
            if notes:
                err.write(notes)
            try:
                final = self._final_answer()  # str() of a ready answer runs the model's code
            except BaseException as exc:
                self._raise_if_stopped(exc)
                final, error = None, error or _described(exc)
                err.write(self._traceback(exc))
        stdout = out.getvalue()
        if out.dropped:
            stdout += f"\n... [{out.dropped:,} more characters were printed and not kept]\n"
        return ExecResult(
            stdout=stdout,
            stderr=err.getvalue(),
            error=error,
            final_answer=final,
            final_json=self._final_json() if final is not None else None,
            answer_content=self.answer_content(),
        )

    def _run(self, code: str, out: Any, err: CappedBuffer) -> None:
        pair = compiled.cached(code)
        if pair is None:
            printed = err.written
            pair = compiled.compile_block(code)
            if err.written == printed:  # no warning: the next time would say nothing either
                compiled.keep(code, pair)
        body, last = pair
        exec(body, self.ns)
        if last is not None:
            value = eval(last, self.ns)
            if value is not None:
                out.write(repr(value) if not isinstance(value, str) else value)
                out.write("\n")

    @staticmethod
    def _traceback(exc: BaseException) -> str:
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == _FILENAME]
        lines = ["Traceback (most recent call last):\n"] if frames else []
        lines += traceback.format_list(frames)
        lines += traceback.format_exception_only(type(exc), exc)
        return "".join(lines)

    def _restore_names(self) -> str:
        restored = []
        for name, value in self._protocol.items():
            current = self.ns.get(name)
            if name == "answer" and isinstance(current, dict) and current is not self.answer:
                # A model that rebinds `answer` to a dict means its content.
                self.answer.clear()
                self.answer.update(current)
            elif current is not value:
                restored.append(name)
            self.ns[name] = value
        for name, (value, _) in self.tools.items():
            if self.ns.get(name) is not value:
                self.ns[name] = value
                restored.append(name)
        if "context_0" in self.ns and self.ns.get("context") is not self.ns["context_0"]:
            self.ns["context"] = self.ns["context_0"]
            restored.append("context")
        if not restored:
            return ""
        one = len(restored) == 1
        return (
            f"[note: {', '.join(restored)} {'is' if one else 'are'} part of the REPL protocol "
            f"or your tools and {'was' if one else 'were'} restored; use other names for your "
            "variables]\n"
        )

    def _final_answer(self) -> str | None:
        if self._final is not None:
            return self._final
        if self.answer.get("ready"):
            return str(self.answer.get("content", ""))
        return None

    def _final_json(self) -> str | None:
        """The final value as JSON when it is not a str (a dict, a list, a number, a
        pydantic model...), for a typed completion to validate; None if it has no JSON."""
        value = self._final_value if self._final is not None else self.answer.get("content")
        if isinstance(value, str):
            return None
        try:
            return json.dumps(value, default=to_jsonable, ensure_ascii=False)
        except (TypeError, ValueError):
            return None

    def answer_content(self) -> str:
        """The current ``answer["content"]`` as text (in the block's thread: the model's
        ``__bool__`` and ``__str__`` run under the block's limits), for a partial answer."""
        content = self.answer.get("content")
        try:
            text = "" if not content else content if type(content) is str else str(content)
        except (BlockInterrupted, LimitStop):
            raise
        except BaseException as exc:  # the model's __bool__ or __str__ raised
            text = f"[answer['content'] could not be made text: {type(exc).__name__}]"
        self._answer_text = (content, text)
        return text

    def answer_content_now(self) -> str:
        """`answer_content` for the engine's own thread, which must not run the model's
        code: plain data (text, numbers, lists and dicts of them) as text; another value
        as the last block left it (its text was taken then), else named by its type."""
        content = self.answer.get("content")
        try:  # the block may still be changing it; a huge int has no text (ValueError)
            if _plain(content, [10_000], 0):
                return "" if not content else str(content)
        except Exception:  # noqa: BLE001 - then as for any other value
            pass
        taken, text = self._answer_text
        if taken is content:
            return text
        return (
            f"[answer['content'] is of type {type(content).__name__}; the block that set "
            "it did not finish]"
        )


def _described(exc: BaseException) -> str:
    """``"Type: message"`` of an exception the model's code raised (whose ``__str__``
    may itself raise: then it is named by its type), clipped (`clip.clip_error`)."""
    try:
        return clip_error(f"{type(exc).__name__}: {exc}")
    except (BlockInterrupted, LimitStop):
        raise
    except BaseException:  # the model's __str__
        return clip_error(f"{type(exc).__name__}: <its message could not be made text>")


def _plain(value: Any, budget: list[int], depth: int) -> bool:
    """Whether ``value`` is data whose truth and text run no code of the model's: None,
    str, int, float, bool, and lists, tuples and dicts of them (at most ``budget[0]``
    items in all and 20 levels deep, a cycle never ending the walk before the budget)."""
    budget[0] -= 1
    if budget[0] < 0 or depth > 20:
        return False
    kind = type(value)
    if value is None or kind in (str, int, float, bool):
        return True
    if kind in (list, tuple):
        return all(_plain(item, budget, depth + 1) for item in value)
    if kind is dict:
        return all(
            _plain(k, budget, depth + 1) and _plain(v, budget, depth + 1) for k, v in value.items()
        )
    return False


ToolSpec = tuple[Any, str | None]
ToolTable = Mapping[str, ToolSpec]
