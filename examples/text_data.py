"""Text for the language-model example: a corpus, a byte-level BPE tokenizer, and sharded batches.

    text = load_text()              # the standard library's source: split, tokenized, cached
    print(text.summary())           # files, bytes, tokens, vocabulary, cache path
    with jax.set_mesh(mesh):
        x = text.train_batch(step, batch=32, length=129, mapping={"batch": "data"})
        # x: NamedArray (batch=32, position=129) of int32 token ids, batch split over `data`

**The corpus** needs no download: by default the ``.py`` files of the Python standard library that
runs this (found through ``sysconfig``), or every UTF-8 text file under a folder you name, or one
text file. Files in hidden folders, ``__pycache__``, ``site-packages`` and ``dist-packages`` are
left out, and so are files that do not decode as UTF-8 or contain a NUL byte.

**The split** is fixed, so every machine holds out the same files for the same Python version: a
file is held out when the SHA-256 of its path relative to the corpus folder (POSIX form, UTF-8),
read as a big-endian integer from its first 8 bytes, is divisible by 20 (one file in 20; about 5%
of the standard library). One text file is cut into 100 pieces of consecutive lines (as equal as
line breaks allow), and every 20th piece (pieces 19, 39, ...) is held out.

**The tokenizer** is a byte-level BPE (GPT-2's pre-tokenizer, no normalization, so whitespace and
code survive a round trip) trained with Hugging Face ``tokenizers`` on the training split, at most
``MAX_TOKENIZER_BYTES`` of it: the training files in the order of their path digests, so the
subset is fixed too. Training is deterministic (same merges on every machine and thread count).
An ``<|endoftext|>`` token separates the files in the token stream. ``tokenizer=PATH`` loads an
existing ``tokenizer.json`` instead.

**The cache**: the tokenizer and both token streams (flat ``uint16`` files when the vocabulary
fits, else ``uint32``, read back as memory maps) live in ``cache_dir/<key>/``. The key is a digest
of the corpus files (paths, sizes, modification times), the split rule, the tokenizer settings or
the given tokenizer's bytes, and ``FORMAT``; a second run with the same inputs loads and starts
at once. A cache folder is written under a temporary name and renamed into place when complete,
so processes that share a disk may build it at the same time.

**Batches** are random windows of ``length`` tokens (``length = seq + 1``: inputs are
``position[:-1]``, targets ``position[1:]``). Row ``i`` of training step ``s`` starts at a
position drawn from NumPy's generator seeded with ``(seed, 0, s, i)``, so a batch depends only on
``(seed, step)``: resuming at a step resumes the data. Every process draws only the rows its devices
hold (``namedaxes.distributed.process_local_indices``) and the global array is assembled by name with
``namedaxes.distributed.from_process_local``; one process or several see the same global batch. Held-out batch
``k`` of ``n`` takes windows spread evenly over the held-out tokens (no randomness): window
``r = k * batch + i`` of ``R = n * batch`` starts at ``r * (N - length) // (R - 1)``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sysconfig
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from caches import cache_root
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

import namedaxes as na

__all__ = ["Corpus", "TextData", "TextDataError", "discover", "load_text", "unigram_entropy"]

FORMAT = 1  # bump when the cache layout or any rule here changes: old caches are then ignored
EOS = "<|endoftext|>"
HELDOUT_EVERY = 20  # one file (or piece of a single file) in 20 is held out
FILE_PIECES = 100  # a single text file is cut into this many pieces of lines
# The BPE trains on this much of the training split at most. On the standard library (31 MB) 8 MiB
# trains in a sixth of the time of all of it, for 0.7% more tokens per byte of held-out text.
MAX_TOKENIZER_BYTES = 8 * 2**20
ENCODE_CHUNK_BYTES = 8 * 2**20  # text encoded per batch while writing the token streams
SKIPPED_FOLDERS = {"__pycache__", "site-packages", "dist-packages"}
TRAIN_STREAM, HELDOUT_STREAM = 0, 1


class TextDataError(ValueError):
    """The corpus, tokenizer or batch request cannot work; the message names the fix."""


# -- the corpus ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Corpus:
    """The text files of a corpus (not yet read).

    Attributes:
        source: The folder or single file the text comes from.
        files: Candidate files (absolute paths), sorted by their path relative to ``source``.
        suffixes: File endings kept (``None``: any file that decodes as UTF-8).
        single_file: Whether ``source`` is one file (split by pieces of lines, not by files).
    """

    source: Path
    files: tuple[Path, ...]
    suffixes: tuple[str, ...] | None
    single_file: bool = False

    def relative(self, path: Path) -> str:
        """``path`` relative to the corpus folder, in POSIX form (a single file: its name)."""
        base = self.source.parent if self.single_file else self.source
        return path.relative_to(base).as_posix()

    def fingerprint(self) -> list[tuple[str, int, int]]:
        """(relative path, size, mtime in ns) of every file: what the cache key sees of the text."""
        return [(self.relative(f), (st := f.stat()).st_size, st.st_mtime_ns) for f in self.files]

    def documents(self, split: str, *, by_digest: bool = False) -> Iterator[tuple[str, str]]:
        """``(name, text)`` of the ``"train"`` or ``"heldout"`` documents, read one at a time.

        In path order, or with ``by_digest`` in the order of the names' SHA-256 digests (a fixed
        order unrelated to folders, for taking a representative subset). Files that do not
        decode as UTF-8 or contain a NUL byte are skipped.
        """
        if split not in ("train", "heldout"):
            raise TextDataError(f"split must be 'train' or 'heldout', got {split!r}.")
        want_heldout = split == "heldout"
        if self.single_file:
            text = _read_text(self.source)
            if text is None:
                raise TextDataError(f"{self.source} is not UTF-8 text; pass a text file.")
            name = self.relative(self.source)
            pieces = [
                (f"{name}#{i}", piece)
                for i, piece in enumerate(_pieces(text))
                if _piece_is_heldout(i) == want_heldout and piece
            ]
            yield from sorted(pieces, key=lambda p: _digest(p[0])) if by_digest else pieces
            return
        names = [(self.relative(f), f) for f in self.files]
        names = [(rel, f) for rel, f in names if is_heldout(rel) == want_heldout]
        for rel, path in sorted(names, key=lambda n: _digest(n[0])) if by_digest else names:
            if (text := _read_text(path)) is not None:
                yield rel, text


def stdlib_folder() -> Path:
    """The folder of this Python's standard library (``sysconfig``'s ``stdlib`` path)."""
    return Path(sysconfig.get_paths()["stdlib"])


def discover(data: str | os.PathLike | None = None) -> Corpus:
    """The corpus at ``data``: a folder, a text file, or (``None``) the standard library's source.

    Raises:
        TextDataError: if ``data`` does not exist or the folder holds no candidate file.

    Example:
        >>> corpus = discover()  # this Python's standard library, *.py files
        >>> corpus.suffixes, len(corpus.files) > 100
        (('.py',), True)
    """
    if data is None:
        source, suffixes = stdlib_folder(), (".py",)
    else:
        source, suffixes = Path(data).expanduser().resolve(), None
        if not source.exists():
            raise TextDataError(f"--data {data}: no such file or folder.")
    if source.is_file():
        return Corpus(source, (source,), None, single_file=True)
    files = []
    for folder, subfolders, names in os.walk(source):
        subfolders[:] = [
            d for d in subfolders if not d.startswith(".") and d not in SKIPPED_FOLDERS
        ]
        for name in names:
            path = Path(folder, name)
            if name.startswith(".") or not path.is_file():
                continue
            if suffixes is None or path.suffix in suffixes:
                files.append(path)
    if not files:
        raise TextDataError(f"{source} holds no text files; point --data at a folder of text.")
    files.sort(key=lambda p: p.relative_to(source).as_posix())
    return Corpus(source, tuple(files), suffixes)


def is_heldout(relative_path: str) -> bool:
    """Whether the file at ``relative_path`` (POSIX, relative to the corpus folder) is held out.

    Example:
        >>> is_heldout("collections/abc.py"), is_heldout("collections/__init__.py")
        (True, False)
    """
    return int.from_bytes(_digest(relative_path)[:8], "big") % HELDOUT_EVERY == 0


def _digest(name: str) -> bytes:
    return hashlib.sha256(name.encode("utf-8")).digest()


def _piece_is_heldout(index: int) -> bool:
    return index % HELDOUT_EVERY == HELDOUT_EVERY - 1


def _pieces(text: str) -> list[str]:
    """``text`` cut into ``FILE_PIECES`` runs of whole lines, as equal as line breaks allow."""
    lines = text.splitlines(keepends=True)
    n = len(lines)
    return [
        "".join(lines[i * n // FILE_PIECES : (i + 1) * n // FILE_PIECES])
        for i in range(FILE_PIECES)
    ]


def _read_text(path: Path) -> str | None:
    """The file's text, or ``None`` if it is not UTF-8 or holds a NUL byte (binary)."""
    data = path.read_bytes()
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


