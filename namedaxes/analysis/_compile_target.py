"""Compile a step for a mesh and summarize what XLA says: memory, cost and collectives.

Three places to compile:

* a concrete ``Mesh`` (or a ``{axis: size}`` / ``AbstractMesh`` that fits the local devices):
  here, in this process;
* ``"cpu:data=32,model=8"``: in a child Python process that starts JAX with that many simulated CPU
  devices (``jax_num_cpu_devices``), so the caller's JAX (already started, with its own device
  count) is untouched;
* ``"tpu-v5e-256:data=32,model=8"``: in a child process, for that TPU slice through JAX's topology
  API (``jax.experimental.topologies``), which needs ``libtpu`` (``pip install 'namedaxes[tpu]'``)
  but no TPU.

The child gets the step and its abstract arguments by ``pickle``: the step must be importable (a
module-level function, or a ``"module:function"`` string); the caller's ``sys.path`` is passed on
so test and script modules import there too. Arguments travel as ``ShapeDtypeStruct`` trees and
their specs as ``PartitionSpec``s; shardings are rebuilt on the child's mesh.

Compiled meshes use ``AxisType.Auto`` axes when this module builds them (targets and size
mappings), so any step compiles whether or not it was written for sharding in types.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import json
import math
import os
import pickle
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from .._array import NamedArray
from .._errors import (
    CompileTargetError,
    DeviceOutOfMemoryError,
    NamedAxesError,
    PlanError,
    format_mesh,
)
from .._logical._context import axis_mapping
from .._mesh import mesh_axis_sizes
from .._partitioning._specs import pspec_for
from ..rules._base import packed_bytes
from ._report import compile_checked, memory_figures, out_of_memory_error

__all__ = [
    "CompileTarget",
    "compile_step",
    "compile_steps",
    "parse_axis_sizes",
    "parse_target",
    "parse_collectives",
]

# -- targets -----------------------------------------------------------------------------------

# Chips per slice -> ICI topology. v5e/v6e slices are named by chips (2-D tori); v4/v5p by
# TensorCores, two per chip, run as one "megacore" device per chip (3-D tori).
_TOPO_2D = {
    1: "1x1",
    4: "2x2",
    8: "2x4",
    16: "4x4",
    32: "4x8",
    64: "8x8",
    128: "8x16",
    256: "16x16",
}
_TOPO_3D = {
    4: "2x2x1",
    8: "2x2x2",
    16: "2x2x4",
    32: "2x4x4",
    64: "4x4x4",
    128: "4x4x8",
    256: "4x8x8",
    512: "8x8x8",
    1024: "8x8x16",
    2048: "8x16x16",
    4096: "16x16x16",
}
_GENERATIONS = {"v5e": "2d", "v6e": "2d", "v4": "3d", "v5p": "3d"}
_TPU_INSTALL = "pip install 'namedaxes[tpu]'"


@dataclasses.dataclass(frozen=True)
class CompileTarget:
    """A parsed compile target: where to compile, and the mesh axes it names.

    Attributes:
        text: The string it was parsed from.
        platform: ``"cpu"`` or ``"tpu"``.
        sizes: ``{mesh_axis: size}`` in the order given.
        topology: For TPU, the topology name JAX's topology API takes (``"v5e:16x16"``).
    """

    text: str
    platform: str
    sizes: dict[str, int]
    topology: str | None = None

    @property
    def num_devices(self) -> int:
        """How many devices the mesh spans."""
        return math.prod(self.sizes.values())


# "data:32,model:8": parse_mesh_from_string's form, which a mesh given as text here spells with "=".
_COLON_AXES = re.compile(r"\s*[A-Za-z_]\w*\s*:\s*\d+\s*(,\s*[A-Za-z_]\w*\s*:\s*\d+\s*)*")


def _with_equals(text: str) -> str | None:
    """``"data=32,model=8"`` for mesh axes written ``"data:32,model:8"``, else ``None``."""
    if _COLON_AXES.fullmatch(text) is None:
        return None
    return ",".join("".join(part.split()).replace(":", "=") for part in text.split(","))


def parse_axis_sizes(text: str, *, what: str | None = None) -> dict[str, int]:
    """``"data=32,model=8"`` as ``{"data": 32, "model": 8}``.

    Args:
        text: The mesh axes.
        what: How the error messages name ``text``; default ``mesh 'TEXT'``.

    Raises:
        CompileTargetError: naming the bad part, for anything but ``name=int`` pairs (for
            ``data:32,model:8``, saying to write ``data=32,model=8``).

    Example:
        >>> parse_axis_sizes("data=4,model=2")
        {'data': 4, 'model': 2}
    """
    what = what or f"mesh {text!r}"
    sizes: dict[str, int] = {}
    for part in text.split(","):
        name, eq, size = part.strip().partition("=")
        name = name.strip()
        if not eq or not name.isidentifier() or not size.strip().isdigit() or int(size) < 1:
            fixed = _with_equals(text)
            fix = (
                f"Write the mesh axes with '=': {fixed!r}."
                if fixed
                else "Write the mesh axes as e.g. 'data=32,model=8'."
            )
            raise CompileTargetError(
                f"Cannot read {what}: {part.strip()!r} is not 'axis=size' with a positive "
                f"integer size. {fix}"
            )
        if name in sizes:
            raise CompileTargetError(f"Cannot read {what}: mesh axis {name!r} appears twice.")
        sizes[name] = int(size)
    return sizes


def parse_target(text: str) -> CompileTarget:
    """Parse ``"cpu:data=32,model=8"`` or ``"tpu-v5e-256:data=32,model=8"``.

    TPU slices are named as Google Cloud names them: ``tpu-v5e-N`` / ``tpu-v6e-N`` with N chips,
    ``tpu-v4-N`` / ``tpu-v5p-N`` with N TensorCores (N/2 chips, one device per chip); a topology
    may also be given outright, ``tpu-v5p:4x4x8``. The mesh must use every device of the slice.

    Raises:
        CompileTargetError: for an unknown platform or slice, a malformed axis list, or a mesh
            whose size differs from the slice's device count.

    Example:
        >>> parse_target("cpu:data=4,model=2").num_devices
        8
        >>> parse_target("tpu-v5e-256:data=32,model=8").topology
        'v5e:16x16'
    """
    where, colon, axes = text.partition(":")
    if where.startswith("tpu-") and ":" in axes and "=" not in axes.split(":", 1)[0]:
        topo, _, axes = axes.partition(":")  # "tpu-v5p:4x4x8:data=..,model=.."
        where = f"{where}:{topo}"
    if not colon or not axes:
        raise CompileTargetError(
            f"Cannot read compile target {text!r}: expected 'PLATFORM:axis=size,...', e.g. "
            "'cpu:data=32,model=8' or 'tpu-v5e-256:data=32,model=8'."
        )
    if where != "cpu" and not where.startswith("tpu-"):  # the platform first: 'data:32' has none
        fixed = _with_equals(text)
        if fixed is not None:
            raise CompileTargetError(
                f"Cannot read {text!r}: text with ':' is a compile target 'PLATFORM:axis=size,...', "
                f"and {where.strip()!r} is no platform. Write the mesh axes with '=': {fixed!r} (or "
                f"'cpu:{fixed}' to compile on simulated CPU devices)."
            )
        raise CompileTargetError(
            f"Unknown compile target platform {where!r} in {text!r}. Use 'cpu' (simulated CPU "
            "devices) or a TPU slice such as 'tpu-v5e-256'."
        )
    sizes = parse_axis_sizes(axes, what=f"the mesh axes {axes!r} of compile target {text!r}")
    if where == "cpu":
        return CompileTarget(text, "cpu", sizes)
    topology, devices = _tpu_topology(where[4:], text)
    target = CompileTarget(text, "tpu", sizes, topology)
    if target.num_devices != devices:
        raise CompileTargetError(
            f"Compile target {text!r} has {devices} devices but the mesh "
            f"{format_mesh(sizes)} spans {target.num_devices}. Give mesh axes whose sizes "
            f"multiply to {devices}."
        )
    return target


def _tpu_topology(name: str, text: str) -> tuple[str, int]:
    m = re.fullmatch(r"(v\d+[a-z]?)(?:-(\d+)|:(\d+(?:x\d+)+))", name)
    if m is None or m[1] not in _GENERATIONS:
        raise CompileTargetError(
            f"Unknown TPU slice {name!r} in {text!r}. Known: tpu-v5e-N, tpu-v6e-N (N chips), "
            "tpu-v4-N, tpu-v5p-N (N TensorCores), or a topology such as tpu-v5p:4x4x8."
        )
    gen, count, shape = m[1], m[2], m[3]
    if shape is not None:
        return f"{gen}:{shape}", math.prod(int(d) for d in shape.split("x"))
    chips = int(count) if _GENERATIONS[gen] == "2d" else int(count) // 2
    table = _TOPO_2D if _GENERATIONS[gen] == "2d" else _TOPO_3D
    if chips not in table or (_GENERATIONS[gen] == "3d" and int(count) % 2):
        raise CompileTargetError(
            f"Unknown slice size in {name!r} ({text!r}). Known sizes for {gen}: "
            + ", ".join(str(c if _GENERATIONS[gen] == "2d" else 2 * c) for c in table)
            + f"; or give the topology outright, e.g. tpu-{gen}:{next(iter(table.values()))}."
        )
    return f"{gen}:{table[chips]}", chips


def require_libtpu() -> None:
    """Raise ``CompileTargetError`` unless ``libtpu`` can be imported."""
    if importlib.util.find_spec("libtpu") is None:
        raise CompileTargetError(
            "Compiling for a TPU slice needs libtpu (JAX's TPU compiler), which is not installed. "
            f"Install it with {_TPU_INSTALL}, or plan on simulated CPU devices with a "
            "'cpu:data=...,model=...' target."
        )


# -- arguments and shardings -------------------------------------------------------------------


def _abstract(x: Any) -> Any:
    """A sharding-free ``ShapeDtypeStruct`` for array leaves (picklable, mesh-independent)."""
    if hasattr(x, "shape") and hasattr(x, "dtype") and not isinstance(x, type):
        return jax.ShapeDtypeStruct(tuple(x.shape), x.dtype)
    return x


def leaf_specs(args: Any, rules: Any, sizes: Mapping[str, int]) -> list[PartitionSpec | None]:
    """One spec per leaf of ``jax.tree.leaves(args)`` (``None``: not an array), from ``pspec_for``.

    Leaves without named axes (plain arrays, scalars) are replicated.
    """
    spec_tree = pspec_for(args, rules, mesh=dict(sizes))
    outer = jax.tree_util.tree_structure(args, is_leaf=lambda n: isinstance(n, NamedArray))
    specs = []
    for node, spec in zip(
        jax.tree_util.tree_leaves(args, is_leaf=lambda n: isinstance(n, NamedArray)),
        outer.flatten_up_to(spec_tree),
    ):
        inner = jax.tree_util.tree_leaves(node)  # a NamedArray holds one leaf (none if emptied)
        for leaf in inner:
            is_array = hasattr(leaf, "shape") and hasattr(leaf, "dtype")
            specs.append((spec if spec is not None else PartitionSpec()) if is_array else None)
    return specs


def _place(args: Any, specs: list[PartitionSpec | None], mesh: Mesh) -> Any:
    leaves, treedef = jax.tree_util.tree_flatten(args)
    out = [
        jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(mesh, s))
        if s is not None
        else x
        for x, s in zip(leaves, specs)
    ]
    return treedef.unflatten(out)


def import_object(spec: str, *, bad_form: str, hint: str) -> Any:
    """The object a ``"module:name.attr"`` string names (the CLI's factory, a step by name).

    Raises:
        PlanError: ``bad_form`` when the string is not ``module:name``; naming the import error
            and ``hint`` when it cannot be loaded.
    """
    module, colon, name = spec.partition(":")
    if not colon or not module or not name:
        raise PlanError(bad_form)
    try:
        obj: Any = importlib.import_module(module)
        for part in name.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as e:
        raise PlanError(f"Cannot load {spec!r}: {e}. {hint}") from e
    return obj


def _resolve_step(step: Any) -> Callable[..., Any]:
    if isinstance(step, str):
        return import_object(  # type: ignore[no-any-return]
            step,
            bad_form=f"step {step!r} must be 'module:function', e.g. 'mytrain:train_step'.",
            hint="Check the module is on sys.path.",
        )
    if not callable(step):
        raise PlanError(f"step must be a function or 'module:function', got {step!r}.")
    return step


# -- compiling ---------------------------------------------------------------------------------

# An HLO element type's width is the number after its letters (s4, bf16, f8e4m3fn, f4e2m1fn,
# c64); pred takes a byte. XLA packs 1-, 2- and 4-bit types (rounding a buffer up to a byte).
_HLO_WIDTH = re.compile(r"[a-z]+([0-9]+)")
_COLLECTIVE = re.compile(
    r"=\s*(?P<shape>\([^=]*?\)|[a-z0-9]+\[[0-9,]*\](?:\{[^}]*\})?)\s+"
    r"(?P<op>all-gather|all-reduce|reduce-scatter|all-to-all|ragged-all-to-all|collective-permute|"
    r"collective-broadcast)(?P<start>-start)?\("
)
_ARRAY = re.compile(r"\b([a-z]+[0-9]*[a-z0-9]*)\[([0-9,]*)\]")


def _hlo_bits(dtype: str) -> int:
    m = _HLO_WIDTH.match(dtype)
    if m is None:
        return 8 if dtype == "pred" else 32  # an unknown type: count it as a 32-bit one
    bits = int(m[1])
    return bits if bits >= 8 or bits in (1, 2, 4) else 8


def _shape_bytes(dtype: str, dims: str) -> int:
    return packed_bytes(math.prod(int(d) for d in dims.split(",") if d), _hlo_bits(dtype))


def parse_collectives(hlo_text: str) -> list[dict[str, Any]]:
    """Collectives in compiled HLO text: ``[{"kind", "count", "bytes"}]``, most bytes first.

    ``bytes`` sums each collective's result size on one device (for asynchronous ``-start`` ops
    other than all-reduce, the largest buffer of the tuple, which is the result). Counts are
    static: a collective inside a loop body (``scan`` over layers) counts once.

    Example:
        >>> parse_collectives("x = f32[8,4]{1,0} all-gather(f32[2,4]{1,0} y), dimensions={0}")
        [{'kind': 'all-gather', 'count': 1, 'bytes': 128}]
    """
    found: dict[str, list[int]] = {}
    for m in _COLLECTIVE.finditer(hlo_text):
        sizes = [_shape_bytes(d, s) for d, s in _ARRAY.findall(m["shape"])]
        op = m["op"]
        nbytes = max(sizes, default=0) if m["start"] and op != "all-reduce" else sum(sizes)
        slot = found.setdefault(op, [0, 0])
        slot[0] += 1
        slot[1] += nbytes
    out = [{"kind": k, "count": c, "bytes": b} for k, (c, b) in found.items()]
    return sorted(out, key=lambda d: (-d["bytes"], d["kind"]))


def _cost(compiled: Any) -> dict[str, float]:
    try:
        cost = compiled.cost_analysis()
    except Exception:  # some backends do not implement it; the plan shows no cost then
        return {}
    if isinstance(cost, (list, tuple)):
        cost = cost[0] if cost else {}
    if not isinstance(cost, Mapping):
        return {}
    return {
        "flops": float(cost.get("flops", 0.0)),
        "bytes_accessed": float(cost.get("bytes accessed", 0.0)),
    }


def summarize_compiled(
    step: Any, args: Any, specs: list[Any], mesh: Mesh, rules: Any
) -> dict[str, Any]:
    """Compile ``step(*args)`` with ``specs`` on ``mesh`` under ``rules``; memory, cost, collectives."""
    fn = _resolve_step(step)
    placed = _place(args, specs, mesh)
    lower = getattr(fn, "lower", None)
    if lower is None:
        lower = jax.jit(fn, keep_unused=True).lower
    with jax.set_mesh(mesh), axis_mapping(rules):  # part of jax.jit's key: a trace per mapping
        lowered = lower(*placed)
    compiled = compile_checked(lowered.compile)
    return {
        "memory": memory_figures(compiled),
        "cost": _cost(compiled),
        "collectives": parse_collectives(compiled.as_text() or ""),
    }


def _local_mesh(mesh: Any) -> Mesh:
    if isinstance(mesh, Mesh):
        return mesh
    sizes = mesh_axis_sizes(mesh)
    n = math.prod(sizes.values())
    devices = jax.devices()
    if len(devices) < n:
        axes = ",".join(f"{k}={v}" for k, v in sizes.items())
        raise CompileTargetError(
            f"Compiling the step on {format_mesh(sizes)} needs {n} devices but this process has "
            f"{len(devices)} ({jax.default_backend()}). Pass mesh='cpu:{axes}' to compile on {n} "
            "simulated CPU devices in a subprocess, or a TPU target such as 'tpu-v5e-256:...'."
        )
    types = getattr(mesh, "axis_types", None) or (AxisType.Auto,) * len(sizes)
    grid = np.asarray(devices[:n], dtype=object).reshape(tuple(sizes.values()))
    return Mesh(grid, tuple(sizes), axis_types=tuple(types))


def compile_step(
    step: Any, args: Any, rules: Any, mesh: Any, *, timeout: float = 900.0
) -> dict[str, Any]:
    """Compile ``step(*args)`` with ``args`` laid out by ``rules`` on ``mesh`` (or a target).

    Returns:
        ``{"memory": compiled_memory's dict, "cost": {"flops", "bytes_accessed"},
        "collectives": parse_collectives(...)}``.

    Raises:
        DeviceOutOfMemoryError: if XLA refuses the program for lack of device memory.
        CompileTargetError: if the mesh does not fit the local devices, ``libtpu`` is missing for
            a TPU target, the step fails to trace or compile, or the compiling subprocess fails
            (the error is quoted).
    """
    (result,) = compile_steps(step, args, [rules], mesh, timeout=timeout)
    if isinstance(result, Exception):
        raise result
    return result


def compile_steps(
    step: Any, args: Any, rules_list: list[Any], mesh: Any, *, timeout: float = 900.0
) -> list[dict[str, Any] | DeviceOutOfMemoryError]:
    """:func:`compile_step` for several layouts at once (one subprocess for a target).

    An out-of-memory refusal is returned in its layout's slot (so one layout that does not fit
    does not hide the others); every other failure raises: a failure of the step itself as
    ``CompileTargetError`` quoting it, locally as from the compiling subprocess.
    """
    abstract = jax.tree.map(_abstract, args)
    if isinstance(mesh, CompileTarget):
        if mesh.platform == "tpu":
            require_libtpu()
        jobs = [(leaf_specs(args, rules, mesh.sizes), rules) for rules in rules_list]
        return _compile_in_child(step, abstract, jobs, mesh, timeout)
    local = _local_mesh(mesh)
    sizes = mesh_axis_sizes(local)
    out: list[dict[str, Any] | DeviceOutOfMemoryError] = []
    for rules in rules_list:
        specs = leaf_specs(args, rules, sizes)
        try:
            out.append(summarize_compiled(step, abstract, specs, local, rules))
        except DeviceOutOfMemoryError as e:
            out.append(e)
        except NamedAxesError:
            raise  # already typed, naming what to fix
        except Exception as e:  # the step's own failure: typed, as the compiling subprocess says it
            raise CompileTargetError(
                f"Compiling the step on {format_mesh(sizes)} failed: {type(e).__name__}: {e}. "
                "Fix the step: it raised this when traced on the example arguments (args, "
                "default (tree,)) laid out by the rules."
            ) from e
    return out


# -- the child process ---------------------------------------------------------------------------


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["JAX_PLATFORMS"] = "cpu"
    # The child sets its own device count; a forced count inherited from the caller would clash.
    flags = re.sub(r"--xla_force_host_platform_device_count=\S+", "", env.get("XLA_FLAGS", ""))
    env["XLA_FLAGS"] = flags.strip()
    # Compile-only use of libtpu: the caller may hold libtpu's lock (any JAX process that found
    # libtpu does), and nothing here runs on a TPU.
    env.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    paths = [p if p else os.getcwd() for p in sys.path]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    return env


def _compile_in_child(
    step: Any, args: Any, jobs: list[tuple[list[Any], Any]], target: CompileTarget, timeout: float
) -> list[dict[str, Any] | DeviceOutOfMemoryError]:
    if callable(step) and getattr(step, "__module__", None) == "__main__":
        raise CompileTargetError(
            f"The step {getattr(step, '__name__', step)!r} is defined in __main__, which the "
            f"compiling subprocess for {target.text!r} cannot import. Move it into a module, or "
            "pass it as 'module:function'."
        )
    payload = {"step": step, "args": args, "jobs": jobs, "target": target}
    with tempfile.TemporaryDirectory(prefix="namedaxes-plan-") as tmp:
        src, dst = os.path.join(tmp, "in.pkl"), os.path.join(tmp, "out.json")
        try:
            with open(src, "wb") as f:
                pickle.dump(payload, f)
        except (pickle.PicklingError, AttributeError, TypeError) as e:
            raise CompileTargetError(
                f"Cannot send the step to the compiling subprocess for {target.text!r}: {e}. "
                "Give a module-level (importable) function, or the step as 'module:function'."
            ) from e
        code = "from namedaxes.analysis._compile_target import child_main; child_main()"
        try:
            proc = subprocess.run(
                [sys.executable, "-c", code, src, dst, target.platform, str(target.num_devices)],
                env=_child_env(),
                capture_output=True,
                text=True,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired as e:
            raise CompileTargetError(
                f"Compiling for {target.text!r} took longer than {timeout:.0f} s; pass a larger "
                "timeout or a smaller model."
            ) from e
        if not os.path.exists(dst):
            tail = "\n".join((proc.stderr or "").strip().splitlines()[-15:])
            raise CompileTargetError(
                f"The compiling subprocess for {target.text!r} failed (exit {proc.returncode}):\n{tail}"
            )
        with open(dst) as f:
            results = json.load(f)
    out: list[dict[str, Any] | DeviceOutOfMemoryError] = []
    for result in results:
        if "oom" in result:
            out.append(
                out_of_memory_error(RuntimeError(result["oom"]))
                or DeviceOutOfMemoryError(
                    result["oom"], used_bytes=None, capacity_bytes=None, xla_message=result["oom"]
                )
            )
        elif "error" in result:
            raise CompileTargetError(
                f"Compiling the step for {target.text!r} failed in the subprocess: {result['error']}"
            )
        else:
            out.append(result)
    return out


def _target_mesh(target: CompileTarget) -> Mesh:
    shape, names = tuple(target.sizes.values()), tuple(target.sizes)
    if target.platform == "cpu":
        devices = jax.devices()[: target.num_devices]
    else:
        from jax.experimental import topologies

        devices = topologies.get_topology_desc(
            target.topology, "tpu", **_tpu_kwargs(target)
        ).devices
    grid = np.asarray(devices, dtype=object).reshape(shape)
    return Mesh(grid, names, axis_types=(AxisType.Auto,) * len(names))


def _tpu_kwargs(target: CompileTarget) -> dict[str, Any]:
    gen = (target.topology or "").split(":")[0]
    return {"chip_config_name": "megacore"} if _GENERATIONS.get(gen) == "3d" else {}


def child_main() -> None:
    """Entry point of the compiling subprocess: read the pickle, compile each job, write JSON."""
    src, dst, platform, devices = sys.argv[1:5]
    if platform == "cpu":  # before anything (unpickling imports the step's module) starts JAX
        jax.config.update("jax_num_cpu_devices", int(devices))
    results: list[dict[str, Any]] = []
    try:
        with open(src, "rb") as f:
            payload = pickle.load(f)
        mesh = _target_mesh(payload["target"])
        for specs, rules in payload["jobs"]:
            try:
                results.append(
                    summarize_compiled(payload["step"], payload["args"], specs, mesh, rules)
                )
            except DeviceOutOfMemoryError as e:
                results.append({"oom": e.xla_message})
    except Exception as e:  # reported to the parent, which raises a typed error quoting it
        results.append({"error": f"{type(e).__name__}: {e}"})
    with open(dst, "w") as f:
        json.dump(results, f)
