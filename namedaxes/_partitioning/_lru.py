"""Bounded least-recently-used caches on a plain ``collections.OrderedDict``.

The structure plans, the placement targets and ``named_jit``'s compiled entries are all kept this
way: look up with the dict's own ``get`` (a C call, so hits stay cheap), then ``lru_touch`` on a
hit or ``lru_put`` on a miss. Caches may be shared between threads; an entry that another thread
evicted in between is not an error.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

__all__ = ["lru_put", "lru_touch"]


def lru_touch(cache: OrderedDict[Any, Any], key: Any) -> None:
    """Mark ``key`` as the most recently used entry of ``cache``.

    Example:
        >>> cache = OrderedDict(a=1, b=2)
        >>> lru_touch(cache, "a")
        >>> list(cache)
        ['b', 'a']
    """
    try:
        cache.move_to_end(key)
    except KeyError:  # evicted by another thread meanwhile
        pass


def lru_put(cache: OrderedDict[Any, Any], key: Any, value: Any, maxsize: int) -> None:
    """Store ``value`` under ``key``, then drop least recently used entries beyond ``maxsize``.

    Example:
        >>> cache = OrderedDict(a=1, b=2)
        >>> lru_put(cache, "c", 3, maxsize=2)
        >>> list(cache)
        ['b', 'c']
    """
    cache[key] = value
    while len(cache) > maxsize:
        try:
            cache.popitem(last=False)
        except KeyError:  # emptied by another thread meanwhile
            break
