"""``rlm-graph plugins``: what is registered, where it came from, and what failed to load.

An installed plugin whose module fails to import is skipped by every engine (see
`rlm_graph.hooks.manager`); this command lists it with its error, as a row of category
``broken`` in ``--json``, and still exits 0: the plugins that load work.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..hooks import PluginHost


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "plugins",
        help="list registered providers, environments, compaction strategies, executors and "
        "eval methods, and installed plugins that failed to load",
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    host = PluginHost()
    rows: list[dict[str, str]] = [
        {"category": reg.category, "name": reg.name, "origin": reg.origin}
        for reg in host.registrations()
    ]
    broken = [
        {
            "category": "broken",
            "name": plugin.name,
            "origin": f"entry point {plugin.name!r} of {plugin.distribution}",
            "error": plugin.error,
        }
        for plugin in host.broken
    ]
    if args.json:
        print(json.dumps(rows + broken, indent=2))
        return 0
    for category in PluginHost.CATEGORIES:
        print(f"{category.replace('_', ' ')}:")
        names = [r for r in rows if r["category"] == category]
        if not names:
            print("  (none)")
        for row in sorted(names, key=lambda r: r["name"]):
            print(f"  {row['name']:<16} {row['origin']}")
    if broken:
        print("failed to load (skipped; the names above work without them):")
        for row in broken:
            print(f"  {row['name']:<16} {row['origin']}: {row['error']}")
    return 0
