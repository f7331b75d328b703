"""The safetensors format, read by slices and written tensor by tensor.

A file is an 8-byte little-endian header length, a JSON header (``{name: {"dtype", "shape",
"data_offsets"}}`` plus ``"__metadata__"``) and the tensors' bytes, row-major. Reading a block maps
the rows it spans and copies the block out, so only the pages that hold it are read; writing
streams one tensor at a time, so neither ever holds more than one tensor's bytes. Only data is read: no
pickle, no code. NumPy's bfloat16 and float8 types are JAX's (``jnp.bfloat16``...).
"""

from __future__ import annotations

import json
import math
import mmap
import os
import struct
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, BinaryIO

import jax.numpy as jnp
import numpy as np

from .._errors import CheckpointError, CheckpointNotFoundError, CheckpointStructureError

__all__ = ["Checkpoint", "SafetensorsFile", "TensorInfo", "write_safetensors"]

DTYPES: dict[str, np.dtype[Any]] = {
    "F64": np.dtype(np.float64),
    "F32": np.dtype(np.float32),
    "F16": np.dtype(np.float16),
    "BF16": np.dtype(jnp.bfloat16),
    "F8_E4M3": np.dtype(jnp.float8_e4m3fn),
    "F8_E5M2": np.dtype(jnp.float8_e5m2),
    "I64": np.dtype(np.int64),
    "I32": np.dtype(np.int32),
    "I16": np.dtype(np.int16),
    "I8": np.dtype(np.int8),
    "U64": np.dtype(np.uint64),
    "U32": np.dtype(np.uint32),
    "U16": np.dtype(np.uint16),
    "U8": np.dtype(np.uint8),
    "BOOL": np.dtype(np.bool_),
}
CODES = {v: k for k, v in DTYPES.items()}
INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"


class TensorInfo:
    """Where one tensor's bytes are: its file, dtype, shape and absolute byte offset."""

    __slots__ = ("dtype", "file", "offset", "shape")

    def __init__(
        self, file: SafetensorsFile, dtype: np.dtype[Any], shape: tuple[int, ...], offset: int
    ):
        self.file, self.dtype, self.shape, self.offset = file, dtype, shape, offset


class SafetensorsFile:
    """One ``.safetensors`` file: its header parsed, tensors read by slices of their first dim."""

    def __init__(self, path: Path):
        self.path = path
        self._fh: BinaryIO | None = None
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) != 8:
                raise CheckpointError(f"{path} is not a safetensors file (shorter than 8 bytes).")
            (n,) = struct.unpack("<Q", head)
            if n > 100 * 2**20:
                raise CheckpointError(f"{path}: a header of {n} bytes; not a safetensors file.")
            try:
                header = json.loads(f.read(n))
            except ValueError:
                raise CheckpointError(
                    f"{path}: the header is not JSON; not a safetensors file."
                ) from None
        self.metadata: dict[str, str] = header.pop("__metadata__", None) or {}
        self.tensors: dict[str, TensorInfo] = {}
        size = path.stat().st_size
        for name, entry in header.items():
            code = entry.get("dtype")
            if code not in DTYPES:
                raise CheckpointError(
                    f"{path}: tensor {name!r} has dtype {code!r}, which is not supported "
                    f"(supported: {', '.join(DTYPES)})."
                )
            begin, end = entry["data_offsets"]
            shape = tuple(int(d) for d in entry["shape"])
            if (
                8 + n + int(end) > size
                or int(end) - int(begin) != math.prod(shape) * DTYPES[code].itemsize
            ):
                raise CheckpointError(
                    f"{path}: tensor {name!r} ({code}{list(shape)}) does not fit its byte range "
                    f"{[begin, end]} in a file of {size} bytes; the file is truncated or damaged."
                )
            self.tensors[name] = TensorInfo(self, DTYPES[code], shape, 8 + n + int(begin))

    def read(self, info: TensorInfo, index: Sequence[slice]) -> np.ndarray:
        """A copy of the block ``index`` (one slice per dimension, steps of 1) of a tensor here.

        The rows of the first dimension are mapped (``mmap``) and only the block is copied out, so
        only the pages that hold the block are read; the mapping is closed before returning, so
        nothing stays resident but the copy.
        """
        if self._fh is None:
            self._fh = open(self.path, "rb")
        shape = info.shape
        if not shape:
            first, index = slice(0, 1), ()
        else:
            first = slice(*index[0].indices(shape[0])[:2])
        rows = first.stop - first.start
        row_bytes = math.prod(shape[1:]) * info.dtype.itemsize
        begin = info.offset + first.start * row_bytes
        length = rows * row_bytes
        if length == 0:
            return np.empty((0,) + shape[1:], info.dtype)[(slice(None),) + tuple(index[1:])]
        aligned = begin - begin % mmap.ALLOCATIONGRANULARITY
        with mmap.mmap(
            self._fh.fileno(), begin - aligned + length, offset=aligned, access=mmap.ACCESS_READ
        ) as m:
            view = np.frombuffer(m, np.uint8, length, begin - aligned).view(info.dtype)
            view = view.reshape((rows,) + shape[1:])
            out = np.array(view[(slice(None),) + tuple(index[1:])])
            del view  # no buffer of the mapping may outlive it
        return out.reshape(()) if not shape else out

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


