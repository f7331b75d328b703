"""Meshes for the tests: ``make_mesh`` and the fixtures that run every sharding test on Auto and on
Explicit mesh axes. ``conftest.py`` registers the fixtures; test files import ``make_mesh`` from
here (``from _meshes import make_mesh``)."""

import jax
import pytest
from jax.sharding import AxisType

MESH_SHAPES = {
    "8": ((8,), ("data",)),
    "2x4": ((2, 4), ("data", "model")),
    "2x2x2": ((2, 2, 2), ("data", "model", "replica")),
}


def make_mesh(shape, names, axis_type):
    """A mesh over the 8 CPU devices with every axis of ``axis_type``."""
    return jax.make_mesh(shape, names, axis_types=(axis_type,) * len(names))


@pytest.fixture(params=[AxisType.Auto, AxisType.Explicit], ids=["auto", "explicit"])
def axis_type(request):
    """Each sharding test runs on Auto and on Explicit mesh axes."""
    return request.param


@pytest.fixture(params=list(MESH_SHAPES), ids=list(MESH_SHAPES))
def mesh(request, axis_type):
    """Meshes of shape (8,), (2, 4) and (2, 2, 2), each Auto and Explicit."""
    shape, names = MESH_SHAPES[request.param]
    return make_mesh(shape, names, axis_type)


@pytest.fixture
def mesh_2x4(axis_type):
    """A (data=2, model=4) mesh, Auto and Explicit."""
    return make_mesh((2, 4), ("data", "model"), axis_type)
