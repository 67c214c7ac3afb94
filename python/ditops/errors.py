"""The error types of ditops' Python layers beyond ditops.Error: MindIE-SD's (the names ditops
exports with MindIE-SD's meaning raise them; ditops.mindiesd gives them MindIE-SD's module path).
Each is also a ditops.Error (a ValueError), so code that catches either MindIE-SD's type or
ditops' catches it; the message starts with MindIE-SD's code."""

import functools

from . import _ditops


class ParametersInvalid(_ditops.Error):
    """An argument of the wrong type, shape, value or range."""

    code = "[MIE06E000001] Parameters invalid."

    def __init__(self, message):
        self.message = f"{self.code} {message}"
        super().__init__(self.message)


class ConfigError(ParametersInvalid):
    """A configuration item missing, invalid or inconsistent."""

    code = "[MIE06E000002] Config parameter err."


class TorchError(ParametersInvalid):
    """A torch operation failed."""

    code = "[MIE06E000003] Torch exec err."


class ModelInitError(ParametersInvalid):
    """A model could not be prepared (weights, configuration)."""

    code = "[MIE06E000004] Model init err."


class ModelExecError(ParametersInvalid):
    """A model's forward pass failed."""

    code = "[MIE06E000005] Model exec err."


def raises_parameters_invalid(function):
    """`function` with ditops.Error (a refused argument, named by the C++ message) raised as
    MindIE-SD's ParametersInvalid, as the real package reports bad inputs."""

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        except ParametersInvalid:
            raise
        except _ditops.Error as error:
            raise ParametersInvalid(str(error)) from None

    return wrapper


class FeatureNotSupported(ParametersInvalid, NotImplementedError):
    """A MindIE-SD feature ditops does not provide on the CPU."""


def refusing(name, feature):
    """A callable named `name` that accepts any arguments and raises FeatureNotSupported: the
    MindIE-SD names ditops does not compute exist, so code that only imports them runs."""

    def refuse(*args, **kwargs):
        raise FeatureNotSupported(f"{name}: {feature} is not supported by ditops on the CPU "
                                  "(see docs/mindiesd.md)")

    refuse.__name__ = refuse.__qualname__ = name
    return refuse
