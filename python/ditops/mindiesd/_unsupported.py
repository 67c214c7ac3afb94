"""MindIE-SD features ditops does not compute (ditops.errors.refusing)."""

from ..errors import FeatureNotSupported, refusing

__all__ = ["FeatureNotSupported", "refusing"]
