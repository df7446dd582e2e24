"""A real llama.cpp ``llama-server`` for integration tests: installer, runner and fixture."""