# -- the tokenizer and the cache -------------------------------------------------------------------


def _tokenizer_settings(vocab_size: int) -> dict[str, Any]:
    return {
        "model": "bpe",
        "pre_tokenizer": "byte_level",
        "vocab_size": vocab_size,
        "min_frequency": 2,
        "special_tokens": [EOS],
        "max_train_bytes": MAX_TOKENIZER_BYTES,
    }


def _train_tokenizer(corpus: Corpus, vocab_size: int) -> Tokenizer:
    """A byte-level BPE trained on (at most ``MAX_TOKENIZER_BYTES`` of) the training split."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )

    tokenizer.train_from_iterator((text for _, text in tokenizer_documents(corpus)), trainer)
    return tokenizer


def tokenizer_documents(corpus: Corpus) -> Iterator[tuple[str, str]]:
    """The training documents the BPE learns from: in digest order until ``MAX_TOKENIZER_BYTES``.

    The last document may cross the limit; the subset is the same on every machine.
    """
    budget = MAX_TOKENIZER_BYTES
    for name, text in corpus.documents("train", by_digest=True):
        if budget <= 0:
            return
        budget -= len(text.encode("utf-8"))
        yield name, text


def _token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16 if vocab_size <= 2**16 else np.uint32)


def _chunks(documents: Iterator[tuple[str, str]]) -> Iterator[list[str]]:
    """Documents grouped into lists of about ``ENCODE_CHUNK_BYTES`` of text."""
    chunk, size = [], 0
    for _, text in documents:
        chunk.append(text)
        size += len(text)
        if size >= ENCODE_CHUNK_BYTES:
            yield chunk
            chunk, size = [], 0
    if chunk:
        yield chunk


def _encode_split(
    corpus: Corpus, split: str, tokenizer: Tokenizer, path: Path, facts: dict[str, Any]
) -> None:
    """Tokenize one split into the flat file ``path``, an end-of-text token after each document."""
    dtype = _token_dtype(tokenizer.get_vocab_size())
    eos = tokenizer.token_to_id(EOS)
    documents = num_bytes = num_tokens = 0

    def counted() -> Iterator[tuple[str, str]]:
        nonlocal documents, num_bytes
        for name, text in corpus.documents(split):
            documents += 1
            num_bytes += len(text.encode("utf-8"))
            yield name, text

    with open(path, "wb") as out:
        for chunk in _chunks(counted()):
            for encoding in tokenizer.encode_batch_fast(chunk, add_special_tokens=False):
                ids = encoding.ids + ([] if eos is None else [eos])
                np.asarray(ids, dtype=dtype).tofile(out)
                num_tokens += len(ids)
    if num_tokens == 0:
        raise TextDataError(
            f"The {split} split of {corpus.source} is empty ({documents} documents); give more "
            "text (a folder needs files on both sides of the split rule)."
        )
    facts[split] = {"documents": documents, "bytes": num_bytes, "tokens": num_tokens}


def unigram_entropy(tokens: np.ndarray, vocab_size: int) -> float:
    """Entropy (nats per token) of the token frequencies in ``tokens``.

    The loss of the best model that ignores context, on these tokens: a language model must beat it.

    Example:
        >>> round(unigram_entropy(np.array([0, 0, 1, 1]), vocab_size=4), 4)  # ln 2
        0.6931
    """
    counts = np.bincount(np.asarray(tokens), minlength=vocab_size)
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())


def default_cache_dir() -> Path:
    """``$NAMEDAXES_CACHE/text``, else ``$XDG_CACHE_HOME/namedaxes/text`` (``~/.cache`` default)."""
    return cache_root() / "text"


def _cache_key(corpus: Corpus, tokenizer_file: Path | None, vocab_size: int) -> str:
    recipe = {
        "format": FORMAT,
        "source": str(corpus.source),
        "suffixes": corpus.suffixes,
        "files": corpus.fingerprint(),
        "split": {"heldout_every": HELDOUT_EVERY, "file_pieces": FILE_PIECES},
        "tokenizer": (
            hashlib.sha256(tokenizer_file.read_bytes()).hexdigest()
            if tokenizer_file is not None
            else _tokenizer_settings(vocab_size)
        ),
    }
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:24]


def _build(
    corpus: Corpus, tokenizer_file: Path | None, vocab_size: int, folder: Path, key: str
) -> None:
    """Write tokenizer.json, train.bin, heldout.bin and meta.json into ``folder``."""
    if tokenizer_file is not None:
        tokenizer = Tokenizer.from_file(str(tokenizer_file))
    else:
        tokenizer = _train_tokenizer(corpus, vocab_size)
    tokenizer.save(str(folder / "tokenizer.json"))
    facts: dict[str, Any] = {
        "format": FORMAT,
        "key": key,
        "source": str(corpus.source),
        "candidate_files": len(corpus.files),
        "tokenizer": str(tokenizer_file) if tokenizer_file else _tokenizer_settings(vocab_size),
        "vocab_size": tokenizer.get_vocab_size(),
        "dtype": _token_dtype(tokenizer.get_vocab_size()).name,
    }
    for split in ("train", "heldout"):
        _encode_split(corpus, split, tokenizer, folder / f"{split}.bin", facts)
    heldout = np.fromfile(folder / "heldout.bin", dtype=facts["dtype"])
    facts["heldout_unigram_entropy"] = unigram_entropy(heldout, facts["vocab_size"])
    (folder / "meta.json").write_text(json.dumps(facts, indent=1))  # last: marks it complete


# -- loading ---------------------------------------------------------------------------------------


def load_text(
    data: str | os.PathLike | None = None,
    *,
    tokenizer: str | os.PathLike | None = None,
    vocab_size: int = 4096,
    cache_dir: str | os.PathLike | None = None,
) -> TextData:
    """The corpus at ``data``, tokenized, from the cache if it was built before (else built now).

    Args:
        data: A folder, a text file, or ``None`` for the standard library's source.
        tokenizer: A ``tokenizer.json`` to use instead of training a BPE (``vocab_size`` is
            then the tokenizer's own).
        vocab_size: Vocabulary of the BPE trained on the training split.
        cache_dir: Where caches live; default ``default_cache_dir()``.

    Raises:
        TextDataError: if the corpus has no text, a split ends up empty, or ``vocab_size`` is not
            an int above 256.
    """
    corpus = discover(data)
    tokenizer_file = None
    if tokenizer is not None:
        tokenizer_file = Path(tokenizer).expanduser().resolve()
        if not tokenizer_file.is_file():
            raise TextDataError(f"--tokenizer {tokenizer}: no such file (a tokenizer.json).")
    elif not _is_int(vocab_size) or not 257 <= vocab_size <= 2**32:
        raise TextDataError(
            f"vocab_size {vocab_size!r} must be an int above 256 (the bytes) for BPE."
        )
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    key = _cache_key(corpus, tokenizer_file, vocab_size)
    folder = root / key
    from_cache = (folder / "meta.json").is_file()
    if not from_cache:
        root.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=root))
        try:
            _build(corpus, tokenizer_file, vocab_size, scratch, key)
            os.rename(scratch, folder)
        except OSError:
            if not (folder / "meta.json").is_file():  # not another process's finished build
                raise
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    return TextData.open(folder, from_cache=from_cache)


@dataclass(frozen=True, eq=False)
class TextData:
    """A tokenized corpus: the tokenizer, both token streams, and the facts recorded at build.

    Attributes:
        tokenizer: The ``tokenizers.Tokenizer`` (``encode`` / ``decode`` for prompts and samples).
        train: The training split's token ids, a flat read-only memory map.
        heldout: The held-out split's token ids, likewise.
        folder: The cache folder these were read from.
        meta: Corpus facts recorded when the cache was built (files, bytes, tokens, ...).
        from_cache: Whether this run found the cache already built.
    """

    tokenizer: Tokenizer
    train: np.ndarray
    heldout: np.ndarray
    folder: Path
    meta: dict[str, Any]
    from_cache: bool

    @classmethod
    def open(cls, folder: Path, *, from_cache: bool = True) -> TextData:
        """Read a cache folder written by ``load_text``."""
        meta = json.loads((folder / "meta.json").read_text())
        streams = [
            np.memmap(folder / f"{s}.bin", dtype=meta["dtype"], mode="r")
            for s in ("train", "heldout")
        ]
        tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        return cls(tokenizer, *streams, folder=folder, meta=meta, from_cache=from_cache)

    @property
    def vocab_size(self) -> int:
        return int(self.meta["vocab_size"])

    @property
    def eos_id(self) -> int | None:
        """The id of the token that ends each document (``None`` if the tokenizer has none)."""
        return self.tokenizer.token_to_id(EOS)

    @property
    def unigram_entropy(self) -> float:
        """Unigram entropy of the held-out tokens (nats/token): the loss to beat."""
        return float(self.meta["heldout_unigram_entropy"])

    def encode(self, text: str) -> np.ndarray:
        return np.asarray(self.tokenizer.encode(text, add_special_tokens=False).ids, np.int32)

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        return self.tokenizer.decode([int(i) for i in np.asarray(ids).ravel()])

    def summary(self) -> str:
        """Corpus statistics for printing: files, bytes, tokens per split, vocabulary, cache."""
        m = self.meta
        tr, ho = m["train"], m["heldout"]
        files = tr["documents"] + ho["documents"]
        size = tr["bytes"] + ho["bytes"]
        skipped = m["candidate_files"] - files if m["candidate_files"] > 1 else 0
        tokenizer = (
            m["tokenizer"]
            if isinstance(m["tokenizer"], str)
            else "byte-level BPE trained on the training split"
        )
        return "\n".join(
            [
                f"corpus:    {m['source']}: {files:,} documents, {size / 1e6:.1f} MB "
                f"(train {tr['documents']:,} / held-out {ho['documents']:,})"
                + (f"; {skipped:,} files skipped (not UTF-8 text)" if skipped else ""),
                f"tokens:    train {tr['tokens']:,}, held-out {ho['tokens']:,} "
                f"({size / (tr['tokens'] + ho['tokens']):.2f} bytes/token)",
                f"tokenizer: {tokenizer}, vocabulary {self.vocab_size:,}",
                f"baseline:  unigram entropy of the held-out tokens {self.unigram_entropy:.3f} nats/token",
                f"cache:     {self.folder} ({'loaded' if self.from_cache else 'built now'})",
            ]
        )

    # -- batches --------------------------------------------------------------------------------

    def train_batch(
        self,
        step: int,
        *,
        batch: int,
        length: int,
        seed: int = 0,
        mapping: Any = None,
        mesh: Any = None,
    ) -> na.NamedArray:
        """Training batch ``step``: ``batch`` random windows of ``length`` tokens.

        Returns a global NamedArray ``(batch, position)`` of int32 ids placed by ``mapping`` on
        ``mesh`` (defaults: those in force); this process reads only the rows it holds.

        Raises:
            TextDataError: if ``step`` or ``seed`` is not an int >= 0, or the training split is
                shorter than ``length``.
        """
        for what, value in (("step", step), ("seed", seed)):
            if not _is_int(value) or value < 0:  # both seed the windows' NumPy streams
                raise TextDataError(f"train_batch(): {what} must be an int >= 0, got {value!r}.")
        num_starts = _num_starts(self.train, length, "training")

        def starts(rows: np.ndarray) -> np.ndarray:
            return np.array(
                [_random_start(seed, TRAIN_STREAM, step, int(r), num_starts) for r in rows],
                dtype=np.int64,
            )

        return _windows(self.train, starts, batch, length, mapping, mesh)

    def heldout_batch(
        self,
        index: int,
        *,
        batches: int,
        batch: int,
        length: int,
        mapping: Any = None,
        mesh: Any = None,
    ) -> na.NamedArray:
        """Held-out batch ``index`` of ``batches``: windows spread evenly over the held-out split."""
        if not 0 <= index < batches:
            raise TextDataError(f"held-out batch {index} out of range for {batches} batches.")
        num_starts = _num_starts(self.heldout, length, "held-out")
        total = batches * batch

        def starts(rows: np.ndarray) -> np.ndarray:
            r = index * batch + rows.astype(np.int64)
            return r * (num_starts - 1) // max(total - 1, 1)

        return _windows(self.heldout, starts, batch, length, mapping, mesh)


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _num_starts(tokens: np.ndarray, length: int, split: str) -> int:
    if length < 1 or len(tokens) < length:
        raise TextDataError(
            f"The {split} split has {len(tokens):,} tokens, too few for windows of {length}; "
            "use a shorter length or more text."
        )
    return len(tokens) - length + 1


def _random_start(seed: int, stream: int, step: int, row: int, num_starts: int) -> int:
    """Row ``row``'s window start at ``step``: its own NumPy stream seeded by all four numbers."""
    return int(np.random.default_rng((seed, stream, step, row)).integers(num_starts))


def _windows(
    tokens: np.ndarray,
    starts: Callable[[np.ndarray], np.ndarray],
    batch: int,
    length: int,
    mapping: Any,
    mesh: Any,
) -> na.NamedArray:
    """The global (batch, position) array whose row ``i`` is ``tokens[starts(i) :][:length]``.

    Only the rows (and positions) that this process's devices hold are read.
    """
    axes = {"batch": batch, "position": length}
    local = na.distributed.process_local_indices(axes, mapping, mesh)
    offsets = starts(local["batch"])[:, None] + local["position"][None, :]
    ids = np.asarray(tokens[offsets], dtype=np.int32)
    return na.distributed.from_process_local(na.named(ids, ("batch", "position")), mapping, mesh)
