"""The runtime: the scheduler, and nothing else.

- `context`: the run, and `Run.execute`, the one place a node runs (and is replayed
  from or recorded in the journal);
- `lifecycle`: what surrounds every run, completion or workflow;
- `capacity`: capacity limiters and rate buckets, the `SharedLimiter` seam;
- `providers`: routing and `call_model`, the one path of every model call;
- `slots`: the slots of one ``*_batched`` call, concurrent, results in order;
- `bridge`, `loop`, `direct`, `session`: the RLM loop and the REPL bridge;
- `workflow`: the graph executor for a user's `Workflow`;
- `replay`: the journal on the scheduler's side.
"""
