"""``from_hf``, ``save_hf`` and ``config_from_hf``: Hugging Face folders in and out, sharded on read."""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path
from typing import Any

import equinox as eqx
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec, Sharding, SingleDeviceSharding

from .._array import NamedArray
from .._errors import (
    CheckpointAxisError,
    CheckpointNotFoundError,
    CheckpointStructureError,
    MeshError,
    MeshTypeError,
    ModelConfigError,
    NamedTypeError,
    QuantizationError,
    ShardingError,
    UnsatisfiedAxisError,
    format_names,
)
from .._logical._context import current_axis_mapping, rules_in_force
from .._mesh import context_mesh
from .._partitioning._jit_args import check_live
from .._partitioning._plan import check_matched
from .._partitioning._specs import pspec_for
from ..distributed import process_allgather
from ..nn._precision import POLICY_DTYPES, check_policy_dtype, float_dtype
from ._config import TransformerConfig, runtime_options
from ._families import family_of
from ._layout import Tensor, _get, pick, read_block, tensors_of, to_stored
from ._quantize import is_quantized
from ._safetensors import INDEX, SINGLE, Checkpoint, write_safetensors
from ._transformer import Transformer, mappable_axes

__all__ = ["config_from_hf", "from_hf", "hf_config", "save_hf"]

CONFIG = "config.json"
GENERATION_CONFIG = "generation_config.json"
TOKEN_IDS = ("bos_token_id", "eos_token_id", "pad_token_id")
FUSED_EXPERTS = ".experts.down_proj"  # a tensor only the fused layout of experts has
WEIGHT_SHARD = re.compile(r"model-\d+-of-\d+\.safetensors")  # the shards an index names


def _folder(path: str | os.PathLike[str]) -> Path:
    folder = Path(path)
    if not folder.is_dir():
        raise CheckpointNotFoundError(
            f"{os.fspath(path)!r} is not a folder. Pass the folder that holds config.json and "
            "model.safetensors (as written by save_pretrained or save_hf)."
        )
    return folder


def _from_dict(raw: dict[str, Any], text: str = "", generation: str = "") -> TransformerConfig:
    family = family_of(raw.get("model_type"))
    return TransformerConfig(
        family.model_type, **family.read(raw), hf_config=text, hf_generation_config=generation
    )


def _json_object(file: Path) -> tuple[dict[str, Any], str]:
    """A JSON file holding one object: the object and the text."""
    text = file.read_text()
    try:
        raw = json.loads(text)
    except ValueError as e:
        raise ModelConfigError(f"{file} is not valid JSON: {e}") from None
    if not isinstance(raw, dict):
        raise ModelConfigError(f"{file} holds {type(raw).__name__}, not a JSON object.")
    return raw, text


def config_from_hf(path: str | os.PathLike[str]) -> TransformerConfig:
    """The :class:`TransformerConfig` of a Hugging Face folder, read from its ``config.json``.

    Fields missing from the file take the defaults of that family's ``transformers`` config class;
    RoPE settings are read from ``rope_parameters`` or from a top-level ``rope_theta`` and
    ``rope_scaling`` (older files). A ``generation_config.json`` beside it is kept as
    ``hf_generation_config`` for ``save_hf`` to write back.

    Args:
        path: The folder.

    Raises:
        CheckpointNotFoundError: if the folder or its ``config.json`` is missing.
        ModelConfigError: for an unsupported ``model_type`` (the message lists the supported
            ones) or option, or a ``config.json`` or ``generation_config.json`` that is not a
            JSON object.

    Example:
        >>> import json, tempfile, pathlib
        >>> from namedaxes.models import config_from_hf
        >>> folder = pathlib.Path(tempfile.mkdtemp())
        >>> _ = (folder / "config.json").write_text(json.dumps({"model_type": "mistral",
        ...     "hidden_size": 64, "num_attention_heads": 16, "rope_theta": 1e6}))
        >>> cfg = config_from_hf(folder)  # the rest: MistralConfig's defaults
        >>> cfg.head_dim, cfg.num_kv_heads, cfg.sliding_window, cfg.rope_theta
        (4, 8, 4096, 1000000.0)
    """
    folder = _folder(path)
    file = folder / CONFIG
    if not file.exists():
        raise CheckpointNotFoundError(f"{folder} has no {CONFIG}.")
    raw, text = _json_object(file)
    generation = folder / GENERATION_CONFIG
    return _from_dict(raw, text, _json_object(generation)[1] if generation.is_file() else "")


