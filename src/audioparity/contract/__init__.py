"""The contract every part speaks: the words (:mod:`.vocabulary`), a model family's table
(:mod:`.spec`) and code (:mod:`.family`), the one error type (:mod:`.errors`) and the reference
side's taps (:mod:`.taps`)."""
