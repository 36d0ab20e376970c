"""The HTTP provider kit (private): what `rlm_graph.http` hands to provider plugins.

- `provider`: `JSONProvider`, the shared base of HTTP providers (one httpx client per
  trio loop, retries, growing per-attempt deadlines);
- `transport`: `LeanTransport`, the default httpx transport over trio streams;
- `wire`: HTTP/1.1 on the wire, a request's bytes and a strict response reader (pure);
- `retry`: the retry policy and the waits a response's headers ask for (pure);
- `keys`: where an API key may be sent, and `Secret`;
- `attempts`: attempts counted per call and per run, one retry summary per provider.

Plugins import these names from `rlm_graph.http`, the stable surface; this package's
layout may change without notice.
"""
