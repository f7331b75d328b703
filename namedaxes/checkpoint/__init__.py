"""Checkpoints of named trees on orbax-checkpoint: save sharded, restore onto any mesh or mapping.

``save``/``restore`` write and read one checkpoint directory; ``CheckpointManager`` keeps numbered,
asynchronous, atomic checkpoints for a training loop; ``to_state_dict``/``from_state_dict`` and
``save_safetensors``/``load_safetensors`` move weights to and from other frameworks.

Needs the ``checkpoint`` extra: ``pip install 'namedaxes[checkpoint]'``. Its errors
(``namedaxes.CheckpointError`` and subclasses) live at the top level with the others, importable
without the extra.
"""

try:
    import orbax.checkpoint as _ocp  # noqa: F401
except ImportError as _e:  # pragma: no cover - depends on the environment
    raise ImportError(
        "namedaxes.checkpoint needs orbax-checkpoint, which is not installed: "
        "pip install 'namedaxes[checkpoint]'"
    ) from _e

from ._io import restore as restore
from ._io import save as save
from ._manager import CheckpointManager as CheckpointManager
from ._state_dict import from_state_dict as from_state_dict
from ._state_dict import load_safetensors as load_safetensors
from ._state_dict import save_safetensors as save_safetensors
from ._state_dict import to_state_dict as to_state_dict

__all__ = [
    "CheckpointManager",
    "from_state_dict",
    "load_safetensors",
    "restore",
    "save",
    "save_safetensors",
    "to_state_dict",
]
