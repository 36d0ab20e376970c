"""Running an evaluation: items x methods through `rlm_graph.batch.run_batch`.

Stages (`Evaluation`): the methods are looked up and their keywords checked, the items
read once (ids, and tokens for the cost estimate), then each method runs its items not
yet in ``results.jsonl``, and the summary, table and report are written from every row.

A method's items run in *rounds*: a round is one `run_batch` per role of the method
(``root``, ``sub``), each carrying the next call of every item that has one of that role.
A one-call method (``rlm``, ``base``) is one round; the summary agent takes one round per
chunk of its longest context. Each call is one completion, journaled in
``DIR/journal.sqlite`` (keyed by the call's own inputs), so an item cut by a crash or a
Ctrl-C replays its finished calls and nodes on the rerun instead of paying again.

Invariants:
    - Items are read lazily: a call is made from its item when the executor asks for it,
      and no more than the calls in flight and the solvers between calls are held.
    - A call starts only while the budget is not spent (`SharedBudget`); an item whose
      call the evaluation's budget cut is not written, so a rerun with a larger budget
      finishes it.
    - A failing item (its provider, its context file, its method) is a row with
      ``error`` set; the other items go on.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from .. import _json
from .._files import write_private
from ..batch.run import check_executor
from ..errors import ConfigError
from .items import EvalItem, asked_hash, coerce_items, context_tokens, read_items, scan_items
from .methods import EvalMethod, MethodSetup, lookup_methods
from .page import render_eval_page
from .results import EvalRow, ResultsLog, SharedBudget
from .rounds import MethodRun, RowHook
from .scoring import score
from .stats import EvalSummary, summarize
from .table import render_table

__all__ = ["EvalOutcome", "Estimate", "Evaluation", "ItemsFile", "run_eval"]


class ItemsFile:
    """An items file, read again each time it is iterated (optionally only some ids).

    Args:
        path: the JSONL items file.
        only: the ids to keep (``None``: all).
    """

    def __init__(self, path: Path, only: Iterable[str] | None = None) -> None:
        self.path = path
        self.only = None if only is None else list(only)

    def __iter__(self) -> Iterator[EvalItem]:
        return read_items(self.path, self.only)

    def ids(self) -> list[str]:
        """Every id, the file checked whole first."""
        ids = scan_items(self.path)
        if self.only is None:
            return ids
        keep = set(self.only)
        return [i for i in ids if i in keep]


class Estimate(BaseModel):
    """What an evaluation should cost before it starts, from the price table.

    Attributes:
        items: items of the evaluation.
        tokens: their questions and contexts, in tokens (four characters each).
        methods: USD per method over the items it has still to run (``None``: a model
            without a price).
        total: their sum (``None`` if any is unknown).
    """

    model_config = ConfigDict(frozen=True)

    items: int
    tokens: int
    methods: dict[str, float | None]
    todo: dict[str, int]

    @property
    def total(self) -> float | None:
        values = list(self.methods.values())
        return None if any(v is None for v in values) else sum(v for v in values if v is not None)


class EvalOutcome(BaseModel):
    """What a run of an evaluation did.

    Attributes:
        summary: the summary of every row of the evaluation's items.
        written: rows written by this run.
        spent: USD of this run's calls (the part of a call replayed from the journal
            counts at its recorded cost, though it was paid by an earlier run).
        unfinished: (item, method) pairs left for a rerun: the budget ran out first.
        out: the output folder.
    """

    model_config = ConfigDict(frozen=True)

    summary: EvalSummary
    written: int
    spent: float
    unfinished: int
    errors: int
    out: Path


class Evaluation:
    """An evaluation, checked and estimated, ready to run.

    Args:
        items: `EvalItem`\\ s or dicts shaped as items-file lines (an iterable that can be
            walked again, such as a list, an `ItemsFile` or a task's items; a one-pass
            iterator is read into a list), or the path of an items file.
        rlm_kwargs: the ``RLM(...)`` keywords of the evaluation: the root model's backend,
            the sub-model as ``other_backends[0]``, limits (per completion), environment.
        methods: method names (hook ``rlm_register_eval_methods``), in the order run.
        out: the output folder (created); ``results.jsonl`` there makes a rerun resume.
        concurrency: completions at once.
        executor, executor_kwargs: where completions run (``local``, ``ray``...).
        seed: the bootstrap's seed.
        max_budget: USD for the whole evaluation (see `SharedBudget`).
        retry_failed: run rows with an error again.
        journal: journal every completion in ``out/journal.sqlite`` (unless ``rlm_kwargs``
            names a journal of its own).
        title: the evaluation's name in the table and the report.
        plugins: plugins besides the installed ones (methods registered in code).
        check: build each role's ``RLM(...)`` now, so that a bad keyword (or a missing
            API key) fails before any call; off for an estimate alone.

    Raises:
        ConfigError: a bad keyword of any method's completions, a bad item, an ``out``
            that is not an evaluation's folder, a bad ``concurrency`` or executor keyword
            (with ``check``; else by `run`, before ``out`` is made).
        PluginError: an unknown method or executor.
    """

    def __init__(
        self,
        items: Iterable[EvalItem | Mapping[str, Any]] | str | Path,
        rlm_kwargs: Mapping[str, Any],
        *,
        methods: Sequence[str] = ("rlm",),
        out: str | Path,
        concurrency: int = 8,
        executor: str = "local",
        executor_kwargs: Mapping[str, Any] | None = None,
        seed: int = 0,
        max_budget: float | None = None,
        retry_failed: bool = False,
        journal: bool = True,
        title: str | None = None,
        plugins: Iterable[object] = (),
        check: bool = True,
    ) -> None:
        self.out = Path(out)
        self.concurrency = concurrency
        self.executor = executor
        self.executor_kwargs = dict(executor_kwargs or {})
        self.seed = seed
        self.retry_failed = retry_failed
        self.source = self._source(items)
        self.title = title or self._title(self.source)
        kwargs = dict(rlm_kwargs)
        self.plugins = [*plugins, *kwargs.get("plugins", ())]
        if self.plugins:
            kwargs["plugins"] = self.plugins
        if journal and "journal" not in kwargs:
            kwargs["journal"] = str(
                (self.out / "journal.sqlite").resolve()
            )  # workers elsewhere too
        self.budget = SharedBudget(max_budget, per_call=kwargs.get("max_budget"))
        if max_budget is not None:
            if kwargs.get("max_budget") is None:
                kwargs["max_budget"] = max_budget  # so that an unpriced model is refused now
            kwargs["listeners"] = [*kwargs.get("listeners", ()), self.budget.listener()]
        self.setup = MethodSetup.of(kwargs)
        self.methods = lookup_methods(list(methods), self.plugins)
        self._executor_checked = False
        if check:
            self._check_executor()
        self.role_kwargs = {m.name: self._roles(m, check) for m in self.methods}
        self.asked: dict[str, str] = {}
        self.golds: dict[str, tuple[str, Any]] = {}
        self.ids, self.tokens, estimate_items = self._scan()
        self.log = ResultsLog(self.out / "results.jsonl")
        self._prepare_out()
        self.todo = self._todo()
        self.estimate = Estimate(
            items=len(self.ids),
            tokens=sum(self.tokens.values()),
            methods={m.name: self._estimate(m, estimate_items) for m in self.methods},
            todo={name: len(ids) for name, ids in self.todo.items()},
        )

    # -- configuration ----------------------------------------------------------------------

    @staticmethod
    def _source(
        items: Iterable[EvalItem | Mapping[str, Any]] | str | Path,
    ) -> Iterable[EvalItem | Mapping[str, Any]]:
        if isinstance(items, str | Path):
            return ItemsFile(Path(items))
        if iter(items) is items:  # one pass only: keep what it gives
            return list(coerce_items(items))
        return items

    @staticmethod
    def _title(source: object) -> str:
        if isinstance(source, ItemsFile):
            return source.path.name
        title = getattr(source, "title", None)
        return title if isinstance(title, str) else "evaluation"

    def _roles(self, method: EvalMethod, check: bool) -> dict[str, dict[str, Any]]:
        from .. import RLM  # the facade: builds the engine to check, runs nothing

        roles = {str(role): dict(kw) for role, kw in method.rlm_kwargs(self.setup).items()}
        if not roles:
            raise ConfigError(f"method {method.name!r} returned no RLM keywords from rlm_kwargs()")
        for role, kwargs in roles.items() if check else ():
            try:
                RLM(**kwargs)
            except ConfigError as exc:
                raise ConfigError(f"method {method.name!r} ({role}): {exc}") from None
        return roles

    def _check_executor(self) -> None:
        """The concurrency and the executor, checked before ``out`` is made or written
        (a bad one was refused by the first batch, after ``results.jsonl`` and
        ``models.json`` were there)."""
        if not self._executor_checked:
            check_executor(self.concurrency, self.executor, self.executor_kwargs, self.plugins)
            self._executor_checked = True

    def _scan(self) -> tuple[list[str], dict[str, int], dict[str, EvalItem]]:
        """Ids in order and tokens per item; the items themselves only when small
        enough to keep for the estimate."""
        if isinstance(self.source, ItemsFile):
            self.source.ids()  # every bad line, with its number, before anything else
        ids: list[str] = []
        tokens: dict[str, int] = {}
        kept: dict[str, EvalItem] = {}
        for item in coerce_items(self.source):
            ids.append(item.id)
            context = item.load_context()
            tokens[item.id] = context_tokens(context, item.question)
            self.asked[item.id] = asked_hash(item.question, context)
            self.golds[item.id] = (item.answer_type, item.answer)
            kept[item.id] = item.model_copy(update={"context": None, "context_path": None})
        if not ids:
            raise ConfigError("the evaluation has no item")
        return ids, tokens, kept

    def _estimate(self, method: EvalMethod, items: Mapping[str, EvalItem]) -> float | None:
        total = 0.0
        for item_id in self.ids:
            if item_id not in self.todo[method.name]:
                continue
            cost = method.estimate(items[item_id], self.tokens[item_id], self.setup)
            if cost is None:
                return None
            total += cost
        return total

    def _prepare_out(self) -> None:
        if self.out.exists() and not self.out.is_dir():
            raise ConfigError(
                f"--out {str(self.out)!r} is a file; give a folder for the evaluation's results"
            )
        self.log.read()  # nothing is written before run()
        self._check_models()

    def _todo(self) -> dict[str, set[str]]:
        """Per method, the ids without a row made for what their item asks now."""
        return {
            m.name: set(self.ids)
            - self.log.done(m.name, retry_failed=self.retry_failed, asked=self.asked)
            for m in self.methods
        }

    def _models(self) -> dict[str, str | None]:
        return {"root": self.setup.root_model, "sub": self.setup.sub_model}

    def _check_models(self) -> None:
        """A rerun resumes only the evaluation of the same models (``models.json``, written
        before the first row, says which; a folder of an older version, its summary): a
        row does not say which model made it, and another model's rows would be counted
        as this one's."""
        try:
            kept = self._kept_models()
        except (OSError, ValueError, KeyError, TypeError):
            return  # a new folder (or one of an older version cut short before its summary)
        if not isinstance(kept, dict):
            return
        asked = self._models()
        if self.log.rows() and kept != asked:
            raise ConfigError(
                f"--out {str(self.out)!r} holds the results of root model "
                f"{kept.get('root')!r} (sub {kept.get('sub')!r}); this run asks "
                f"{asked['root']!r} (sub {asked['sub']!r}): give a new --out, or the same "
                "models to resume"
            )

    def _kept_models(self) -> Any:
        """``models.json``; in a folder of an older version, its summary's models."""
        models = self.out / "models.json"
        if models.exists():
            return json.loads(models.read_text(encoding="utf-8"))
        return json.loads((self.out / "summary.json").read_text(encoding="utf-8"))["models"]

    # -- running ----------------------------------------------------------------------------

    def run(self, on_row: RowHook | None = None) -> EvalOutcome:
        """Run every method over its items not done yet; write the summary files.

        Args:
            on_row: called with each row as it is written (the caller's thread).
        """
        written = errors = 0
        self._check_executor()
        try:
            self.out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"cannot make --out {str(self.out)!r}: {exc.strerror}") from None
        self.log.open()
        self.todo = self._todo()
        try:
            if any(self.todo.values()):  # which models the rows are of, before the first
                write_private(self.out / "models.json", json.dumps(self._models()) + "\n")
            for method in self.methods:
                if not self.todo[method.name]:
                    continue
                counted = _Counting(on_row)
                written += MethodRun(self, method, self.todo[method.name], counted).run()
                errors += counted.errors
        finally:
            self.log.close()
        done = {(str(r["id"]), str(r["method"])) for r in self.log.rows(self.asked)}
        unfinished = sum(1 for m in self.methods for i in self.ids if (i, m.name) not in done)
        summary = self.write_summary()
        return EvalOutcome(
            summary=summary,
            written=written,
            spent=self.budget.spent,
            unfinished=unfinished,
            errors=errors,
            out=self.out,
        )

    def write_summary(self) -> EvalSummary:
        """Summarise every row of this evaluation's items: ``summary.json``, ``summary.md``
        and ``report.html`` in the output folder."""
        rows = [self._rescored(r) for r in self.log.rows(self.asked)]
        names = [m.name for m in self.methods]
        summary = summarize(
            rows, methods=names, seed=self.seed, title=self.title, items=len(self.ids)
        )
        data = summary.public()
        data["models"] = self._models()
        write_private(self.out / "summary.json", _json.dumps(data, indent=2) + "\n")
        descriptions = {m.name: m.description for m in self.methods}
        models = {"root_model": self.setup.root_model, "sub_model": self.setup.sub_model}
        write_private(
            self.out / "summary.md", render_table(summary, descriptions=descriptions, **models)
        )
        write_private(
            self.out / "report.html",
            render_eval_page(summary, rows, descriptions=descriptions, **models),
        )
        return summary

    def _rescored(self, row: dict[str, Any]) -> dict[str, Any]:
        """``row`` scored against its item's gold answer as it is now (a corrected answer,
        or a scorer of a newer version, counts without asking the model again)."""
        if row.get("error") is not None or row.get("prediction") is None:
            return row
        answer_type, gold = self.golds[str(row["id"])]
        return {**row, "score": score(answer_type, gold, row["prediction"])}


