"""A real llama.cpp ``llama-server`` for integration tests: installer and runner (the
``real_llamacpp`` fixture is in tests/conftest.py)."""
