"""``CheckpointManager``: numbered, asynchronous, atomic checkpoints for a training loop."""

from __future__ import annotations

import os
from pathlib import Path
from types import TracebackType
from typing import Any

import orbax.checkpoint as ocp

from .._errors import CheckpointError, CheckpointNotFoundError, NamedTypeError
from ._io import check_step, complete_steps, restore, save_args

__all__ = ["CheckpointManager"]


class CheckpointManager:
    """Save a tree every few steps into ``directory/<step>``, keeping the last ``max_to_keep``.

    ``save`` returns once the arrays are copied off the devices and writes in the background (so
    the next training step can start); ``wait`` blocks until every pending save is committed. Each
    step is written atomically: orbax writes into a temporary directory and commits it only when
    every process is done, and ``all_steps``/``latest_step``/``restore`` only ever see committed
    steps, so a crash mid-save leaves the previous step as the latest. The checkpoints are the
    same as ``save(directory, tree, step=step)`` writes; ``restore(directory)`` reads them too.

    Args:
        directory: Where the step directories go (created if missing).
        max_to_keep: How many of the most recent steps to keep (``None``: all).

    Example:
        >>> import tempfile, jax.numpy as jnp, namedaxes as na
        >>> with CheckpointManager(tempfile.mkdtemp(), max_to_keep=2) as mgr:
        ...     for step in range(3):
        ...         mgr.save(step, {"w": na.named(jnp.full((2,), step), "embed")})
        ...     mgr.wait()
        ...     print(mgr.all_steps(), mgr.restore()["w"].array)
        [1, 2] [2 2]
    """

    def __init__(self, directory: str | os.PathLike[str], max_to_keep: int | None = 3):
        if max_to_keep is not None and (
            isinstance(max_to_keep, bool) or not isinstance(max_to_keep, int) or max_to_keep < 1
        ):
            raise NamedTypeError(
                f"max_to_keep must be a positive int or None (keep all), got {max_to_keep!r}."
            )
        self.directory = Path(directory).absolute()
        self.max_to_keep = max_to_keep
        options = ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep, create=True, enable_async_checkpointing=True
        )
        self._manager = ocp.CheckpointManager(self.directory, options=options)

    def save(self, step: int, tree: Any) -> None:
        """Start saving ``tree`` as ``step`` (returns before the files are written; see ``wait``).

        Raises:
            CheckpointError: if ``step`` is already saved or not after the latest step.
            DonatedArrayError: for an array of ``tree`` donated to a step (see ``save``).
        """
        step = check_step(step, "CheckpointManager.save")
        latest = self._manager.latest_step()
        if latest is not None and step <= latest:
            raise CheckpointError(
                f"CheckpointManager.save: step {step} is not after the latest step {latest} in "
                f"{str(self.directory)!r}. Save increasing steps."
            )
        if not self._manager.save(step, args=save_args(tree, "CheckpointManager.save")):
            raise CheckpointError(  # orbax declined (its save policy); never drop a save silently
                f"CheckpointManager.save: orbax did not save step {step} in {str(self.directory)!r}."
            )

    def wait(self) -> None:
        """Block until every pending save is committed."""
        self._manager.wait_until_finished()

    def all_steps(self) -> list[int]:
        """The committed steps, oldest first (saves still being written are not listed)."""
        return complete_steps(self.directory)

    def latest_step(self) -> int | None:
        """The newest committed step, or ``None``."""
        steps = self.all_steps()
        return steps[-1] if steps else None

    def restore(
        self,
        like: Any = None,
        *,
        step: int | None = None,
        mapping: Any = None,
        mesh: Any = None,
        cast: bool = False,
    ) -> Any:
        """Restore ``step`` (default: the latest committed step) as ``namedaxes.checkpoint.restore``.

        Pending saves are waited for first, so the step just saved is the latest. ``like`` may be
        a part of the saved tree (``{"model": like_model}`` of a training state): only its arrays
        are read.

        Raises:
            CheckpointNotFoundError: if there is no committed step (or not ``step``).
        """
        self.wait()
        if step is None and self.latest_step() is None:
            raise CheckpointNotFoundError(
                f"CheckpointManager has no committed step in {str(self.directory)!r} yet. Save one "
                "first, or start from fresh parameters."
            )
        return restore(self.directory, like, mapping=mapping, mesh=mesh, step=step, cast=cast)

    def close(self) -> None:
        """Wait for pending saves and release orbax's background resources."""
        self._manager.close()

    def __enter__(self) -> CheckpointManager:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"CheckpointManager({str(self.directory)!r}, max_to_keep={self.max_to_keep})"
