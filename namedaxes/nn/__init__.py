"""Neural-network layers with named axes: equinox modules whose parameters are NamedArrays.

Every layer documents the axes it reads and creates, works on inputs with any other axes (batch,
position, ...) and, under an ``axis_mapping`` with a mesh, places its parameters and outputs by that
mapping, so the same model runs on one device, on an Auto mesh and on an Explicit mesh.

Example:
    >>> import jax
    >>> import namedaxes as na
    >>> Embed, Mlp = na.Axis("embed", 8), na.Axis("mlp", 32)
    >>> block = na.nn.MLP(Embed, Mlp, key=jax.random.key(0))
    >>> na.nn.RmsNorm(Embed)(block(na.ones({"batch": 2, "embed": 8})))
    NamedArray(float32, batch=2, embed=8)
"""

# layers
from ._attention import Attention as Attention
from ._attention import causal_mask as causal_mask
from ._context_layout import zigzag as zigzag
from ._dot_product_attention import dot_product_attention as dot_product_attention
from ._dropout import Dropout as Dropout
from ._embedding import Embedding as Embedding
from ._kv_cache import KVCache as KVCache
from ._linear import Linear as Linear

# losses
from ._loss import cross_entropy as cross_entropy
from ._loss import one_hot as one_hot
from ._mlp import MLP as MLP
from ._mlp import activation as activation
from ._moe import MoE as MoE
from ._moe import RouterStats as RouterStats
from ._norm import LayerNorm as LayerNorm
from ._norm import RmsNorm as RmsNorm
from ._pipeline import PIPELINE_SCHEDULES as PIPELINE_SCHEDULES

# mixed precision and low-precision formats
from ._precision import MATMUL_RULES as MATMUL_RULES
from ._precision import Precision as Precision
from ._precision import current_precision as current_precision
from ._precision import precision as precision
from ._quantized import QuantizedArray as QuantizedArray
from ._rotary import RopeScaling as RopeScaling
from ._rotary import RotaryEmbedding as RotaryEmbedding
from ._stacked import Stacked as Stacked

__all__ = [
    "MATMUL_RULES",
    "MLP",
    "Attention",
    "Dropout",
    "Embedding",
    "KVCache",
    "LayerNorm",
    "Linear",
    "MoE",
    "PIPELINE_SCHEDULES",
    "QuantizedArray",
    "RmsNorm",
    "RouterStats",
    "Stacked",
    "causal_mask",
    "cross_entropy",
    "dot_product_attention",
    "one_hot",
    "zigzag",
]
