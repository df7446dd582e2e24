"""Integration tests: real sockets, processes, Redis, llama.cpp, deploy tools (tests/README.md)."""