def hf_config(config: TransformerConfig) -> dict[str, Any]:
    """The ``config.json`` dict that ``transformers`` reads back as ``config``.

    The file the config was read from, when it still describes it; else one written by the
    family's writer.

    Raises:
        ModelConfigError: if the family's ``config.json`` cannot express ``config`` (e.g. a Llama
            with a sliding window).
    """
    config = config.stored()  # how it runs is not part of config.json
    if config.hf_config:
        raw = json.loads(config.hf_config)
        if _from_dict(raw) == config:
            return raw
    family = family_of(config.model_type)
    raw = {
        "architectures": [family.architecture],
        "model_type": family.model_type,
        **family.write(config),
    }
    back = _from_dict(raw)
    if back != config:
        diff = [
            f.name
            for f in dataclasses.fields(config)
            if f.compare and getattr(back, f.name) != getattr(config, f.name)
        ]
        raise ModelConfigError(
            f"A {family.model_type} config.json cannot express this config: "
            f"{format_names(diff)} would read back differently. Use a model_type that has "
            "these options."
        )
    return raw


# -- loading --------------------------------------------------------------------------------


def _shardings(
    model: Any, tensors: list[Tensor], mapping: Any, mesh: Any, strict: bool
) -> list[Sharding]:
    if mesh is not None and not isinstance(mesh, Mesh):
        raise MeshTypeError(
            f"from_hf needs a concrete jax.sharding.Mesh to read arrays onto, got "
            f"{type(mesh).__name__}. Pass mesh=jax.make_mesh(...)."
        )
    if mesh is None:
        found = context_mesh()
        mesh = found if isinstance(found, Mesh) else None
    given = mapping if mapping is not None else current_axis_mapping()
    if given is None:
        if mesh is None:
            return [SingleDeviceSharding(jax.local_devices()[0])] * len(tensors)
        return [NamedSharding(mesh, PartitionSpec())] * len(tensors)
    rules = rules_in_force(given, "from_hf")
    if strict:  # an entry no axis of the model has is a typo that would leave it replicated
        check_matched(rules, mappable_axes(model), "from_hf", "the model")
    if mesh is None:
        raise MeshError(
            f"from_hf has a mapping ({given!r}) but no mesh to place the parameters on. Pass "
            "mesh=..., or call it inside `with jax.set_mesh(mesh):`."
        )
    try:
        specs = pspec_for(model, rules, mesh=mesh)
    except ShardingError as e:
        raise _unsatisfied(e) from None
    return [NamedSharding(mesh, _get(specs, t.path)) for t in tensors]


def _unsatisfied(error: ShardingError) -> ShardingError:
    """``error`` with from_hf's fix when it is an axis that no rule could place: a checkpoint's
    sizes are what they are, so the fix is a fallback rule in a list mapping."""
    if not isinstance(error, UnsatisfiedAxisError):
        return error
    return ShardingError(
        f"from_hf: {error.diagnosis}. A checkpoint's sizes are fixed: {error.fallback_advice()}."
    )


def _make_array(shape: tuple[int, ...], sharding: Sharding, block: Any) -> jax.Array:
    """``jax.make_array_from_callback``, one device at a time: each block read from storage goes to
    its device before the next is read (so the host holds one block, not one per device), and a
    block that several devices hold is read once and copied between devices."""
    arrays: list[jax.Array] = []
    placed: dict[tuple[tuple[int, int], ...], jax.Array] = {}
    for device, index in sharding.addressable_devices_indices_map(shape).items():
        index = index if index is not None else (slice(None),) * len(shape)
        key = tuple(s.indices(n)[:2] for s, n in zip(index, shape))
        if key in placed:
            arrays.append(jax.device_put(placed[key], device))
        else:
            placed[key] = jax.device_put(block(index), device)
            arrays.append(placed[key])
    return jax.make_array_from_single_device_arrays(shape, sharding, arrays)


