"""The logical core: rules (``_rules``), ``resolve`` (``_resolve``) and the mapping context
(``_context``). It needs axis names, sizes and mesh sizes only (no arrays), so it sits below
``NamedArray`` and the named ops, which import it at module top."""
