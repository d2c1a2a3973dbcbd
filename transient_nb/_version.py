"""The package's version, in a module of its own: code that runs on a VM or in a worker reads it
without importing the package's public API."""

__version__ = "0.1.0"
