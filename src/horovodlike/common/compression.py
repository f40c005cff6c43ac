"""Gradient compression applied around the allreduce, as in Horovod: the interface, and the
framework-neutral parts of its compressors (each framework says how to cast)."""


class Compressor:
    """Interface: compress before the allreduce, decompress after it."""

    @staticmethod
    def compress(tensor):
        raise NotImplementedError

    @staticmethod
    def decompress(tensor, ctx):
        raise NotImplementedError


class NoneCompressor(Compressor):
    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class HalfCompressorBase(Compressor):
    """Sends floating-point tensors as float16, halving the bytes on the wire. A framework
    subclass provides `_is_float_not_half(tensor)` and `_cast(tensor, dtype)` and `_half`."""

    _half = None

    @classmethod
    def compress(cls, tensor):
        if cls._is_float_not_half(tensor):
            return cls._cast(tensor, cls._half), tensor.dtype
        return tensor, None

    @classmethod
    def decompress(cls, tensor, ctx):
        return tensor if ctx is None else cls._cast(tensor, ctx)
