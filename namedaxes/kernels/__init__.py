"""Kernels on plain arrays (no names: ``namedaxes.nn`` maps names onto them), each with its
plain-JAX reference beside it, a ``custom_vjp``, and tests in Pallas interpret mode on CPU."""

from ._grouped_matmul import grouped_matmul as grouped_matmul
from ._grouped_matmul import grouped_matmul_reference as grouped_matmul_reference

__all__ = ["grouped_matmul", "grouped_matmul_reference"]
