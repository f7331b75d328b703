"""The axis_mapping context: nesting, merge, kwargs, isolation across threads/tasks/generators, and
its part in jax.jit's trace cache key."""

import asyncio
import contextlib
import os
import subprocess
import sys
import threading

import equinox as eqx
import jax
import jax.numpy as jnp
import pytest
from _helpers import spec_of
from jax.sharding import PartitionSpec as P

import namedaxes as na
from namedaxes import AxisRules, MappingTypeError, ShardingError, axis_mapping, current_axis_mapping


def test_nesting_and_restore():
    assert current_axis_mapping() is None
    with axis_mapping({"batch": "data"}) as m:
        assert m == {"batch": "data"}
        assert current_axis_mapping() == {"batch": "data"}
        with axis_mapping({"embed": "model"}):
            assert current_axis_mapping() == {"embed": "model"}  # replaces, not merges
        assert current_axis_mapping() == {"batch": "data"}
    assert current_axis_mapping() is None


def test_restored_after_exception():
    with pytest.raises(RuntimeError):
        with axis_mapping({"batch": "data"}):
            raise RuntimeError("boom")
    assert current_axis_mapping() is None


def test_kwargs_add_and_override():
    with axis_mapping({"batch": "data", "embed": None}, embed="model", mlp=("data", "model")):
        assert current_axis_mapping() == {
            "batch": "data",
            "embed": "model",
            "mlp": ("data", "model"),
        }
    with axis_mapping(batch="data"):
        assert current_axis_mapping() == {"batch": "data"}
    rules = AxisRules([("batch", "replica"), ("batch", "data"), ("embed", "model")])
    with axis_mapping(rules, batch="model"):
        assert current_axis_mapping() == AxisRules([("embed", "model"), ("batch", "model")])


def test_merge_inner_wins():
    with axis_mapping({"batch": "data", "embed": "model"}):
        with axis_mapping({"embed": None, "mlp": "model"}, merge=True):
            assert current_axis_mapping() == {"batch": "data", "embed": None, "mlp": "model"}
        with axis_mapping(merge=True, batch="model"):
            assert current_axis_mapping() == {"batch": "model", "embed": "model"}
    with axis_mapping({"batch": "data"}, merge=True):  # nothing to merge with
        assert current_axis_mapping() == {"batch": "data"}


def test_merge_with_rules_puts_inner_pairs_first():
    outer = AxisRules([("batch", "data"), ("embed", "model")], unsatisfied="replicate")
    with axis_mapping(outer):
        with axis_mapping({"batch": "model"}, merge=True):
            assert current_axis_mapping() == AxisRules(
                [("batch", "model"), ("batch", "data"), ("embed", "model")], unsatisfied="replicate"
            )
        inner = AxisRules([("embed", "data")])
        with axis_mapping(inner, merge=True):
            merged = current_axis_mapping()
            assert merged.candidates("embed") == (("data",), ("model",))
            assert merged.unsatisfied == "error"  # the inner rules' policy


def test_bad_values_fail_at_construction():
    with pytest.raises(MappingTypeError, match=r"Logical axis 'batch' is mapped to 2 \(int\)"):
        axis_mapping({"batch": 2})
    with pytest.raises(MappingTypeError, match=r"Logical axis 'mlp' is mapped to 1.5"):
        axis_mapping(mlp=1.5)
    with pytest.raises(MappingTypeError, match=r"axis_mapping expects a dict .* got 'data'"):
        axis_mapping("data")  # type: ignore[arg-type]


def test_decorator():
    @axis_mapping(batch="data")
    def f():
        return current_axis_mapping()

    assert f() == {"batch": "data"}
    assert current_axis_mapping() is None


def test_threads_are_isolated():
    barrier = threading.Barrier(2, timeout=10)
    seen = {}

    def worker(name):
        with axis_mapping(batch=name):
            barrier.wait()  # both threads are inside their blocks at once
            seen[name] = current_axis_mapping()
            barrier.wait()
        seen[name + "_after"] = current_axis_mapping()

    with axis_mapping(batch="main"):
        threads = [threading.Thread(target=worker, args=(n,)) for n in ("t1", "t2")]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert current_axis_mapping() == {"batch": "main"}
    assert seen == {
        "t1": {"batch": "t1"},
        "t2": {"batch": "t2"},
        "t1_after": None,
        "t2_after": None,
    }


def test_asyncio_tasks_are_isolated_and_inherit():
    async def task(name, started, release):
        with axis_mapping(batch=name):
            started.set()
            await release.wait()
            return current_axis_mapping()

    async def main():
        e1, e2, release = asyncio.Event(), asyncio.Event(), asyncio.Event()
        t1 = asyncio.create_task(task("a", e1, release))
        t2 = asyncio.create_task(task("b", e2, release))
        await e1.wait()
        await e2.wait()
        mine = current_axis_mapping()  # both tasks are inside their blocks now
        release.set()
        return await t1, await t2, mine

    with axis_mapping(batch="outer"):
        r1, r2, mine = asyncio.run(main())
    assert (r1, r2, mine) == ({"batch": "a"}, {"batch": "b"}, {"batch": "outer"})


