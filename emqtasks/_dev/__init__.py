"""Development tools: private servers and clusters for tests and benches, the demo, the bench.

Not part of the runtime: a producer or a worker never imports anything here.
"""
