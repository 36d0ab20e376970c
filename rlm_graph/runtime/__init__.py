"""The runtime: the only package that imports trio.

- `context`: the run, and `Run.execute`, the one place a node runs.
- `limiters`: capacity limiters and rate buckets.
- `providers`: routing and `call_model`, the one path of every model call.
- `batch`: concurrent slots, results in order, failures in their slot.
- `workflow`: the graph executor for a user's `Workflow`.
"""