def _match(checkpoint: Checkpoint, tensors: list[Tensor], config: TransformerConfig) -> None:
    """Check names and shapes; make every expected name readable (a file may omit the base prefix)."""
    family = family_of(config.model_type)
    stored = checkpoint.tensors
    original = set(stored)
    used: set[str] = set()
    missing: list[str] = []
    for t in tensors:
        for index in t.indices():
            name = t.name(index)
            found = name
            if found not in stored and name.startswith(family.base_prefix):
                found = name[len(family.base_prefix) :]
            if found not in stored:
                missing.append(name)
                continue
            used.add(found)
            stored[name] = stored[found]
            info = stored[name]
            if info.shape != t.shape:
                axes = " x ".join("(" + ", ".join(a.name for a in g) + ")" for g in t.groups)
                raise CheckpointAxisError(
                    f"Tensor {name!r} has shape {info.shape}, but the config says {t.shape} "
                    f"({axes}). Check config.json against the weights."
                )
    if missing:
        more = f" and {len(missing) - 8} more" if len(missing) > 8 else ""
        raise CheckpointStructureError(
            f"The checkpoint lacks tensor(s) {format_names(missing[:8])}{more}, which a "
            f"{family.model_type} model with this config.json needs."
        )
    extra = sorted(
        n
        for n in original - used
        if not n.endswith(family.ignored_suffixes)
        and not (config.tie_word_embeddings and n == "lm_head.weight")
    )
    if extra:
        more = f" and {len(extra) - 8} more" if len(extra) > 8 else ""
        raise CheckpointStructureError(
            f"The checkpoint has tensor(s) {format_names(extra[:8])}{more} that a "
            f"{family.model_type} model with this config.json does not use. Check model_type "
            "and the options in config.json."
        )


def _param_dtype(value: Any) -> Any:
    """from_hf's ``dtype``: a dtype layers keep parameters in, by the precision policy's check."""
    dtype = float_dtype(value, "from_hf dtype=", "from_hf dtype must be")
    if dtype is None:
        return None
    try:
        check_policy_dtype("from_hf dtype", dtype)
    except NamedTypeError:
        if dtype.name in POLICY_DTYPES:  # float64 with 64-bit floats off: that message says it
            raise
        # float8 and narrower: the policy's fix (a float8 matmul) is not from_hf's to take
        raise NamedTypeError(
            f"from_hf dtype={dtype.name} is not a dtype layers keep parameters in: use float32, "
            "bfloat16 or float16 (float64 with jax_enable_x64). For float8 weights, load the "
            "model in one of those and quantize it: models.quantize(model, 'float8')."
        ) from None
    return dtype


