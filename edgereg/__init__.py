"""edgereg: declarative MNN builds per device tier and a signed model registry."""

__version__ = "0.1.0"
