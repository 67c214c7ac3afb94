"""mindiesd.utils.exception: MindIE-SD's exception types (defined in ditops.errors)."""

from ...errors import (
    ConfigError,
    ModelExecError,
    ModelInitError,
    ParametersInvalid,
    TorchError,
    raises_parameters_invalid,
)

__all__ = ["ConfigError", "ModelExecError", "ModelInitError", "ParametersInvalid", "TorchError",
           "raises_parameters_invalid"]
