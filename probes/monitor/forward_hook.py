"""The forward hook the Monitor puts on the user's model, made to survive what users do with a
model: ``copy.deepcopy(model)`` (an EMA copy) shares it instead of copying the Monitor (its
threads and locks cannot be copied), ``torch.save(model)`` pickles it as a no-op, and it acts
only for the model it was registered on, so the copy's forward passes are not counted."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any


class ForwardCounter:
    """Calls ``on_forward(module, inputs, output)`` for ``model``'s own forward passes."""

    def __init__(self, model: Any, on_forward: Callable[[Any, Any, Any], None]) -> None:
        self._model = weakref.ref(model)
        self._on_forward = weakref.WeakMethod(on_forward)  # type: ignore[arg-type]

    def __call__(self, module: Any, inputs: Any, output: Any) -> None:
        if module is not self._model():
            return  # a deep copy of the model (EMA) runs its own forward: not a step's
        on_forward = self._on_forward()
        if on_forward is not None:
            on_forward(module, inputs, output)

    def __deepcopy__(self, memo: dict[int, Any]) -> ForwardCounter:
        return self

    def __reduce__(self) -> tuple[Callable[[], Callable[..., None]], tuple[()]]:
        return inert_hook, ()


def ignore_forward(module: Any, inputs: Any, output: Any) -> None:
    """What an unpickled model's copy of the hook does: nothing."""


def inert_hook() -> Callable[..., None]:
    return ignore_forward
