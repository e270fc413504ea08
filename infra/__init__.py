"""The helpers every layer stands on: the environment, the var dir, queues and lanes, API errors, JSON input."""