class _Counting:
    """Passes rows on and counts the failed ones."""

    def __init__(self, on_row: RowHook | None) -> None:
        self.on_row = on_row
        self.errors = 0

    def __call__(self, row: EvalRow) -> None:
        self.errors += row.error is not None
        if self.on_row is not None:
            self.on_row(row)


def run_eval(
    items: Iterable[EvalItem | Mapping[str, Any]] | str | Path,
    rlm_kwargs: Mapping[str, Any],
    *,
    methods: Sequence[str] = ("rlm",),
    out: str | Path,
    on_row: RowHook | None = None,
    **options: Any,
) -> EvalOutcome:
    """Evaluate ``methods`` over ``items``; write ``results.jsonl``, ``summary.json``,
    ``summary.md`` and ``report.html`` in ``out``. Rerun to resume.

    Args:
        items, rlm_kwargs, methods, out: see `Evaluation`.
        on_row: called with each row as it is written.
        **options: the other keywords of `Evaluation` (``concurrency``, ``executor``,
            ``seed``, ``max_budget``, ``retry_failed``, ``journal``, ``title``, ``plugins``).

    Returns:
        An `EvalOutcome`: the summary, the rows written, what was spent.

    Raises:
        ConfigError, PluginError: as `Evaluation`, before any call.
    """
    return Evaluation(items, rlm_kwargs, methods=methods, out=out, **options).run(on_row)
