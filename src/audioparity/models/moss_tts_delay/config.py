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

from audioparity.errors import AudioparityError

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


def _require(obj: dict[str, Any], key: str, where: str) -> Any:
    if key not in obj:
        raise AudioparityError(f"{where}: missing key {key!r}")
    return obj[key]


def _rope_theta(lang: dict[str, Any], where: str) -> float:
    params = lang.get("rope_parameters") or {}
    scaling = lang.get("rope_scaling") or {}
    rope_type = params.get("rope_type", scaling.get("rope_type", scaling.get("type", "default")))
    if rope_type != "default":
        raise AudioparityError(f"{where}: rope type {rope_type!r} is not supported (only default)")
    if "rope_theta" in params:
        return float(params["rope_theta"])
    return float(_require(lang, "rope_theta", where))


def parse_config(raw: dict[str, Any], where: str = CONFIG_FILE) -> MossTTSDelayConfig:
    """Build the config from the parsed ``config.json`` object.

    Raises:
        AudioparityError: a required key is missing, or the backbone uses a feature the port
            does not implement (attention bias, an activation other than SiLU, RoPE scaling).
    """
    lang = _require(raw, "language_config", where)
    lwhere = f"{where} language_config"
    heads = int(_require(lang, "num_attention_heads", lwhere))
    hidden = int(_require(lang, "hidden_size", lwhere))
    language = LanguageConfig(
        vocab_size=int(_require(lang, "vocab_size", lwhere)),
        hidden_size=hidden,
        intermediate_size=int(_require(lang, "intermediate_size", lwhere)),
        num_hidden_layers=int(_require(lang, "num_hidden_layers", lwhere)),
        num_attention_heads=heads,
        num_key_value_heads=int(lang.get("num_key_value_heads") or heads),
        head_dim=int(lang.get("head_dim") or hidden // heads),
        rms_norm_eps=float(_require(lang, "rms_norm_eps", lwhere)),
        rope_theta=_rope_theta(lang, lwhere),
        hidden_act=str(lang.get("hidden_act", "silu")),
        attention_bias=bool(lang.get("attention_bias", False)),
    )
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
        key: int(_require(raw, key, where))
        for key in (
            "n_vq", "audio_vocab_size", "audio_pad_code", "pad_token_id", "im_start_token_id",
            "im_end_token_id", "audio_start_token_id", "audio_end_token_id",
            "audio_user_slot_token_id", "audio_assistant_gen_slot_token_id",
            "audio_assistant_delay_slot_token_id",
        )
    }
    return MossTTSDelayConfig(**ints, language_config=language, auto_map=raw.get("auto_map"))


def load_config(model_dir: Path) -> MossTTSDelayConfig:
    """Read ``<model_dir>/config.json``.

    Raises:
        AudioparityError: the file is missing or unreadable, or see :func:`parse_config`.
    """
    path = Path(model_dir) / CONFIG_FILE
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise AudioparityError(f"{path}: unreadable checkpoint config ({err})") from err
    return parse_config(raw, str(path))
