"""Named operations. Each submodule is one family; importing this package installs NamedArray's
operator and method protocol (the submodules attach dunders such as ``__add__`` and ``__getitem__``)."""
