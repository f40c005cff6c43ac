"""Gradient compression applied around the allreduce, as in Horovod."""

import torch

from horovodlike.common.compression import Compressor, HalfCompressorBase, NoneCompressor

__all__ = ["Compression", "Compressor", "FP16Compressor", "NoneCompressor"]


class FP16Compressor(HalfCompressorBase):
    """Sends floating-point tensors as float16, halving the bytes on the wire."""

    _half = torch.float16

    @staticmethod
    def _is_float_not_half(tensor):
        return tensor.dtype.is_floating_point and tensor.dtype != torch.float16

    @staticmethod
    def _cast(tensor, dtype):
        return tensor.to(dtype)


class Compression:
    """Optional gradient compression used during allreduce."""

    none = NoneCompressor
    fp16 = FP16Compressor
