"""The REPL protocol as pure text: code fences, text answers, output truncation, prompts.

Compatible with the reference library's protocol, so its prompts and trained models work.
No trio, httpx or opentelemetry here.
"""

from __future__ import annotations

from .fences import find_code_blocks
from .final import find_text_final
from .truncate import truncate_output

__all__ = ["find_code_blocks", "find_text_final", "truncate_output"]
