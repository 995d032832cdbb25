"""The engine: the SplitEngine facade and its parts (synchronous round, asynchronous loop, aggregation,
model views, re-partition, clock, network, execution policy, checkpoint state)."""
