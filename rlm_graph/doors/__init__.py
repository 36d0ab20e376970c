"""The doors into the engine from code that is not a trio task.

- `sync`: ``trio.run`` for plain code (`RLM.completion`, `Engine.run`), plain
  exceptions out, refusing to nest;
- `aio`: asyncio callers' work on one trio loop in a daemon thread;
- `stream`: a run in the background and its events in the caller's hands
  (`RLM.stream`/`astream`, `Engine.stream`/`astream`).
"""
