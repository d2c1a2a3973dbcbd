"""Tests of the Jupyter server extension (a package, so its conftest does not shadow tests/conftest.py)."""
