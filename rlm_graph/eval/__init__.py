"""Evaluations: items x methods, scored, with cost and latency (docs/eval.md).

``rlm-graph eval`` in Python::

    from rlm_graph.eval import run_eval, task_items

    outcome = run_eval(
        task_items("sniah", n=20, lengths=[8192, 65536], seed=1),
        {"backend": "openai", "backend_kwargs": {"model_name": "gpt-5"},
         "other_backends": ["openai"], "other_backend_kwargs": [{"model_name": "gpt-5-mini"}]},
        methods=["rlm", "base"], out="runs/sniah", max_budget=5.0, seed=1,
    )
    print(outcome.summary.methods["rlm"].score)

Layout (bottom to top):

- `items` (pure): an item's shape, reading and checking items files;
- `scoring` and `stats` (pure): the papers' scores, the seeded bootstrap, percentiles;
- `tasks` (pure): ``sniah``, ``synth-oolong``, ``synth-oolong-pairs``, made from a seed;
- `convert` (pure): OOLONG, BrowseComp-Plus and LongBench-v2 files as items;
- `methods`: the contract of a method (hook ``rlm_register_eval_methods``; the paper's
  four are the ``rlm_graph_eval_methods`` plugin);
- `results`: ``results.jsonl`` and the budget shared by every call;
- `run`: `Evaluation`/`run_eval`, the batch layer (`rlm_graph.batch.run_batch`) over
  items and methods; `table` and `page` write ``summary.md`` and ``report.html``.

Invariants:
    - ``import rlm_graph.eval`` is cheap: each name loads its module on first use, so the
      entry point of the methods plugin (loaded by every engine) costs nothing.
    - A user of the public API only: completions run through `rlm_graph.batch`, never
      through ``rlm_graph.runtime``.
    - Rerunning the same evaluation asks nothing already answered: ``results.jsonl``
      is resumable, and each completion is journaled in the output folder.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_names

if TYPE_CHECKING:
    from .convert import (
        CONVERTERS as CONVERTERS,
        convert as convert,
        write_items as write_items,
    )
    from .items import (
        ANSWER_TYPES as ANSWER_TYPES,
        EvalItem as EvalItem,
        context_tokens as context_tokens,
        read_items as read_items,
        sample_items as sample_items,
        scan_items as scan_items,
    )
    from .methods import (
        Call as Call,
        EvalMethod as EvalMethod,
        MethodSetup as MethodSetup,
        NotRun as NotRun,
        Solver as Solver,
        item_call as item_call,
        lookup_methods as lookup_methods,
    )
    from .results import (
        EvalRow as EvalRow,
        ResultsLog as ResultsLog,
        SharedBudget as SharedBudget,
    )
    from .run import (
        Estimate as Estimate,
        EvalOutcome as EvalOutcome,
        Evaluation as Evaluation,
        ItemsFile as ItemsFile,
        run_eval as run_eval,
    )
    from .scoring import (
        score as score,
    )
    from .stats import (
        EvalSummary as EvalSummary,
        MethodSummary as MethodSummary,
        summarize as summarize,
    )
    from .tasks import (
        TASKS as TASKS,
        TaskItems as TaskItems,
        parse_lengths as parse_lengths,
        task_items as task_items,
    )

# name -> the module that defines it, imported on first use (PEP 562).
_EXPORTS: dict[str, str] = {
    "ANSWER_TYPES": ".items",
    "CONVERTERS": ".convert",
    "Call": ".methods",
    "Estimate": ".run",
    "EvalItem": ".items",
    "EvalMethod": ".methods",
    "EvalOutcome": ".run",
    "EvalRow": ".results",
    "EvalSummary": ".stats",
    "Evaluation": ".run",
    "ItemsFile": ".run",
    "MethodSetup": ".methods",
    "MethodSummary": ".stats",
    "NotRun": ".methods",
    "ResultsLog": ".results",
    "SharedBudget": ".results",
    "Solver": ".methods",
    "TASKS": ".tasks",
    "TaskItems": ".tasks",
    "context_tokens": ".items",
    "convert": ".convert",
    "item_call": ".methods",
    "lookup_methods": ".methods",
    "parse_lengths": ".tasks",
    "read_items": ".items",
    "run_eval": ".run",
    "sample_items": ".items",
    "scan_items": ".items",
    "score": ".scoring",
    "summarize": ".stats",
    "task_items": ".tasks",
    "write_items": ".convert",
}

__all__ = [
    "ANSWER_TYPES",
    "CONVERTERS",
    "TASKS",
    "Call",
    "Estimate",
    "EvalItem",
    "EvalMethod",
    "EvalOutcome",
    "EvalRow",
    "EvalSummary",
    "Evaluation",
    "ItemsFile",
    "MethodSetup",
    "MethodSummary",
    "NotRun",
    "ResultsLog",
    "SharedBudget",
    "Solver",
    "TaskItems",
    "context_tokens",
    "convert",
    "item_call",
    "lookup_methods",
    "parse_lengths",
    "read_items",
    "run_eval",
    "sample_items",
    "scan_items",
    "score",
    "summarize",
    "task_items",
    "write_items",
]


__getattr__, __dir__ = lazy_names(__name__, globals(), _EXPORTS, __all__)
