"""Our text processor: the voice-generator prompt as a string and input rows ``[S, 1+n_vq]``.

Mirrors ``MossTTSDelayProcessor`` (OpenMOSS ``processing_moss_tts.py``) for a generation prompt
without reference audio:

1. ``UserMessage`` renders the ``<user_inst>`` block listing Reference(s), Instruction, Tokens,
   Quality, Sound Event, Ambient Sound, Language and Text; a field not given renders as
   ``str(None)``, i.e. ``"None"``.
2. The checkpoint's chat template wraps it as one user turn plus the assistant opener
   (Qwen ChatML: ``<|im_start|>user\\n{content}<|im_end|>\\n<|im_start|>assistant\\n``).
3. The whole string is encoded in one pass (BPE merges may cross field boundaries), with the
   ``tokenizers`` library, special tokens matched in the text.
4. Rows: column 0 the text ids, columns 1..n_vq the audio codes, all ``audio_pad_code`` (no
   reference audio); then one more row, ``audio_start`` and the pads, which ``mode="generation"``
   appends after the encoded string (so generation continues the audio segment it opens).

The upstream ``build_user_message`` also runs a text normaliser (``normalize_tts_text``) over
``text``; this processor does not, so a prompt whose text that normaliser would change gives
different rows on the real checkpoint, and the ``prompt`` stage reports it.

Prompt files are JSON objects: ``{"text": str, "instruction": str | null, "language":
str | null}`` (``instruction`` and ``language`` may be absent).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from audioparity.contract.errors import AudioparityError
from audioparity.models.moss_voicegen.config import MossTTSDelayConfig

TOKENIZER_FILE = "tokenizer.json"

#: The ``UserMessage`` instruction block, as upstream writes it (one field per ``- Name:`` line).
USER_TEMPLATE = """<user_inst>
- Reference(s):
{reference}
- Instruction:
{instruction}
- Tokens:
{tokens}
- Quality:
{quality}
- Sound Event:
{sound_event}
- Ambient Sound:
{ambient_sound}
- Language:
{language}
- Text:
{text}
</user_inst>"""

PROMPT_KEYS = ("text", "instruction", "language")


@dataclass(frozen=True)
class Prompt:
    """One generation request: the text to speak, an optional voice instruction and language."""

    text: str
    instruction: str | None = None
    language: str | None = None


@dataclass(frozen=True)
class EncodedPrompt:
    """A rendered prompt: the string and its input rows ``[S, 1+n_vq]`` (int64)."""

    text: str
    rows: np.ndarray

    def document(self) -> dict:
        """The ``prompt`` document of a dump: ``{"text": str, "rows": [[int, ...], ...]}``."""
        return {"text": self.text, "rows": self.rows.tolist()}


def load_prompt(path: Path) -> Prompt:
    """Read a prompt JSON file (UTF-8).

    Raises:
        AudioparityError: unreadable or not UTF-8 JSON, not an object, an unknown key, a missing,
            non-string or empty (blank) ``text``, a non-string ``instruction``/``language``, or
            a string that is not valid Unicode (a lone surrogate escape).
    """
    path = Path(path)
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as err:
        raise AudioparityError(f"{path}: unreadable prompt ({err})") from err
    if not isinstance(raw, dict):
        raise AudioparityError(
            f"{path}: expected a JSON object with keys {', '.join(PROMPT_KEYS)}, got "
            f"{type(raw).__name__}"
        )
    unknown = sorted(set(raw) - set(PROMPT_KEYS))
    if unknown:
        raise AudioparityError(f"{path}: unknown keys {unknown}; valid: {list(PROMPT_KEYS)}")
    if "text" not in raw:
        raise AudioparityError(f"{path}: 'text' must be a string, the text to speak; missing")
    if not isinstance(raw["text"], str):
        raise AudioparityError(f"{path}: 'text' must be a string, got "
                               f"{type(raw['text']).__name__}")
    if not raw["text"].strip():
        raise AudioparityError(f"{path}: 'text' must not be empty or blank; expected the text "
                               "to speak")
    for key in ("instruction", "language"):
        if raw.get(key) is not None and not isinstance(raw[key], str):
            raise AudioparityError(f"{path}: {key!r} must be a string or null, got "
                                   f"{type(raw[key]).__name__}")
    for key in PROMPT_KEYS:
        try:
            (raw.get(key) or "").encode("utf-8")
        except UnicodeEncodeError as err:
            raise AudioparityError(f"{path}: {key!r} is not valid Unicode ({err.reason} at "
                                   f"character {err.start})") from None
    return Prompt(text=raw["text"], instruction=raw.get("instruction"),
                  language=raw.get("language"))


def user_content(prompt: Prompt) -> str:
    """The user turn's content (``UserMessage._content``): every unused field is ``"None"``."""
    fields = {
        "reference": None, "instruction": prompt.instruction, "tokens": None, "quality": None,
        "sound_event": None, "ambient_sound": None, "language": prompt.language,
        "text": prompt.text,
    }
    content = USER_TEMPLATE
    for key, value in fields.items():
        content = content.replace("{" + key + "}", str(value))
    return content


def render(prompt: Prompt) -> str:
    """The whole prompt string: one ChatML user turn and the assistant opener."""
    return f"<|im_start|>user\n{user_content(prompt)}<|im_end|>\n<|im_start|>assistant\n"


def load_tokenizer(model_dir: Path, config: MossTTSDelayConfig):
    """The checkpoint's ``tokenizer.json`` as a ``tokenizers.Tokenizer``, checked against the
    config's ``im_start_token_id`` and ``im_end_token_id``.

    Raises:
        AudioparityError: the file is missing or unreadable, or a chat token's id differs from
            the config's.
    """
    from tokenizers import Tokenizer

    path = Path(model_dir) / TOKENIZER_FILE
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as err:  # tokenizers raises a bare Exception
        raise AudioparityError(f"{path}: unreadable tokenizer ({err})") from err
    for token, expected in (("<|im_start|>", config.im_start_token_id),
                            ("<|im_end|>", config.im_end_token_id)):
        found = tokenizer.token_to_id(token)
        if found != expected:
            raise AudioparityError(
                f"{path}: {token} has id {found}, config.json says {expected}"
            )
    return tokenizer


def encode(model_dir: Path, config: MossTTSDelayConfig, prompt: Prompt) -> EncodedPrompt:
    """Render ``prompt`` and build its rows ``[S, 1+n_vq]`` (:func:`generation_rows`).

    Raises:
        AudioparityError: see :func:`load_tokenizer`; a text id outside the text vocabulary.
    """
    text = render(prompt)
    ids = np.asarray(load_tokenizer(model_dir, config).encode(text).ids, dtype=np.int64)
    if ids.size and ids.max() >= config.language_config.vocab_size:
        raise AudioparityError(
            f"{model_dir}: token id {int(ids.max())} outside the text vocabulary "
            f"({config.language_config.vocab_size})"
        )
    return EncodedPrompt(text=text, rows=generation_rows(ids, config))


def generation_rows(ids: np.ndarray, config: MossTTSDelayConfig) -> np.ndarray:
    """The input rows ``[len(ids)+1, 1+n_vq]`` (int64) of a rendered prompt's text ids
    ``[len(ids)]``: each id with the pad in every audio column, then the ``audio_start`` row
    (``MossTTSDelayProcessor.__call__``, ``mode="generation"``)."""
    rows = np.full((len(ids) + 1, 1 + config.n_vq), config.audio_pad_code, dtype=np.int64)
    rows[:-1, 0] = ids
    rows[-1, 0] = config.audio_start_token_id
    return rows
