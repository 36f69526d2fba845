"""The version, in one place (read by the build backend and by ``edgetk --version``)."""

__version__ = "0.1.0"
