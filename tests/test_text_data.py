"""The language-model example's text pipeline (examples/text_data.py) on a tiny corpus.

Split rule, cache, tokenized streams, unigram entropy, and batches: deterministic by (seed, step),
placed by the mapping, and the same global batch whether one process or two build it.
"""

import doctest
import hashlib
import sys
from pathlib import Path

import numpy as np
import pytest
from _helpers import run_two_processes, shard_shapes, spec_of
from jax.sharding import PartitionSpec as P

pytest.importorskip("tokenizers")

import namedaxes as na

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
if str(EXAMPLES) not in sys.path:
    sys.path.insert(0, str(EXAMPLES))

import text_data as td

WORKER = Path(__file__).with_name("text_data_worker.py")
VOCAB = 300
STDLIB_TEXTS = ["json/decoder.py", "json/encoder.py", "textwrap.py", "string.py", "keyword.py"]
# Names under the tiny corpus folder, and the stdlib files whose text they hold. `doc35.txt` is
# one of the names the rule holds out (so the held-out split is not empty).
NAMES = ["pkg/a.py", "pkg/b.py", "c.py", "doc35.txt", "notes/d.md"]


def oracle_heldout(relative_path: str) -> bool:
    """The documented rule, computed here: SHA-256 of the path, first 8 bytes, big-endian, % 20."""
    digest = hashlib.sha256(relative_path.encode()).digest()
    return int.from_bytes(digest[:8], "big") % 20 == 0


def write_corpus(folder: Path) -> dict[str, str]:
    """A few real text files (from the standard library), plus files the corpus must skip."""
    texts = {}
    for name, source in zip(NAMES, STDLIB_TEXTS):
        text = (td.stdlib_folder() / source).read_text()
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
        texts[name] = text
    (folder / "latin1.py").write_bytes(b"caf\xe9 = 1\n")  # not UTF-8
    (folder / "blob.dat").write_bytes(b"\x00\x01\x02binary")  # NUL bytes
    for hidden in (".git/config", "__pycache__/c.py", ".hidden.txt"):
        (folder / hidden).parent.mkdir(parents=True, exist_ok=True)
        (folder / hidden).write_text("not part of the corpus\n")
    return texts


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("corpus")
    return folder, write_corpus(folder)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def text(corpus_dir, cache_dir):
    return td.load_text(corpus_dir[0], vocab_size=VOCAB, cache_dir=cache_dir)


def test_module_examples_run():
    result = doctest.testmod(td)
    assert result.attempted > 0 and result.failed == 0


# -- the corpus and its split ----------------------------------------------------------------------


def test_split_rule_is_the_documented_hash_of_the_path():
    names = [f"pkg/mod{i}.py" for i in range(200)] + ["collections/abc.py", "json/decoder.py"]
    assert [td.is_heldout(n) for n in names] == [oracle_heldout(n) for n in names]
    assert 0 < sum(map(td.is_heldout, names)) < 30  # about one in 20
    # Pinned: the same files are held out on every machine and in every version of the example.
    assert td.is_heldout("collections/abc.py") and td.is_heldout("doc35.txt")
    assert not td.is_heldout("json/decoder.py") and not td.is_heldout("pkg/a.py")


def test_folder_corpus_reads_text_files_and_splits_them_by_path(corpus_dir):
    folder, texts = corpus_dir
    corpus = td.discover(folder)
    assert [corpus.relative(f) for f in corpus.files] == sorted([*NAMES, "latin1.py", "blob.dat"])
    heldout = dict(corpus.documents("heldout"))
    train = dict(corpus.documents("train"))
    assert (
        heldout
        == {n: t for n, t in texts.items() if oracle_heldout(n)}
        == {"doc35.txt": texts["doc35.txt"]}
    )
    assert train == {n: t for n, t in texts.items() if not oracle_heldout(n)}
    assert list(train) == sorted(train)  # path order


def test_default_corpus_is_the_standard_library_source():
    corpus = td.discover()
    rel = {corpus.relative(f) for f in corpus.files}
    assert corpus.source == td.stdlib_folder()
    assert {"json/decoder.py", "collections/abc.py"} <= rel
    assert all(r.endswith(".py") and "site-packages/" not in r for r in rel)


def test_tokenizer_learns_from_a_fixed_subset_of_the_training_split(corpus_dir, monkeypatch):
    folder, texts = corpus_dir
    corpus = td.discover(folder)
    train = sorted(
        (n for n in texts if not oracle_heldout(n)),
        key=lambda n: hashlib.sha256(n.encode()).digest(),
    )
    assert [n for n, _ in td.tokenizer_documents(corpus)] == train  # all of it fits the limit
    first = len(texts[train[0]].encode())
    monkeypatch.setattr(td, "MAX_TOKENIZER_BYTES", first + 1)  # the first, then one that crosses
    assert [n for n, _ in td.tokenizer_documents(corpus)] == train[:2]
    monkeypatch.setattr(td, "MAX_TOKENIZER_BYTES", first)
    assert [n for n, _ in td.tokenizer_documents(corpus)] == train[:1]


