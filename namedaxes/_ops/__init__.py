"""Named operations. Each submodule is one family; importing this package installs NamedArray's
operator and method protocol (the submodules attach dunders such as ``__add__`` and ``__getitem__``)."""

# shape, indexing, higher-order (issue 2, part 2)
from . import hof as hof
from . import indexing as indexing
from . import join as join
from . import shape as shape

# creation, elementwise (installs operators and astype), reductions (installs methods), contractions
from . import contract as contract
from . import creation as creation
from . import elementwise as elementwise
from . import reductions as reductions