def from_hf(
    path: str | os.PathLike[str],
    *,
    mapping: Any = None,
    mesh: Mesh | None = None,
    dtype: Any = None,
    strict: bool = True,
    **options: Any,
) -> Transformer:
    """Load a Hugging Face checkpoint folder as a :class:`Transformer`, each parameter read into place.

    The folder holds ``config.json`` and ``model.safetensors`` (or ``model.safetensors.index.json``
    and its shards). With a mapping (given, else the one in force) and a mesh (given, else the one
    set with ``jax.set_mesh``), every parameter is created directly with the sharding the mapping
    gives it (``jax.make_array_from_callback``): each process reads, for each of its devices, only
    the rows of the stored tensors that device holds, so no host ever holds the whole model.
    Without a mapping the parameters are replicated on the mesh, or on one device without a mesh.
    A mixture of experts may store its experts one tensor per expert (what ``save_pretrained``
    writes by default, and older files) or fused in one tensor per layer
    (``save_original_format=False``); both are read.

    A mapping entry whose name is no axis of the model (its parameters', or the activations'
    ``batch``, ``position`` and ``key_position``) is a typo that would leave what it meant to
    split replicated: it raises ``UnmatchedMappingError``, which suggests the closest axis name,
    unless ``strict=False`` (for a mapping that also names axes the model does not have, e.g.
    batch axes of another name).

    Args:
        path: The folder.
        mapping: Logical-to-mesh rules, e.g. ``{"embed": "data", "heads": "model", "mlp":
            "model", "vocab": "model"}``.
        mesh: A concrete ``jax.sharding.Mesh``.
        dtype: Cast floating parameters to this dtype (``jnp.float32``, ``jnp.bfloat16``,
            ``jnp.float16``; ``jnp.float64`` with ``jax_enable_x64``); default: as stored. For
            float8 weights use :func:`quantize` on the loaded model.
        strict: Refuse mapping entries that match no axis of the model (above).
        **options: Runtime options of the config (``TransformerConfig.RUNTIME_FIELDS``), which
            say how the model runs: ``context_strategy`` (``"all_gather"``, ``"ring"``,
            ``"ulysses"``, or ``None``: by sizes), ``context_balance`` (``"zigzag"``, the
            default: a causal ring on a zig-zag layout of the sequence, or ``None``),
            ``moe_dispatch`` (``"auto"``, ``"ragged"``, ``"grouped"``, ``"dense"``,
            ``"capacity"``),
            ``capacity_factor`` (``None``: dropless, as ``transformers``),
            ``gradient_checkpointing`` (``False``, ``"dots"``, ``"carry"``, ...), and, when the
            mapping puts ``layer`` on a mesh axis, ``pipeline_microbatches``,
            ``pipeline_schedule`` (``"gpipe"``, ``"1f1b"``, ``"circular"``) and
            ``pipeline_repeats``. A loaded model changes them with
            ``model.with_options(...)``.

    Raises:
        CheckpointNotFoundError: if the folder, its ``config.json`` or its weights are missing.
        ModelConfigError: for an unsupported ``model_type`` or option.
        CheckpointStructureError: for a tensor the model needs that the files lack, or one they
            hold that the model does not use (both named).
        CheckpointAxisError: for a tensor whose shape disagrees with ``config.json`` (named, with
            both shapes).
        MeshError: for a mapping without a mesh.
        NamedTypeError: for a ``dtype`` that is not a dtype layers keep parameters in (float32,
            bfloat16, float16; float64 only with ``jax_enable_x64``): ``float8_e4m3fn`` points
            to :func:`quantize`.
        UnmatchedMappingError: with ``strict=True``, for a mapping entry that matches no axis of
            the model (named, with the closest axis name and the model's axes).
        ModelConfigError: for an option that is not a runtime option (the message lists them).

    Example:
        >>> import jax, tempfile
        >>> from namedaxes.models import Transformer, TransformerConfig, from_hf, save_hf
        >>> cfg = TransformerConfig("qwen3", vocab_size=64, hidden_size=16, intermediate_size=32,
        ...                         num_layers=2, num_heads=4, num_kv_heads=2, head_dim=4,
        ...                         qk_norm="head")
        >>> folder = tempfile.mkdtemp()
        >>> save_hf(Transformer(cfg, key=jax.random.key(0)), folder)
        >>> with jax.set_mesh(mesh):  # (data=2, model=4)
        ...     model = from_hf(folder, mapping={"embed": "data", "heads": "model"})
        >>> model.layers.stacked.attn.q_proj.weight.array.sharding.spec
        P(None, 'data', 'model', None)
    """
    folder = _folder(path)
    also = ("mapping", "mesh", "dtype", "strict")  # a typo of these lands in options too
    config = runtime_options(config_from_hf(folder), options, "from_hf", also)
    dtype = _param_dtype(dtype)
    abstract = eqx.filter_eval_shape(Transformer, config, key=jax.random.key(0))
    checkpoint = Checkpoint(folder)
    try:
        fused = config.moe and any(n.endswith(FUSED_EXPERTS) for n in checkpoint.tensors)
        tensors = tensors_of(abstract, family_of(config.model_type), fused=fused)
        _match(checkpoint, tensors, config)
        shardings = _shardings(abstract, tensors, mapping, mesh, strict)
        leaves = []
        for t, sharding in zip(tensors, shardings):
            like = _get(abstract, t.path)
            stored = checkpoint.tensors[t.name(t.indices()[0])].dtype
            target = dtype if dtype is not None and np.issubdtype(stored, np.floating) else stored
            shape = tuple(a.size for a in like.axes)

            def block(index: Any, t: Tensor = t, like: Any = like, target: Any = target) -> Any:
                return read_block(checkpoint, t, like.axes, index, target)

            leaves.append(NamedArray(_make_array(shape, sharding, block), like.axes))
    finally:
        checkpoint.close()
    return eqx.tree_at(lambda m: [_get(m, t.path) for t in tensors], abstract, leaves)


# -- saving ---------------------------------------------------------------------------------


