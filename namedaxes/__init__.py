"""namedaxes: named axes and logical-to-physical sharding for JAX.

Write models with named axes, say once how logical axes map to mesh axes, and let the library turn
names into ``PartitionSpec``s.

The core lives here (named arrays, axes, errors, the named ops, rules, ``resolve``, the mapping
context, placement and ``named_jit``/``fsdp``, ``shard_map``); the rest lives in its subpackage and
only there: ``namedaxes.nn``, ``namedaxes.random``, ``namedaxes.mesh``, ``namedaxes.distributed``,
``namedaxes.rules``, ``namedaxes.analysis``, ``namedaxes.kernels``, ``namedaxes.models``,
``namedaxes.checkpoint``.

Layers, lowest first. A module imports only from its own layer or lower ones, at module top (a
function-level import counts as an import); no module imports ``namedaxes`` itself, and the
layers' own modules import one another without cycles (tests/test_layers.py checks all of it):

1. ``_errors``: exception types and formatters; ``_caches``: the cache registry
2. ``_axis``: ``Axis`` and pure axis algebra
3. ``_mesh``, ``_spec``: mesh sizes, ``PartitionSpec`` entry arithmetic
4. ``_logical``: the logical core: rules, ``resolve``, the mapping context (no arrays)
5. ``_typing``: ``NamedArray["..."]`` annotations, ``check_axes``
6. ``_array``: ``NamedArray`` (its methods reach the ops through ``_array.bind_ops``)
7. ``_ops``, ``_samplers``, ``random``: the named ops and samplers
8. ``_partitioning``: placement: the tree walk and the one plan, ``shard``, ``pspec_for``,
   ``named_jit``/``fsdp``, ``shard_map``
9. ``mesh``, ``rules``, ``distributed``
10. ``analysis``
11. ``kernels``: Pallas kernels on plain arrays
12. ``nn``
13. ``models``, ``checkpoint``
14. ``__init__``, ``_cli``, ``__main__``, ``mypy_plugin``
"""

__version__ = "0.1.0"

from . import analysis as analysis
from . import distributed as distributed
from . import kernels as kernels
from . import mesh as mesh
from . import nn as nn
from . import random as random
from . import rules as rules
from ._array import NamedArray as NamedArray

# named arrays
from ._array import is_named_array as is_named_array
from ._array import named as named

# axes
from ._axis import Axis as Axis
from ._axis import AxisSelector as AxisSelector
from ._axis import AxisSpec as AxisSpec
from ._axis import eliminate_axes as eliminate_axes
from ._axis import replace_axis as replace_axis
from ._axis import without_axes as without_axes

# caches
from ._caches import clear_caches as clear_caches

# errors (every exception and warning type; checkpoint errors too, importable without the extra)
from ._errors import AttentionKernelError as AttentionKernelError
from ._errors import AxisError as AxisError
from ._errors import AxisIndexError as AxisIndexError
from ._errors import AxisNotFoundError as AxisNotFoundError
from ._errors import AxisSizeError as AxisSizeError
from ._errors import BarrierTimeoutError as BarrierTimeoutError
from ._errors import CheckpointAxisError as CheckpointAxisError
from ._errors import CheckpointDtypeError as CheckpointDtypeError
from ._errors import CheckpointError as CheckpointError
from ._errors import CheckpointNotFoundError as CheckpointNotFoundError
from ._errors import CheckpointStructureError as CheckpointStructureError
from ._errors import CompileTargetError as CompileTargetError
from ._errors import DeviceOutOfMemoryError as DeviceOutOfMemoryError
from ._errors import DistributedError as DistributedError
from ._errors import DonatedArrayError as DonatedArrayError
from ._errors import DuplicateAxisError as DuplicateAxisError
from ._errors import GenerationError as GenerationError
from ._errors import KernelError as KernelError
from ._errors import LayerError as LayerError
from ._errors import MappingTypeError as MappingTypeError
from ._errors import MemoryAnalysisUnavailableError as MemoryAnalysisUnavailableError
from ._errors import MeshError as MeshError
from ._errors import MeshTypeError as MeshTypeError
from ._errors import ModelConfigError as ModelConfigError
from ._errors import NamedAxesError as NamedAxesError
from ._errors import NamedTypeError as NamedTypeError
from ._errors import NoMeshError as NoMeshError
from ._errors import PlanDoesNotFitError as PlanDoesNotFitError
from ._errors import PlanError as PlanError
from ._errors import QuantizationError as QuantizationError
from ._errors import ShardingError as ShardingError
from ._errors import ShardingWarning as ShardingWarning
from ._errors import SpecMismatchError as SpecMismatchError
from ._errors import UnmatchedMappingError as UnmatchedMappingError
from ._errors import UnsatisfiedAxisError as UnsatisfiedAxisError
from ._logical._context import axis_mapping as axis_mapping
from ._logical._context import current_axis_mapping as current_axis_mapping
from ._logical._resolve import resolve as resolve

# the logical core: rules, resolve, the mapping in force
from ._logical._rules import AxisRules as AxisRules
from ._logical._rules import ResourceMapping as ResourceMapping
from ._ops.contract import dot as dot
from ._ops.contract import einsum as einsum

