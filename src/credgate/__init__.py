"""credgate: a secure API gateway that keeps provider credentials out of client applications."""

__version__ = "0.1.0"