class Checkpoint:
    """The tensors of a Hugging Face folder: ``model.safetensors`` or a sharded index (a folder with
    both is refused: which one is the model is not known)."""

    def __init__(self, folder: Path):
        index = folder / INDEX
        single = folder / SINGLE
        self.files: list[SafetensorsFile] = []
        self.tensors: dict[str, TensorInfo] = {}
        if index.exists() and single.exists():  # transformers reads one, the index the other
            raise CheckpointStructureError(
                f"{folder} holds both {SINGLE} and {INDEX} (with its shards): two sets of weights, "
                f"and readers disagree on which is the model (transformers' from_pretrained takes "
                f"{SINGLE}). Delete the stale one; save_hf into the folder leaves only what it "
                "wrote."
            )
        if index.exists():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
            except (ValueError, KeyError):
                raise CheckpointError(
                    f"{index} is not a safetensors index (no weight_map)."
                ) from None
            by_file: dict[str, list[str]] = {}
            for name, file in weight_map.items():
                by_file.setdefault(file, []).append(name)
            for file, names in by_file.items():
                if not (folder / file).exists():
                    raise CheckpointNotFoundError(
                        f"{index} names {file} (for {names[0]!r}...), which is not in {folder}."
                    )
                st = SafetensorsFile(folder / file)
                self.files.append(st)
                for name in names:
                    if name not in st.tensors:
                        raise CheckpointStructureError(
                            f"{index} says {name!r} is in {file}, which does not hold it."
                        )
                    self.tensors[name] = st.tensors[name]
        elif single.exists():
            st = SafetensorsFile(single)
            self.files.append(st)
            self.tensors = dict(st.tensors)
        else:
            raise CheckpointNotFoundError(
                f"{folder} has neither {SINGLE} nor {INDEX}. Point from_hf at a folder saved by "
                "transformers' save_pretrained (safetensors) or by save_hf."
            )

    def read(self, name: str, index: Sequence[slice]) -> np.ndarray:
        info = self.tensors[name]
        return info.file.read(info, index)

    def close(self) -> None:
        for f in self.files:
            f.close()


def _header(
    entries: Sequence[tuple[str, np.dtype[Any], tuple[int, ...]]], metadata: dict[str, str]
) -> bytes:
    header: dict[str, Any] = {"__metadata__": metadata}
    offset = 0
    for name, dtype, shape in entries:
        size = math.prod(shape) * dtype.itemsize
        header[name] = {
            "dtype": CODES[dtype],
            "shape": list(shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data starts 8-byte aligned
    return struct.pack("<Q", len(raw)) + raw


def write_safetensors(
    path: Path,
    entries: Sequence[tuple[str, np.dtype[Any], tuple[int, ...]]],
    arrays: Iterable[np.ndarray],
    metadata: dict[str, str],
) -> None:
    """Write ``arrays`` (given one by one, in the order of ``entries``) to ``path``, atomically."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(_header(entries, metadata))
        for (name, dtype, shape), a in zip(entries, arrays, strict=True):
            if a.dtype != dtype or a.shape != shape:
                raise CheckpointError(
                    f"Internal: tensor {name!r} came as {a.dtype}{a.shape}, header says "
                    f"{dtype}{shape}."
                )
            f.write(np.ascontiguousarray(a).reshape(-1).view(np.uint8).data)
    os.replace(tmp, path)
