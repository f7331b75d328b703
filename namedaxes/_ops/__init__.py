"""Named operations. Each submodule is one family; NamedArray's operators and methods (declared in
``namedaxes._array``) call into ``elementwise``, ``reductions``, ``shape`` and ``indexing``."""

# shape, indexing, higher-order (issue 2, part 2)
# creation, elementwise, reductions, contractions
from . import contract as contract
from . import creation as creation
from . import elementwise as elementwise
from . import hof as hof
from . import indexing as indexing
from . import join as join
from . import reductions as reductions
from . import shape as shape
