"""Token ids to text, as NeMo's ``RNNTBPEDecoding`` and ``CTCBPEDecoding`` write
``hypothesis.text``, and the ``decode.json`` / ``ctc_decode.json`` documents of a greedy path."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable
from pathlib import Path

from audioparity.checkpoints.nemo import read_nemo_member
from audioparity.contract.errors import AudioparityError
from audioparity.models.parakeet_tdt.greedy import CtcPath, GreedyPath


class Tokenizer:
    """Token ids -> text as NeMo's ``RNNTBPEDecoding`` produces ``hypothesis.text``.

    ``ids_to_tokens`` then ``tokens_to_text`` (SentencePiece ``decode_pieces``), then one
    whitespace before a punctuation mark of the vocabulary is removed
    (``decode_tokens_to_str_with_strip_punctuation``; the marks are
    ``extract_punctuation_from_vocab``'s: Unicode ``P*`` characters of pieces that are not
    special, i.e. not ``<..>``, ``[..]``, ``##..``, ``\u2581..`` or blank).

    Args:
        pieces: the vocabulary, piece ``i`` for id ``i``.
        decode: token ids -> text (SentencePiece ``decode_pieces`` of their pieces, or the
            Hugging Face tokenizer's ``decode``).
    """

    _SPECIAL = re.compile(r"^\[.*\]$|^<.*>$|^##|^\u2581|^\s*$")

    def __init__(self, pieces: list[str], decode: Callable[[list[int]], str]) -> None:
        self.pieces = pieces
        self._decode = decode
        marks = sorted({char for piece in pieces if not self._SPECIAL.match(piece)
                        for char in piece if unicodedata.category(char).startswith("P")})
        self._space_before_punct = (
            re.compile(r"(\s)(" + "|".join(re.escape(m) for m in marks) + ")") if marks else None
        )

    def ids_to_text(self, ids: list[int]) -> str:
        """Text of token ids (ids outside the vocabulary, e.g. the blank, are dropped)."""
        text = self._decode([i for i in ids if 0 <= i < len(self.pieces)])
        if self._space_before_punct is not None:
            text = self._space_before_punct.sub(r"\2", text)
        return text


def load_tokenizer(model: Path) -> Tokenizer:
    """The tokenizer of a ``.nemo`` (its SentencePiece ``tokenizer.model``) or of a Hugging Face
    Parakeet directory (``tokenizer.json``).

    Raises:
        AudioparityError: the model carries no tokenizer, or it cannot be read.
    """
    model = Path(model)
    if model.is_dir():
        path = model / "tokenizer.json"
        if not path.is_file():
            raise AudioparityError(f"{model}: no tokenizer.json")
        from tokenizers import Tokenizer as HFTokenizer

        hf = HFTokenizer.from_file(str(path))
        pieces = [hf.id_to_token(i) or "" for i in range(hf.get_vocab_size())]
        return Tokenizer(pieces, hf.decode)
    import sentencepiece

    try:
        sp = sentencepiece.SentencePieceProcessor(
            model_proto=read_nemo_member(model, "tokenizer.model"))
    except RuntimeError as err:
        raise AudioparityError(f"{model}: unreadable tokenizer.model ({err})") from None
    pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    return Tokenizer(pieces, lambda ids: sp.decode_pieces([pieces[i] for i in ids]))


def decode_document(path: GreedyPath, tokenizer: Tokenizer) -> dict:
    """The ``decode.json`` / ``decoder_replay.json`` document of a path:
    ``{"ids", "frames", "durations", "text"}``."""
    return {"ids": list(path.ids), "frames": list(path.frames),
            "durations": list(path.durations), "text": tokenizer.ids_to_text(path.ids)}


def ctc_document(path: CtcPath, tokenizer: Tokenizer) -> dict:
    """The ``ctc_decode.json`` / ``ctc_decoder_replay.json`` document of a greedy CTC path:
    ``{"ids", "frames", "text"}`` (NeMo's ``CTCBPEDecoding`` strips the same spaces before
    punctuation as ``RNNTBPEDecoding``)."""
    return {"ids": list(path.ids), "frames": list(path.frames),
            "text": tokenizer.ids_to_text(path.ids)}
