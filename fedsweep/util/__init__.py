"""Process plumbing that knows nothing of federated learning: the allocator setting, start-up without
the cyclic garbage collector, torch imported on first use, file locks with orphan clean-up, and the
user-error type every layer raises (``errors.ConfigError``).
Imports nothing else of fedsweep."""
