"""Unit tests: pure functions and in-process objects; no socket, no process (tests/README.md)."""
