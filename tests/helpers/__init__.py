"""Helpers shared by test modules (imported as `helpers.NAME`; tests/ is on sys.path through conftest.py)."""