def test_suspended_generator_does_not_leak():
    def gen():
        with axis_mapping(batch="gen"):
            yield current_axis_mapping()
            yield current_axis_mapping()
        yield current_axis_mapping()

    with axis_mapping(batch="caller"):
        g = gen()
        assert next(g) == {"batch": "gen"}
        assert current_axis_mapping() == {"batch": "caller"}
        with axis_mapping(batch="caller2"):
            # Resumed, the generator still sees its own block's mapping.
            assert next(g) == {"batch": "gen"}
            assert current_axis_mapping() == {"batch": "caller2"}
            assert next(g) == {"batch": "caller2"}  # its block is over
        assert current_axis_mapping() == {"batch": "caller"}
    assert current_axis_mapping() is None


def test_abandoned_generator_leaves_nothing_behind():
    def gen():
        with axis_mapping(batch="gen"):
            yield

    import gc
    import weakref

    g = gen()
    next(g)
    assert current_axis_mapping() is None
    g.close()
    assert current_axis_mapping() is None
    # Nothing keeps the closed generator (or its frame) alive: no stale entry was left behind.
    ref = weakref.ref(g)
    del g
    gc.collect()
    assert ref() is None


def test_generator_resumed_and_closed_in_other_threads():
    """A generator suspended inside axis_mapping and resumed in another thread sees its own
    mapping; closing it in another thread leaves nothing in the thread that created it."""
    import gc
    import weakref

    def gen():
        with axis_mapping(batch="gen"):
            yield current_axis_mapping()
            yield current_axis_mapping()

    g = gen()
    assert next(g) == {"batch": "gen"}
    seen = {}

    def resume():
        with axis_mapping(batch="other-thread"):
            seen["inside"] = next(g)
            seen["outside"] = current_axis_mapping()
        g.close()

    t = threading.Thread(target=resume)
    t.start()
    t.join()
    assert seen == {"inside": {"batch": "gen"}, "outside": {"batch": "other-thread"}}
    assert current_axis_mapping() is None
    ref = weakref.ref(g)
    del g
    gc.collect()
    assert ref() is None


def test_decorator_on_generator_and_async_functions():
    @axis_mapping(batch="gen")
    def gen():
        yield current_axis_mapping()
        yield current_axis_mapping()

    g = gen()
    assert next(g) == {"batch": "gen"}
    assert current_axis_mapping() is None  # suspended: no leak
    assert next(g) == {"batch": "gen"}

    @axis_mapping(batch="coro")
    async def coro():
        await asyncio.sleep(0)
        return current_axis_mapping()

    @axis_mapping(batch="agen")
    async def agen():
        yield current_axis_mapping()
        yield current_axis_mapping()

    async def main():
        items = [x async for x in agen()]
        return await coro(), items, current_axis_mapping()

    assert asyncio.run(main()) == ({"batch": "coro"}, [{"batch": "agen"}] * 2, None)


def test_no_cpython_private_internals():
    import inspect as _inspect

    import namedaxes._logical._context as ctx

    source = _inspect.getsource(ctx)
    assert "sys._getframe" not in source and "contextlib._" not in source


def test_async_generator_does_not_leak():
    async def agen():
        with axis_mapping(batch="agen"):
            yield current_axis_mapping()

    async def main():
        it = agen()
        inside = await it.__anext__()
        outside = current_axis_mapping()
        await it.aclose()
        return inside, outside

    assert asyncio.run(main()) == ({"batch": "agen"}, None)


_SUSPENDED_AT_EXIT = """
import namedaxes as na

@na.axis_mapping({"batch": "data"})
def decorated():
    yield 1

def inside():
    with na.axis_mapping({"batch": "data"}):
        yield 1

g, h = decorated(), inside()
next(g), next(h)
"""


