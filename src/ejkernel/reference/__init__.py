"""Naive float32 definitions of every op: the oracle for tests, never registered, never optimised."""
