"""``rlm-graph plugins``: what is registered, and where it came from."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..hooks import PluginHost


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "plugins",
        help="list registered providers, environments, compaction strategies, executors and eval methods",
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    host = PluginHost()
    rows = [
        {"category": reg.category, "name": reg.name, "origin": reg.origin}
        for reg in host.registrations()
    ]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    for category in PluginHost.CATEGORIES:
        print(f"{category.replace('_', ' ')}:")
        names = [r for r in rows if r["category"] == category]
        if not names:
            print("  (none)")
        for row in sorted(names, key=lambda r: r["name"]):
            print(f"  {row['name']:<16} {row['origin']}")
    return 0