# named ops
from ._ops.creation import arange as arange
from ._ops.creation import full as full
from ._ops.creation import full_like as full_like
from ._ops.creation import linspace as linspace
from ._ops.creation import ones as ones
from ._ops.creation import ones_like as ones_like
from ._ops.creation import zeros as zeros
from ._ops.creation import zeros_like as zeros_like
from ._ops.dynamic import ds as ds
from ._ops.dynamic import updated_slice as updated_slice
from ._ops.elementwise import abs as abs
from ._ops.elementwise import absolute as absolute
from ._ops.elementwise import add as add
from ._ops.elementwise import angle as angle
from ._ops.elementwise import arccos as arccos
from ._ops.elementwise import arccosh as arccosh
from ._ops.elementwise import arcsin as arcsin
from ._ops.elementwise import arcsinh as arcsinh
from ._ops.elementwise import arctan as arctan
from ._ops.elementwise import arctan2 as arctan2
from ._ops.elementwise import arctanh as arctanh
from ._ops.elementwise import astype as astype
from ._ops.elementwise import bitwise_and as bitwise_and
from ._ops.elementwise import bitwise_not as bitwise_not
from ._ops.elementwise import bitwise_or as bitwise_or
from ._ops.elementwise import bitwise_xor as bitwise_xor
from ._ops.elementwise import cbrt as cbrt
from ._ops.elementwise import ceil as ceil
from ._ops.elementwise import celu as celu
from ._ops.elementwise import clip as clip
from ._ops.elementwise import conj as conj
from ._ops.elementwise import copysign as copysign
from ._ops.elementwise import cos as cos
from ._ops.elementwise import cosh as cosh
from ._ops.elementwise import deg2rad as deg2rad
from ._ops.elementwise import divide as divide
from ._ops.elementwise import elu as elu
from ._ops.elementwise import equal as equal
from ._ops.elementwise import erf as erf
from ._ops.elementwise import erfinv as erfinv
from ._ops.elementwise import exp as exp
from ._ops.elementwise import exp2 as exp2
from ._ops.elementwise import expm1 as expm1
from ._ops.elementwise import float_power as float_power
from ._ops.elementwise import floor as floor
from ._ops.elementwise import floor_divide as floor_divide
from ._ops.elementwise import fmax as fmax
from ._ops.elementwise import fmin as fmin
from ._ops.elementwise import gcd as gcd
from ._ops.elementwise import gelu as gelu
from ._ops.elementwise import greater as greater
from ._ops.elementwise import greater_equal as greater_equal
from ._ops.elementwise import hard_sigmoid as hard_sigmoid
from ._ops.elementwise import hard_swish as hard_swish
from ._ops.elementwise import hard_tanh as hard_tanh
from ._ops.elementwise import hypot as hypot
from ._ops.elementwise import imag as imag
from ._ops.elementwise import invert as invert
from ._ops.elementwise import isclose as isclose
from ._ops.elementwise import isfinite as isfinite
from ._ops.elementwise import isinf as isinf
from ._ops.elementwise import isnan as isnan
from ._ops.elementwise import lcm as lcm
from ._ops.elementwise import leaky_relu as leaky_relu
from ._ops.elementwise import left_shift as left_shift
from ._ops.elementwise import less as less
from ._ops.elementwise import less_equal as less_equal
from ._ops.elementwise import log as log
from ._ops.elementwise import log1p as log1p
from ._ops.elementwise import log2 as log2
from ._ops.elementwise import log10 as log10
from ._ops.elementwise import log_sigmoid as log_sigmoid
from ._ops.elementwise import logaddexp as logaddexp
from ._ops.elementwise import logaddexp2 as logaddexp2
from ._ops.elementwise import logical_and as logical_and
from ._ops.elementwise import logical_not as logical_not
from ._ops.elementwise import logical_or as logical_or
from ._ops.elementwise import logical_xor as logical_xor
from ._ops.elementwise import maximum as maximum
from ._ops.elementwise import minimum as minimum
from ._ops.elementwise import mish as mish
from ._ops.elementwise import mod as mod
from ._ops.elementwise import multiply as multiply
from ._ops.elementwise import nan_to_num as nan_to_num
from ._ops.elementwise import negative as negative
from ._ops.elementwise import not_equal as not_equal
from ._ops.elementwise import positive as positive
from ._ops.elementwise import power as power
from ._ops.elementwise import rad2deg as rad2deg
from ._ops.elementwise import real as real
from ._ops.elementwise import reciprocal as reciprocal
from ._ops.elementwise import relu as relu
from ._ops.elementwise import relu6 as relu6
from ._ops.elementwise import remainder as remainder
from ._ops.elementwise import right_shift as right_shift
from ._ops.elementwise import rint as rint
from ._ops.elementwise import round as round
from ._ops.elementwise import rsqrt as rsqrt
from ._ops.elementwise import selu as selu
from ._ops.elementwise import sigmoid as sigmoid
from ._ops.elementwise import sign as sign
from ._ops.elementwise import signbit as signbit
from ._ops.elementwise import silu as silu
from ._ops.elementwise import sin as sin
from ._ops.elementwise import sinc as sinc
from ._ops.elementwise import sinh as sinh
from ._ops.elementwise import softplus as softplus
from ._ops.elementwise import sqrt as sqrt
from ._ops.elementwise import square as square
from ._ops.elementwise import subtract as subtract
from ._ops.elementwise import tan as tan
from ._ops.elementwise import tanh as tanh
from ._ops.elementwise import true_divide as true_divide
from ._ops.elementwise import trunc as trunc
from ._ops.hof import fold as fold
from ._ops.hof import scan as scan
from ._ops.hof import vmap as vmap
from ._ops.indexing import slice_axis as slice_axis
from ._ops.indexing import take as take
from ._ops.join import concatenate as concatenate
from ._ops.join import stack as stack
from ._ops.linalg_like import diagonal as diagonal
from ._ops.linalg_like import trace as trace
from ._ops.linalg_like import tril as tril
from ._ops.linalg_like import triu as triu
from ._ops.nan_reductions import nanargmax as nanargmax
from ._ops.nan_reductions import nanargmin as nanargmin
from ._ops.nan_reductions import nancumprod as nancumprod
from ._ops.nan_reductions import nancumsum as nancumsum
from ._ops.nan_reductions import nanmax as nanmax
from ._ops.nan_reductions import nanmean as nanmean
from ._ops.nan_reductions import nanmin as nanmin
from ._ops.nan_reductions import nanprod as nanprod
from ._ops.nan_reductions import nanstd as nanstd
from ._ops.nan_reductions import nansum as nansum
from ._ops.nan_reductions import nanvar as nanvar
from ._ops.reductions import all as all
from ._ops.reductions import any as any
from ._ops.reductions import argmax as argmax
from ._ops.reductions import argmin as argmin
from ._ops.reductions import cumprod as cumprod
from ._ops.reductions import cumsum as cumsum
from ._ops.reductions import log_softmax as log_softmax
from ._ops.reductions import logsumexp as logsumexp
from ._ops.reductions import max as max
from ._ops.reductions import mean as mean
from ._ops.reductions import min as min
from ._ops.reductions import prod as prod
from ._ops.reductions import softmax as softmax
from ._ops.reductions import std as std
from ._ops.reductions import sum as sum
from ._ops.reductions import var as var
from ._ops.sets import allclose as allclose
from ._ops.sets import array_equal as array_equal
from ._ops.sets import bincount as bincount
from ._ops.sets import nonzero as nonzero
from ._ops.sets import unique as unique
from ._ops.sets import unique_all as unique_all
from ._ops.sets import unique_counts as unique_counts
from ._ops.sets import unique_inverse as unique_inverse
from ._ops.sets import unique_values as unique_values
from ._ops.sets import where as where
from ._ops.shape import broadcast_axis as broadcast_axis
from ._ops.shape import broadcast_to as broadcast_to
from ._ops.shape import flatten_axes as flatten_axes
from ._ops.shape import rearrange as rearrange
from ._ops.shape import rename as rename
from ._ops.shape import split as split
from ._ops.shape import unbind as unbind
from ._ops.shape import unflatten_axis as unflatten_axis
from ._ops.sorting import argsort as argsort
from ._ops.sorting import searchsorted as searchsorted
from ._ops.sorting import sort as sort
from ._ops.sorting import top_k as top_k
from ._ops.tiling import pad as pad
from ._ops.tiling import ravel as ravel
from ._ops.tiling import repeat as repeat
from ._ops.tiling import roll as roll
from ._ops.tiling import tile as tile

