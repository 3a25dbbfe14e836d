"""The package's version, in a leaf so that any layer can report it without importing
the package's `__init__` (the Python API's facade, which sits on top)."""

__version__ = "0.1.0"