def test_generator_suspended_at_interpreter_exit_closes_quietly():
    """Closed at interpreter exit (after other modules' globals may be cleared), a generator
    suspended inside a mapping exits it without "Exception ignored in: <generator ...>"."""
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    done = subprocess.run(
        [sys.executable, "-c", _SUSPENDED_AT_EXIT],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert (done.returncode, done.stderr) == (0, "")


def test_contextmanager_wrappers_extend_over_the_block():
    @contextlib.contextmanager
    def use(mapping):
        with axis_mapping(mapping):
            yield

    @contextlib.asynccontextmanager
    async def ause(mapping):
        with axis_mapping(mapping):
            yield

    with use({"batch": "data"}):
        assert current_axis_mapping() == {"batch": "data"}
    assert current_axis_mapping() is None

    async def main():
        async with ause({"batch": "model"}):
            return current_axis_mapping()

    assert asyncio.run(main()) == {"batch": "model"}


def test_exit_stack_keeps_mapping_across_yield():
    def fixture_like():
        with contextlib.ExitStack() as stack:
            stack.enter_context(axis_mapping(batch="data"))
            yield

    g = fixture_like()
    next(g)
    assert current_axis_mapping() == {"batch": "data"}
    next(g, None)
    assert current_axis_mapping() is None


def test_one_decorator_active_in_several_threads():
    barrier = threading.Barrier(2, timeout=10)
    after = []

    @axis_mapping(batch="data")
    def work():
        barrier.wait()  # both threads inside the same axis_mapping object at once
        seen = current_axis_mapping()
        barrier.wait()
        return seen

    def run():
        after.append((work(), current_axis_mapping()))

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert after == [({"batch": "data"}, None)] * 2


# -- the mapping is part of jax.jit's trace cache key ----------------------------------------------


def test_jax_jit_traces_again_under_another_mapping(mesh_2x4):
    """A plain ``jax.jit`` (or ``eqx.filter_jit``) function that places by the mapping in force is
    traced once per mapping, and each call places by its own: no trace made under another mapping
    is reused (equal rules share one), on Auto and Explicit meshes."""
    traces = []

    def place(x):
        traces.append(current_axis_mapping())
        return na.auto_sharded(x)

    x = na.named(jnp.arange(32.0).reshape(8, 4), ("batch", "embed"))
    order = [{"batch": "data"}, {"batch": "model"}, AxisRules([("batch", "data")]), None]
    for jit in (jax.jit, eqx.filter_jit):
        traces.clear()
        f = jit(place)
        specs = []
        with jax.set_mesh(mesh_2x4):
            for mapping in order:
                with contextlib.ExitStack() as stack:
                    if mapping is not None:
                        stack.enter_context(axis_mapping(mapping))
                    y = f(x)
                specs.append(spec_of(y))
                assert (y.array == x.array).all()
        assert specs == [P("data"), P("model"), P("data"), P()]
        assert traces == [{"batch": "data"}, {"batch": "model"}, None]  # A again: A's trace

    # Blocks left out of order (an ExitStack's entries popped early): the key is what stays.
    traces.clear()
    f = jax.jit(lambda x: place(x))  # a new function: jax.jit caches traces per function
    with jax.set_mesh(mesh_2x4):
        outer, inner = axis_mapping({"batch": "data"}), axis_mapping({"batch": "model"})
        outer.__enter__()
        inner.__enter__()
        outer.__exit__(None, None, None)  # the inner mapping is still in force
        assert spec_of(f(x)) == P("model")
        inner.__exit__(None, None, None)
        assert spec_of(f(x)) == P()
    assert traces == [{"batch": "model"}, None]


def test_jax_jit_in_threads_keys_each_threads_mapping(mesh_2x4):
    """Threads each key jax.jit's cache by their own mapping."""
    f = jax.jit(na.auto_sharded)
    x = na.named(jnp.ones((8, 4)), ("batch", "embed"))
    specs = {}
    barrier = threading.Barrier(2)

    def run(name, mesh_axis):
        with jax.set_mesh(mesh_2x4), axis_mapping({"batch": mesh_axis}):
            barrier.wait()  # both mappings in force at once
            specs[name] = spec_of(f(x))

    threads = [threading.Thread(target=run, args=(n, n)) for n in ("data", "model")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert specs == {"data": P("data"), "model": P("model")}


def test_merge_puts_inner_names_first_for_dicts_and_rules(mesh_2x4):
    """Rule order is priority: a merged inner mapping's names come first whether the mappings are
    dicts or AxisRules, so the inner name wins a mesh axis both compete for."""
    x = na.named(jnp.ones((8, 4)), ("batch", "embed"))
    with axis_mapping({"batch": "data", "embed": None}):
        with axis_mapping({"embed": "data"}, merge=True):
            assert list(current_axis_mapping()) == ["embed", "batch"]
            with pytest.raises(ShardingError, match="'data' already used by axis 'embed'"):
                na.pspec_for(x, mesh=mesh_2x4)
        with axis_mapping(AxisRules({"embed": "data"}), merge=True):
            with pytest.raises(ShardingError, match="'data' already used by axis 'embed'"):
                na.pspec_for(x, mesh=mesh_2x4)
    with axis_mapping(AxisRules({"batch": "data"}, unsatisfied="replicate")):
        with axis_mapping({"embed": "data"}, merge=True):
            assert na.pspec_for(x, mesh=mesh_2x4) == P(None, "data")
