"""The recording pipeline, one module per step: tracer events (tracer, tracelog) ->
attribution -> classification -> hashing (capture, hashing, statcache, nativehash) ->
store -> emission (facets) -> spool and delivery.  `writer` runs a task through it."""
