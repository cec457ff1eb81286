"""Taps: forward hooks that keep what a reference library's own modules compute, the one way every
reference implementation (:class:`~audioparity.contract.family.ReferenceLibrary`) takes its stages,
so each dumped tensor is what the library computed in its own run.

```python
with Taps("encoder") as taps:
    taps.output("pre_encode", enc.pre_encode)          # the module's output
    taps.input("pos_emb", enc.layers[0], "pos_emb")    # an argument it was called with
    taps.outputs(Names.LAYER, enc.layers)            # layer_0, layer_1, ...
    encoded = enc(features)
pre_encode = taps.once("pre_encode")                   # refused unless it fired exactly once
```

A module that returns a tuple is tapped at its first element (the hidden states of a
transformers layer). A replay feeds a module another input the same way
(:meth:`Taps.replace_input`). Importing this module imports no torch: the hooks are the modules' own
``register_forward_hook`` and ``register_forward_pre_hook``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from audioparity.contract.errors import AudioparityError
from audioparity.contract.spec import StageName


def _first(value: Any) -> Any:
    """A module's output or argument as tapped: a tuple's first element, else itself."""
    return value[0] if isinstance(value, tuple) else value


class Taps:
    """Forward hooks on torch modules, each keeping every value it sees under a tap name, all
    removed when the ``with`` block ends (also on an error).

    Args:
        where: what is tapped, for the error of :meth:`once` (``encoder``, ``decoder``).
        keep: applied to each value before it is kept (``lambda t: t.detach().clone()`` for a
            library that reuses its buffers); default: kept as is.
    """

    def __init__(self, where: str, keep: Callable[[Any], Any] | None = None) -> None:
        self.where = where
        self.values: dict[str, list[Any]] = {}
        self._keep = keep or (lambda value: value)
        self._handles: list[Any] = []

    def __enter__(self) -> Taps:
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _add(self, name: str, value: Any) -> None:
        self.values.setdefault(name, []).append(None if value is None else self._keep(value))

    def output(self, name: str, module: Any, keep: Callable[[Any], Any] = _first) -> None:
        """Tap ``module``'s output as ``name`` (``keep`` of it: by default a tuple's first
        element)."""
        self._handles.append(module.register_forward_hook(
            lambda _module, _args, output: self._add(name, keep(output))))

    def outputs(self, name: StageName, modules: Sequence[Any]) -> None:
        """Tap each of ``modules``' outputs, the ``i``-th as ``name.at(i)`` (a per-layer stage
        name of a family's table, ``Names.LAYER``)."""
        for index, module in enumerate(modules):
            self.output(name.at(index), module)

    def input(self, name: str, module: Any, keyword: str | None = None) -> None:
        """Tap what ``module`` is called with as ``name``: its first positional argument, or
        the keyword argument ``keyword`` (None when the call does not pass it)."""
        def hook(_module: Any, args: tuple, kwargs: dict) -> None:
            self._add(name, kwargs.get(keyword) if keyword else _first(args))

        self._handles.append(module.register_forward_pre_hook(hook, with_kwargs=True))

    def replace_input(self, module: Any, value: Any, keyword: str) -> None:
        """Run ``module`` on ``value`` instead of what it is called with: its first positional
        argument, or the keyword argument ``keyword`` of a call without positional ones (a
        replay's substitution, removed with the taps)."""
        def hook(_module: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
            if args:
                return (value, *args[1:]), kwargs
            return args, {**kwargs, keyword: value}

        self._handles.append(module.register_forward_pre_hook(hook, with_kwargs=True))

    def all(self, name: str) -> list[Any]:
        """Every value tap ``name`` kept, in call order (empty when it never fired)."""
        return self.values.get(name, [])

    def once(self, name: str) -> Any:
        """The one value tap ``name`` kept.

        Raises:
            AudioparityError: it fired other than once, or kept None (a keyword argument the
                call did not pass): the library computes something the dump does not describe.
        """
        values = self.all(name)
        if len(values) != 1 or values[0] is None:
            raise AudioparityError(f"{self.where} tap {name!r}: fired {len(values)} times"
                                   f"{' with nothing' if values and values[0] is None else ''}; "
                                   "expected one tensor")
        return values[0]
