"""Comparison of a candidate dump with its reference: metrics (:mod:`.metrics`), gates
(:mod:`.gates`, :mod:`.scaling`) and one cell's rows (:mod:`.cell`). Importing the package
imports none of them, so that :mod:`.metrics` is a leaf any layer may read."""
