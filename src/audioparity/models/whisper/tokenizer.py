"""The text of the port's decodes: the checkpoint's ``tokenizer.json`` through the ``tokenizers``
library (no torch, no transformers), as transformers' ``WhisperTokenizer.decode(ids,
skip_special_tokens=True)`` gives it for ids without a prompt or timestamps: the byte-level BPE
pieces joined, special tokens dropped, no other clean-up (``clean_up_tokenization_spaces``
false, as the Whisper tokenizers set it; a test holds the two together)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from audioparity.contract.errors import AudioparityError

TOKENIZER_FILE = "tokenizer.json"


class Tokenizer:
    """The decoder of a checkpoint directory's ``tokenizer.json``.

    Raises:
        AudioparityError: no ``tokenizer.json`` in ``model_dir``, or one ``tokenizers`` cannot
            read.
    """

    def __init__(self, model_dir: Path) -> None:
        from tokenizers import Tokenizer as HfTokenizer

        path = Path(model_dir) / TOKENIZER_FILE
        if not path.is_file():
            raise AudioparityError(f"{path}: no such file; the decode's text needs the "
                                   "checkpoint's tokenizer")
        try:
            self._tokenizer = HfTokenizer.from_file(str(path))
        except Exception as err:  # tokenizers raises its own Exception type
            raise AudioparityError(f"{path}: unreadable tokenizer ({err})") from None

    def decode(self, ids: Sequence[int]) -> str:
        """The text of token ``ids``, special tokens skipped."""
        return self._tokenizer.decode(list(ids), skip_special_tokens=True)
