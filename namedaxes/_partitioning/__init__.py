"""Placement: the tree walk (``_tree``) and the one plan (``_plan``) over it, ``shard``
(``_shard``), specs without placing (``_specs``), ``named_jit``/``fsdp`` (``_jit`` and its
helpers), and ``shard_map`` by name (``_shard_map``). Import from the modules themselves."""