def _size(s: int | str) -> int:
    """``max_shard_size`` in bytes: a positive int, or a number and a unit (``"5GB"``)."""
    size = 0
    if isinstance(s, int) and not isinstance(s, bool):
        size = s
    elif isinstance(s, str):
        units = {"KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}
        text = s.strip().upper()
        for unit, factor in units.items():
            if text.endswith(unit) and text[: -len(unit)].strip().replace(".", "", 1).isdigit():
                size = int(float(text[: -len(unit)]) * factor)
                break
    if size > 0:  # "0GB" or "0.0001KB" (0 bytes) is no more a size than 0
        return size
    raise NamedTypeError(
        f"save_hf max_shard_size must be a positive byte count or a string such as '5GB', got {s!r}."
    )


def _stored_value(x: NamedArray, t: Tensor, index: tuple[int, ...]) -> NamedArray:
    return process_allgather(pick(x, t, index))


def save_hf(
    model: Transformer, path: str | os.PathLike[str], *, max_shard_size: int | str = "5GB"
) -> None:
    """Write ``model`` as a Hugging Face folder: ``config.json``, ``generation_config.json`` and
    safetensors weights.

    Tensor names and layouts are exactly those ``transformers`` uses for the family (stacked
    layers written one tensor per layer, GPT-2's q/k/v fused back into ``c_attn``, experts one
    tensor per expert as ``save_pretrained`` writes them by default), so
    ``AutoModelForCausalLM.from_pretrained(path)`` loads it, and ``from_hf(path)`` gives the same
    values bit for bit. Past ``max_shard_size`` the weights are split into
    ``model-0000k-of-0000n.safetensors`` files with a ``model.safetensors.index.json``. Saving into
    a folder that holds an earlier save replaces its weights: the weight files this save does not
    write (a ``model.safetensors``, an index and ``model-*-of-*.safetensors`` shards) are deleted,
    so that no reader finds the old model beside the new one; other files stay. Tensors are
    gathered and written one at a time (one layer's slice of a parameter on the host at once); with
    several processes, every process takes part in the gathers and process ``k`` writes the files
    ``k, k + n, ...``. ``generation_config.json`` (where ``transformers``' ``generate`` takes the
    eos and pad ids from) is the one the model was loaded with (``config.hf_generation_config``),
    else made from the bos, eos and pad token ids of ``config.json``, as ``transformers`` makes it
    from a model config.

    Args:
        model: A :class:`Transformer` (e.g. from :func:`from_hf`, or trained).
        path: The folder (created if needed).
        max_shard_size: Bytes per file (a positive int, or ``"5GB"``, ``"500MB"``...).

    Raises:
        NamedTypeError: for a ``max_shard_size`` that is not a positive size (``0``, ``"0GB"``,
            ``"5 parsecs"``).
        ModelConfigError: if the family's ``config.json`` cannot express ``model.config``.
        DonatedArrayError: for a parameter donated to a step (``named_jit(...,
            donate_args=...)``, ``fsdp``), whose buffer is gone: save the model the step returned.
        QuantizationError: for a model from :func:`quantize` (Hugging Face folders hold the
            weights themselves): save the model it was made from.

    Example:
        >>> import jax, os, tempfile
        >>> from namedaxes.models import Transformer, TransformerConfig, save_hf
        >>> cfg = TransformerConfig("gpt2", vocab_size=64, hidden_size=16, intermediate_size=64,
        ...                         num_layers=2, num_heads=4, num_kv_heads=4, head_dim=4,
        ...                         max_position_embeddings=32, norm="layer", norm_eps=1e-5,
        ...                         activation="gelu_new", gated_mlp=False, mlp_bias=True,
        ...                         qkv_bias=True, out_bias=True, learned_positions=True,
        ...                         tie_word_embeddings=True)
        >>> folder = tempfile.mkdtemp()
        >>> save_hf(Transformer(cfg, key=jax.random.key(0)), folder, max_shard_size="20KB")
        >>> sorted(os.listdir(folder))
        ['config.json', 'generation_config.json', 'model-00001-of-00002.safetensors', 'model-00002-of-00002.safetensors', 'model.safetensors.index.json']
    """
    if not isinstance(model, Transformer):
        raise NamedTypeError(f"save_hf needs a namedaxes.models.Transformer, got {type(model)}.")
    if is_quantized(model):
        raise QuantizationError(
            "save_hf: this model's weights are quantized (models.quantize), and a Hugging Face "
            "folder holds the weights themselves. Save the model it was quantized from "
            "(quantize returns a new model and leaves its argument as it was)."
        )
    check_live(model, "save_hf")
    folder = Path(path)
    config = hf_config(model.config)
    tensors = tensors_of(model, family_of(model.config.model_type))
    limit = _size(max_shard_size)
    # One stored tensor per (name): the parameter(s) it is made of and the layer it holds.
    stored: dict[str, list[tuple[Tensor, tuple[int, ...]]]] = {}
    for t in tensors:
        for at in t.indices():
            stored.setdefault(t.name(at), []).append((t, at))
    order = _hf_order(stored)
    entries = []
    for name in order:
        t, _ = stored[name][0]
        entries.append((name, np.dtype(_get(model, t.path).dtype), t.shape))
    files: list[list[int]] = [[]]
    used = 0
    for i, (_, dt, shape) in enumerate(entries):
        size = int(np.prod(shape)) * dt.itemsize
        if files[-1] and used + size > limit:
            files.append([])
            used = 0
        files[-1].append(i)
        used += size
    n = len(files)
    names = [SINGLE] if n == 1 else [f"model-{k + 1:05d}-of-{n:05d}.safetensors" for k in range(n)]
    me, count = jax.process_index(), jax.process_count()
    if me == 0:
        folder.mkdir(parents=True, exist_ok=True)
    dtypes = {np.dtype(e[1]).name for e in entries}
    dtype = dtypes.pop() if len(dtypes) == 1 else config.get("dtype", config.get("torch_dtype"))
    config = {**config, "dtype": dtype}
    if "torch_dtype" in config:  # transformers 4 reads this name; keep it true, not stale
        config["torch_dtype"] = dtype
    for k, members in enumerate(files):

        def arrays(members: list[int] = members) -> Any:
            for i in members:
                parts = stored[entries[i][0]]
                yield to_stored([(t, _stored_value(_get(model, t.path), t, at)) for t, at in parts])

        if k % count == me:
            folder.mkdir(parents=True, exist_ok=True)
            write_safetensors(
                folder / names[k], [entries[i] for i in members], arrays(), {"format": "pt"}
            )
        else:  # take part in the gathers of the tensors another process writes
            for _ in arrays():
                pass
    if me == 0:
        if n > 1:
            index = {
                "metadata": {
                    "total_size": sum(int(np.prod(s)) * d.itemsize for _, d, s in entries)
                },
                "weight_map": {entries[i][0]: names[k] for k, m in enumerate(files) for i in m},
            }
            (folder / INDEX).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
        _remove_stale_weights(folder, {*names, INDEX} if n > 1 else {SINGLE})
        (folder / CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        generation = _generation_config(model.config, config)
        (folder / GENERATION_CONFIG).write_text(
            json.dumps(generation, indent=2, sort_keys=True) + "\n"
        )


def _remove_stale_weights(folder: Path, written: set[str]) -> None:
    """Delete the weight files of an earlier save in ``folder`` that ``written`` does not replace:
    a stale index (and its shards) would be read instead of the new ``model.safetensors``, and a
    stale ``model.safetensors`` is what ``transformers`` reads before an index. Other files stay."""
    for file in folder.iterdir():
        if file.name not in written and (
            file.name in (SINGLE, INDEX) or WEIGHT_SHARD.fullmatch(file.name)
        ):
            file.unlink()


def _generation_config(config: TransformerConfig, written: dict[str, Any]) -> dict[str, Any]:
    """The ``generation_config.json`` read with ``config``, else one made from the token ids of
    the ``config.json`` dict ``written`` (what ``GenerationConfig.from_model_config`` keeps)."""
    if config.hf_generation_config:
        return json.loads(config.hf_generation_config)
    ids = {k: written[k] for k in TOKEN_IDS if written.get(k) is not None}
    return {"_from_model_config": True, **ids}


def _hf_order(stored: dict[str, Any]) -> list[str]:
    """Stored names in model order: embeddings, layer 0, layer 1, ..., final norm, head."""

    def key(name: str) -> tuple[int, int, tuple[Any, ...]]:
        parts = name.split(".")
        natural = tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in parts)
        for i, p in enumerate(parts[:-1]):
            if p.isdigit() and parts[i - 1] in ("layers", "h"):
                return (1, int(p), natural)
        last = any(s in name for s in ("norm.", "ln_f", "lm_head"))
        return (2 if last else 0, 0, natural)

    return sorted(stored, key=key)
