"""MindIE-SD's quantization algorithm names (mindiesd.quantization.mode.QuantAlgorithm): every
member the real package knows, with its spelling, so configurations and description files that
name any of them parse. Which ones ditops computes: RUNNABLE (below) and docs/quantization.md."""

import enum

try:
    from enum import StrEnum
except ImportError:  # Python < 3.11: the same behaviour (str() gives the value)
    class StrEnum(str, enum.Enum):
        def __str__(self):
            return self.value


class QuantAlgorithm(StrEnum):
    W8A8 = "W8A8"
    W8A8_TIMESTEP = "W8A8_TIMESTEP"
    W8A8_DYNAMIC = "W8A8_DYNAMIC"
    W4A4_DYNAMIC = "W4A4_DYNAMIC"
    W8A8_MXFP8 = "W8A8_MXFP8"
    W4A4_MXFP4_DYNAMIC = "W4A4_MXFP4"
    W8A16 = "W8A16"
    W4A16 = "W4A16"
    W4A16_AWQ = "W4A16_AWQ"
    W4A8_AWQ = "W4A8_AWQ"
    W8A16_GPTQ = "W8A16_GPTQ"
    W4A16_GPTQ = "W4A16_GPTQ"
    W8A8_PER_CHANNEL = "W8A8_PER_CHANNEL"
    W8A8_PER_TENSOR = "W8A8_PER_TENSOR"
    W8A8_PER_CHANNEL_PER_TOKEN = "W8A8_PER_CHANNEL_PER_TOKEN"
    W8A8_PER_CHANNEL_PER_TENSOR = "W8A8_PER_CHANNEL_PER_TENSOR"
    W8A8_PER_TENSOR_PER_TOKEN = "W8A8_PER_TENSOR_PER_TOKEN"
    INT8 = "INT8"
    MIXED_PERCISION = "MIXED_PERCISION"  # MindIE-SD's spelling
    FP8_DYNAMIC = "FP8_DYNAMIC"
    MXFP8_DYNAMIC = "MXFP8_DYNAMIC"
    MXFP4_DYNAMIC = "MXFP4_DYNAMIC"
    NO_QUANT = "NO_QUANT"
    W4A4_MXFP4_SVD = "W4A4_MXFP4_SVD"
    W4A4_MXFP4_DUALSCALE = "W4A4_MXFP4_DUALSCALE"
    W4A8 = "W4A8"
    W16A16 = "W16A16"


# The algorithms of an msmodelslim export that ditops' layers compute (the C++ QuantModel's);
# a description naming any other is refused with its name.
RUNNABLE = (QuantAlgorithm.W8A8, QuantAlgorithm.W8A8_DYNAMIC, QuantAlgorithm.W8A8_TIMESTEP)
