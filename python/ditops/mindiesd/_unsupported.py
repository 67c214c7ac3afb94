"""MindIE-SD features ditops does not compute: each name exists and raises an error naming the
feature when called (never a TypeError), so code that only imports it runs."""

from .utils.exception import ParametersInvalid


class FeatureNotSupported(ParametersInvalid, NotImplementedError):
    """A MindIE-SD feature ditops does not provide on the CPU."""


def refusing(name, feature):
    """A callable named `name` that accepts any arguments and raises FeatureNotSupported."""

    def refuse(*args, **kwargs):
        raise FeatureNotSupported(f"{name}: {feature} is not supported by ditops on the CPU "
                                  "(see docs/mindiesd.md)")

    refuse.__name__ = refuse.__qualname__ = name
    return refuse