def test_single_file_is_split_into_pieces_of_lines(tmp_path):
    lines = [f"line {i}\n" for i in range(200)]
    path = tmp_path / "book.txt"
    path.write_text("".join(lines))
    corpus = td.discover(path)
    heldout = dict(corpus.documents("heldout"))
    # 100 pieces of 2 lines; pieces 19, 39, 59, 79, 99 are held out
    assert heldout == {
        f"book.txt#{i}": "".join(lines[2 * i : 2 * i + 2]) for i in (19, 39, 59, 79, 99)
    }
    train = "".join(t for _, t in corpus.documents("train"))
    assert len(train) + sum(map(len, heldout.values())) == len("".join(lines))


def test_bad_corpora_fail_with_the_fix(tmp_path):
    with pytest.raises(td.TextDataError, match=r"no such file or folder"):
        td.discover(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(td.TextDataError, match=r"holds no text files; point --data at a folder"):
        td.discover(tmp_path / "empty")
    (tmp_path / "one").mkdir()
    (tmp_path / "one" / "pkg" / "a.py").parent.mkdir()
    (tmp_path / "one" / "pkg" / "a.py").write_text("x = 1\n" * 100)  # train only
    with pytest.raises(td.TextDataError, match=r"The heldout split of .* is empty \(0 documents\)"):
        td.load_text(tmp_path / "one", vocab_size=VOCAB, cache_dir=tmp_path / "cache")


# -- tokenizer, token streams and cache ------------------------------------------------------------


def test_token_streams_are_the_documents_encoded_with_an_end_token(text, corpus_dir):
    _, texts = corpus_dir
    assert text.vocab_size == VOCAB == text.tokenizer.get_vocab_size()
    assert text.train.dtype == np.uint16 and text.heldout.dtype == np.uint16
    eos = text.eos_id
    assert eos is not None
    for stream, split in ((text.train, False), (text.heldout, True)):
        names = sorted(n for n in texts if oracle_heldout(n) == split)
        expected = []
        for name in names:
            expected += text.tokenizer.encode(texts[name], add_special_tokens=False).ids + [eos]
        np.testing.assert_array_equal(np.asarray(stream), expected)
    first = sorted(n for n in texts if not oracle_heldout(n))[0]
    n = len(text.encode(texts[first]))
    assert text.decode(text.train[:n]) == texts[first]  # byte-level: the text round-trips
    assert text.meta["train"]["documents"] == 4 and text.meta["heldout"]["documents"] == 1


def test_unigram_entropy_matches_a_direct_computation(text):
    _, counts = np.unique(np.asarray(text.heldout), return_counts=True)
    p = counts / counts.sum()
    assert text.unigram_entropy == pytest.approx(float(-(p * np.log(p)).sum()), rel=1e-12)
    assert td.unigram_entropy(np.array([3, 3, 3]), 8) == 0.0


def test_second_load_hits_the_cache_without_training(text, corpus_dir, cache_dir, monkeypatch):
    files = {p.name: p.stat().st_mtime_ns for p in text.folder.iterdir()}

    def no_training(*args, **kwargs):
        raise AssertionError("the cache was rebuilt")

    monkeypatch.setattr(td, "_train_tokenizer", no_training)
    monkeypatch.setattr(td, "_build", no_training)
    again = td.load_text(corpus_dir[0], vocab_size=VOCAB, cache_dir=cache_dir)
    assert not text.from_cache and again.from_cache
    assert again.folder == text.folder
    assert {p.name: p.stat().st_mtime_ns for p in again.folder.iterdir()} == files
    assert set(files) == {"tokenizer.json", "train.bin", "heldout.bin", "meta.json"}
    np.testing.assert_array_equal(again.train, text.train)
    assert [p.name for p in cache_dir.iterdir()] == [text.folder.name]  # no scratch left behind


def test_a_build_that_loses_the_race_uses_the_winners_cache(corpus_dir, tmp_path, monkeypatch):
    """Two processes on one disk may build the same cache at once: the second rename yields."""
    build = td._build

    def build_while_another_process_finishes_first(corpus, tokenizer_file, vocab, scratch, key):
        other = tmp_path / "other"
        other.mkdir()
        build(corpus, tokenizer_file, vocab, other, key)
        (other / "winner").touch()  # tells the two builds apart
        other.rename(tmp_path / "cache" / key)
        build(corpus, tokenizer_file, vocab, scratch, key)

    monkeypatch.setattr(td, "_build", build_while_another_process_finishes_first)
    text = td.load_text(corpus_dir[0], vocab_size=VOCAB, cache_dir=tmp_path / "cache")
    assert (text.folder / "winner").is_file()  # the finished folder was kept, not replaced
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [text.folder.name]  # scratch gone
    assert text.meta["train"]["tokens"] == len(text.train) > 0


def test_cache_key_follows_files_and_settings(tmp_path):
    folder = tmp_path / "corpus"
    folder.mkdir()
    write_corpus(folder)
    cache = tmp_path / "cache"
    first = td.load_text(folder, vocab_size=VOCAB, cache_dir=cache)
    other_vocab = td.load_text(folder, vocab_size=VOCAB + 20, cache_dir=cache)
    assert not other_vocab.from_cache and other_vocab.folder != first.folder
    assert other_vocab.vocab_size == VOCAB + 20
    with open(folder / "c.py", "a") as f:
        f.write("# one more line\n")
    changed = td.load_text(folder, vocab_size=VOCAB, cache_dir=cache)
    assert not changed.from_cache and changed.folder not in (first.folder, other_vocab.folder)
    assert changed.meta["train"]["tokens"] > first.meta["train"]["tokens"]


def test_a_given_tokenizer_is_used_instead_of_training(text, corpus_dir, tmp_path, monkeypatch):
    saved = tmp_path / "tokenizer.json"
    saved.write_bytes((text.folder / "tokenizer.json").read_bytes())

    def no_training(*args, **kwargs):
        raise AssertionError("trained a tokenizer although one was given")

    monkeypatch.setattr(td, "_train_tokenizer", no_training)
    given = td.load_text(corpus_dir[0], tokenizer=saved, cache_dir=tmp_path / "cache")
    assert not given.from_cache and given.meta["tokenizer"] == str(saved)
    np.testing.assert_array_equal(given.train, text.train)
    np.testing.assert_array_equal(given.heldout, text.heldout)
    with pytest.raises(td.TextDataError, match=r"--tokenizer .*nope\.json: no such file"):
        td.load_text(corpus_dir[0], tokenizer=tmp_path / "nope.json", cache_dir=tmp_path)


def test_summary_reports_the_corpus(text, corpus_dir):
    lines = text.summary().splitlines()
    m = text.meta
    assert lines[0].startswith(f"corpus:    {corpus_dir[0]}: 5 documents, ")
    assert "(train 4 / held-out 1); 2 files skipped (not UTF-8 text)" in lines[0]
    assert lines[1].startswith(
        f"tokens:    train {m['train']['tokens']:,}, held-out {m['heldout']['tokens']:,} ("
    )
    assert lines[2] == "tokenizer: byte-level BPE trained on the training split, vocabulary 300"
    assert (
        lines[3]
        == f"baseline:  unigram entropy of the held-out tokens {text.unigram_entropy:.3f} nats/token"
    )
    assert lines[4] == f"cache:     {text.folder} (built now)"


# -- batches ---------------------------------------------------------------------------------------

MAPPING = {"batch": "data"}
LENGTH = 16


def expected_train_batch(text, seed, step, batch):
    """The documented rule, computed here: row i starts where NumPy's (seed, 0, step, i) stream says."""
    n = len(text.train) - LENGTH + 1
    starts = [np.random.default_rng((seed, 0, step, i)).integers(n) for i in range(batch)]
    return np.stack([text.train[s : s + LENGTH] for s in starts]).astype(np.int32)


def test_train_batches_are_windows_fixed_by_seed_and_step(text, mesh_2x4):
    x = text.train_batch(3, batch=8, length=LENGTH, seed=0, mapping=MAPPING, mesh=mesh_2x4)
    assert x.axis_names == ("batch", "position") and x.shape == {"batch": 8, "position": LENGTH}
    assert x.dtype == np.int32
    assert spec_of(x) == P("data") and shard_shapes(x) == [(4, LENGTH)]
    np.testing.assert_array_equal(np.asarray(x.array), expected_train_batch(text, 0, 3, 8))
    again = text.train_batch(3, batch=8, length=LENGTH, seed=0, mapping=MAPPING, mesh=mesh_2x4)
    np.testing.assert_array_equal(np.asarray(again.array), np.asarray(x.array))
    for step, seed in ((4, 0), (3, 1)):
        other = text.train_batch(
            step, batch=8, length=LENGTH, seed=seed, mapping=MAPPING, mesh=mesh_2x4
        )
        assert not np.array_equal(np.asarray(other.array), np.asarray(x.array))
    # Row i depends on (seed, step, i) only: a larger batch starts with the same rows.
    wide = text.train_batch(3, batch=16, length=LENGTH, seed=0, mapping=MAPPING, mesh=mesh_2x4)
    np.testing.assert_array_equal(np.asarray(wide.array)[:8], np.asarray(x.array))


def test_batches_follow_the_mapping_and_mesh_in_force(text, mesh_2x4):
    import jax

    with jax.set_mesh(mesh_2x4), na.axis_mapping({"batch": "data", "position": "model"}):
        x = text.train_batch(0, batch=8, length=LENGTH)
    assert spec_of(x) == P("data", "model") and shard_shapes(x) == [(4, LENGTH // 4)]
    np.testing.assert_array_equal(np.asarray(x.array), expected_train_batch(text, 0, 0, 8))


def test_heldout_batches_spread_evenly_over_the_heldout_tokens(text, mesh_2x4):
    n = len(text.heldout) - LENGTH  # the last start
    batches = [
        text.heldout_batch(k, batches=2, batch=4, length=LENGTH, mapping=MAPPING, mesh=mesh_2x4)
        for k in range(2)
    ]
    starts = [r * n // 7 for r in range(8)]
    expected = np.stack([text.heldout[s : s + LENGTH] for s in starts]).astype(np.int32)
    got = np.concatenate([np.asarray(b.array) for b in batches])
    np.testing.assert_array_equal(got, expected)
    assert starts[0] == 0 and starts[-1] == n  # from the first token to the last window
    with pytest.raises(td.TextDataError, match=r"held-out batch 2 out of range for 2 batches"):
        text.heldout_batch(2, batches=2, batch=4, length=LENGTH, mapping=MAPPING, mesh=mesh_2x4)


def test_bad_batch_and_vocabulary_settings_fail_with_the_fix(text, corpus_dir, tmp_path):
    """A negative step or seed was NumPy's "expected non-negative integer"; a float vocabulary
    reached the tokenizer trainer's TypeError."""
    for kwargs, bad in (({"step": -1}, "step must be an int >= 0, got -1"),
                        ({"step": 1.5}, "step must be an int >= 0, got 1.5"),
                        ({"step": 0, "seed": -2}, "seed must be an int >= 0, got -2")):  # fmt: skip
        with pytest.raises(td.TextDataError, match=rf"^train_batch\(\): {bad}\.$"):
            text.train_batch(**kwargs, batch=8, length=LENGTH, mapping={})
    with pytest.raises(
        td.TextDataError,
        match=r"^vocab_size 300\.5 must be an int above 256 \(the bytes\) for BPE\.$",
    ):
        td.load_text(corpus_dir[0], vocab_size=300.5, cache_dir=tmp_path / "cache")
    assert not (tmp_path / "cache").exists()  # refused before building anything


def test_windows_longer_than_a_split_fail_with_the_fix(text, mesh_2x4):
    too_long = len(text.heldout) + 1
    with pytest.raises(
        td.TextDataError,
        match=rf"The held-out split has {len(text.heldout):,} tokens, too few for windows of {too_long}; use a shorter",
    ):
        text.heldout_batch(0, batches=1, batch=8, length=too_long, mapping=MAPPING, mesh=mesh_2x4)


@pytest.fixture(scope="module")
def two_processes(text, corpus_dir, cache_dir):
    """Both workers, launched once: each builds the batches on an Auto and an Explicit mesh."""
    return run_two_processes(WORKER, corpus_dir[0], cache_dir, VOCAB, timeout=90)


def test_two_processes_build_the_same_global_batches_as_one(text, two_processes, mesh_2x4):
    """Each of 2 processes (4 devices each) reads only its rows; together they build what one does."""
    results = two_processes
    one = {
        "train_0": text.train_batch(
            0, batch=8, length=LENGTH, seed=7, mapping=MAPPING, mesh=mesh_2x4
        ),
        "train_5": text.train_batch(
            5, batch=8, length=LENGTH, seed=7, mapping=MAPPING, mesh=mesh_2x4
        ),
        "heldout_1": text.heldout_batch(
            1, batches=2, batch=8, length=LENGTH, mapping=MAPPING, mesh=mesh_2x4
        ),
    }
    kind = "explicit" if "Explicit" in str(mesh_2x4.axis_types) else "auto"
    for pid, r in enumerate(results):
        assert r["from_cache"] is True  # the workers loaded what this process built
        got = r[kind]
        for name, x in one.items():
            np.testing.assert_array_equal(np.asarray(got[name]), np.asarray(x.array), err_msg=name)
        assert got["spec"] == ["data", "None"] and got["shard_shapes"] == [[4, LENGTH]]
        assert got["fully_addressable"] is False
        # this process drew random starts for its own half of the rows only
        assert got["rows_drawn"] == [4 * pid + i for i in range(4)] * 2
