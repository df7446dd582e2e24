"""Data from independent implementations, and the tests that hold owngate to it (README.md)."""