# shard_map by name, collectives by logical axis name
from ._partitioning._collectives import all_gather as all_gather
from ._partitioning._collectives import all_to_all as all_to_all
from ._partitioning._collectives import axis_index as axis_index
from ._partitioning._collectives import pmax as pmax
from ._partitioning._collectives import pmean as pmean
from ._partitioning._collectives import pmin as pmin
from ._partitioning._collectives import ppermute as ppermute
from ._partitioning._collectives import psum as psum
from ._partitioning._collectives import psum_scatter as psum_scatter
from ._partitioning._collectives import shard_count as shard_count

# placement: field names, named_jit / fsdp, shard
from ._partitioning._field import field as field
from ._partitioning._named_jit import fsdp as fsdp
from ._partitioning._named_jit import named_jit as named_jit
from ._partitioning._shard import auto_sharded as auto_sharded
from ._partitioning._shard import shard as shard
from ._partitioning._shard_map import shard_map as shard_map

# specs without placing
from ._partitioning._specs import infer_resource_partitions as infer_resource_partitions
from ._partitioning._specs import physical_axis_name as physical_axis_name
from ._partitioning._specs import physical_axis_size as physical_axis_size
from ._partitioning._specs import pspec_for as pspec_for
from ._partitioning._specs import round_axis_for_partitioning as round_axis_for_partitioning
from ._partitioning._specs import sharding_for_axis as sharding_for_axis

# annotations
from ._typing import check_axes as check_axes

__all__ = [name for name in dir() if not name.startswith("_")]
