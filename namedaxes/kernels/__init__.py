"""Kernels on plain arrays (no names: ``namedaxes.nn`` maps names onto them), each with its
plain-JAX reference beside it, a ``custom_vjp``, and tests in Pallas interpret mode on CPU."""

from ._flash_attention import flash_attention as flash_attention
from ._flash_attention import flash_attention_reference as flash_attention_reference
from ._grouped_matmul import grouped_matmul as grouped_matmul
from ._grouped_matmul import grouped_matmul_reference as grouped_matmul_reference

__all__ = [
    "flash_attention",
    "flash_attention_reference",
    "grouped_matmul",
    "grouped_matmul_reference",
]
