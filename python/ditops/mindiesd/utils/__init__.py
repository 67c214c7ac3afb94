from .exception import (
    ConfigError,
    ModelExecError,
    ModelInitError,
    ParametersInvalid,
    TorchError,
)

__all__ = ["ConfigError", "ModelExecError", "ModelInitError", "ParametersInvalid", "TorchError"]
