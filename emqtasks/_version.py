"""The package's version, below the package root so any module may read it."""

__version__ = "0.1.0"
