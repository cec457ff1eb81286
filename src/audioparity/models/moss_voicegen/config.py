"""The checkpoint's ``config.json`` as frozen dataclasses (field names as the checkpoint's).

Mirrors ``MossTTSDelayConfig`` (OpenMOSS ``configuration_moss_tts.py``) and the Qwen3 fields of
its ``language_config`` (transformers ``Qwen3Config``) that the backbone needs. Only reading; the
defaults of the upstream class are not assumed: every field the port uses must be present.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from audioparity.contract.errors import AudioparityError

CONFIG_FILE = "config.json"


@dataclass(frozen=True)
class LanguageConfig:
    """The Qwen3 backbone (``language_config``).

    ``rope_theta`` is read from the legacy top-level key or from transformers 5.x's
    ``rope_parameters``; only the ``default`` RoPE type is supported.
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    hidden_act: str
    attention_bias: bool


@dataclass(frozen=True)
class MossTTSDelayConfig:
    """``MossTTSDelayConfig`` fields used by the text processor, the backbone and generation."""

    n_vq: int
    audio_vocab_size: int
    audio_pad_code: int
    pad_token_id: int
    im_start_token_id: int
    im_end_token_id: int
    audio_start_token_id: int
    audio_end_token_id: int
    audio_user_slot_token_id: int
    audio_assistant_gen_slot_token_id: int
    audio_assistant_delay_slot_token_id: int
    language_config: LanguageConfig
    auto_map: dict[str, str] | None = None

    @property
    def hidden_size(self) -> int:
        return self.language_config.hidden_size

    @property
    def n_layers(self) -> int:
        return self.language_config.num_hidden_layers

    @property
    def modeling(self) -> str:
        """The modeling code the reference runs: ``trust_remote_code`` (the checkpoint's own,
        declared by ``auto_map``) or ``built-in`` (:mod:`.remote_code`)."""
        return "trust_remote_code" if self.auto_map else "built-in"

    def activation_bytes(self, rows: int) -> int:
        """About how many bytes the float32 reference holds beside its weights for a prompt of
        ``rows`` rows at its peak, counted from the shapes (not measured): the heads at every
        row (text ``[rows, vocab_size]``, audio ``n_vq x [rows, audio_vocab_size+1]``), every
        layer's output ``[L+1, rows, H]``, and eager attention's scores and probabilities
        ``[heads, rows, rows]`` of one layer, each counted twice (the tensor and its copy: a
        dump's numpy array, a softmax)."""
        lang = self.language_config
        per_row = lang.vocab_size + self.n_vq * (self.audio_vocab_size + 1) \
            + (self.n_layers + 1) * self.hidden_size
        return 2 * 4 * (rows * per_row + 2 * lang.num_attention_heads * rows * rows)


#: What a config value must be, by the type it is read as (bool is not an int here).
_KINDS = {int: "an integer", float: "a number", dict: "an object"}


def _value(obj: dict[str, Any], key: str, where: str, kind: type, default: Any = ...) -> Any:
    """``obj[key]`` as ``kind`` (``int``, ``float`` or ``dict``); ``default`` when absent or
    null, if one is given.

    Raises:
        AudioparityError: the key is missing (and has no default) or holds another type.
    """
    value = obj.get(key)
    if value is None:
        if default is not ...:
            return default
        raise AudioparityError(f"{where}: missing key {key!r}")
    allowed = (int, float) if kind is float else (kind,)
    if isinstance(value, bool) or not isinstance(value, allowed):
        raise AudioparityError(f"{where}: {key!r} is {json.dumps(value)[:60]}; expected "
                               f"{_KINDS[kind]}")
    return kind(value) if kind is not dict else value


def _rope_theta(lang: dict[str, Any], where: str) -> float:
    params = _value(lang, "rope_parameters", where, dict, {})
    scaling = _value(lang, "rope_scaling", where, dict, {})
    rope_type = params.get("rope_type", scaling.get("rope_type", scaling.get("type", "default")))
    if rope_type != "default":
        raise AudioparityError(f"{where}: rope type {rope_type!r} is not supported (only default)")
    if "rope_theta" in params:
        return _value(params, "rope_theta", f"{where} rope_parameters", float)
    return _value(lang, "rope_theta", where, float)


def parse_config(raw: dict[str, Any], where: str = CONFIG_FILE) -> MossTTSDelayConfig:
    """Build the config from the parsed ``config.json`` object.

    Raises:
        AudioparityError: a required key is missing or of another type, a size is not
            positive, or the backbone uses a feature the port does not implement (attention
            bias, an activation other than SiLU, RoPE scaling).
    """
    if not isinstance(raw, dict):
        raise AudioparityError(f"{where}: expected a JSON object")
    lang = _value(raw, "language_config", where, dict)
    lwhere = f"{where} language_config"
    heads = _value(lang, "num_attention_heads", lwhere, int)
    hidden = _value(lang, "hidden_size", lwhere, int)
    language = LanguageConfig(
        vocab_size=_value(lang, "vocab_size", lwhere, int),
        hidden_size=hidden,
        intermediate_size=_value(lang, "intermediate_size", lwhere, int),
        num_hidden_layers=_value(lang, "num_hidden_layers", lwhere, int),
        num_attention_heads=heads,
        num_key_value_heads=_value(lang, "num_key_value_heads", lwhere, int, heads),
        head_dim=_value(lang, "head_dim", lwhere, int, hidden // heads if heads > 0 else 0),
        rms_norm_eps=_value(lang, "rms_norm_eps", lwhere, float),
        rope_theta=_rope_theta(lang, lwhere),
        hidden_act=str(lang.get("hidden_act", "silu")),
        attention_bias=bool(lang.get("attention_bias", False)),
    )
    sizes = {key: getattr(language, key) for key in (
        "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
        "num_attention_heads", "num_key_value_heads", "head_dim")}
    for key, size in sizes.items():
        if size < 1:
            raise AudioparityError(f"{lwhere}: {key!r} is {size}; expected a positive integer")
    if language.hidden_act != "silu":
        raise AudioparityError(f"{lwhere}: hidden_act {language.hidden_act!r}; expected silu")
    if language.attention_bias:
        raise AudioparityError(f"{lwhere}: attention_bias is true; the port has no biases")
    if language.num_attention_heads % language.num_key_value_heads:
        raise AudioparityError(
            f"{lwhere}: {heads} attention heads not a multiple of "
            f"{language.num_key_value_heads} key/value heads"
        )
    ints = {
        key: _value(raw, key, where, int)
        for key in (
            "n_vq", "audio_vocab_size", "audio_pad_code", "pad_token_id", "im_start_token_id",
            "im_end_token_id", "audio_start_token_id", "audio_end_token_id",
            "audio_user_slot_token_id", "audio_assistant_gen_slot_token_id",
            "audio_assistant_delay_slot_token_id",
        )
    }
    return MossTTSDelayConfig(**ints, language_config=language,
                              auto_map=_value(raw, "auto_map", where, dict, None))


def load_config(model_dir: Path) -> MossTTSDelayConfig:
    """Read ``<model_dir>/config.json``.

    Raises:
        AudioparityError: no such directory, the file is missing or unreadable, or see
            :func:`parse_config`.
    """
    if not Path(model_dir).is_dir():
        raise AudioparityError(f"{model_dir}: no such checkpoint directory; expected "
                               f"{CONFIG_FILE}, safetensors and tokenizer.json inside")
    path = Path(model_dir) / CONFIG_FILE
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError) as err:
        raise AudioparityError(f"{path}: unreadable checkpoint config ({err})") from err
    return parse_config(raw, str(path))
