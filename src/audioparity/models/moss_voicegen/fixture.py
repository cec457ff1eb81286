"""A tiny, seeded MOSS-VoiceGenerator checkpoint directory, laid out as the real one.

Files (as the MOSS-TTS family's checkpoints ship them, minus the audio tokenizer):

- ``config.json``: ``MossTTSDelayConfig`` fields with the checkpoint's names (``n_vq``,
  ``audio_vocab_size``, ``audio_pad_code``, the special token ids) and ``language_config``, a
  Qwen3 config (hidden 64, 2 layers, 4 heads, 2 key/value heads, head_dim 16, SwiGLU 160, RMSNorm
  eps 1e-6, legacy ``rope_theta`` key);
- ``model.safetensors``: ``language_model.*``, ``emb_ext.{i}.weight``, ``lm_heads.{j}.weight``,
  stored bfloat16 like the real checkpoint, the pad row (``audio_pad_code``) of every
  ``emb_ext`` zero;
- ``tokenizer.json`` (byte-level BPE with Qwen's pre-tokenizer split, trained here offline on
  :data:`CORPUS`, English and Chinese, special tokens appended after the merges as Qwen's are)
  and ``tokenizer_config.json`` with the ChatML chat template.

Random weights alone make greedy generation dull (the text head never opens an audio segment), so
:func:`draw_weights` keeps hidden channel :data:`BIAS_CHANNEL` constant through the residual
stream (a constant embedding column that no layer writes to) and uses it as a bias of the text
head: step 0 opens an audio segment, then the random part of the head chooses between generation
and delay slots, so 16 greedy rows exercise the delay pattern.

``massive_activation=True`` adds a "super weight" (as Qwen's attention-sink activations arise): one
SwiGLU unit of layer 0 that fires at the first row (``<|im_start|>``) only, with an output (~1e5,
beyond float16's 65504) on hidden channel :data:`MASSIVE_CHANNEL`. Float32 stays finite; activations
converted to float16 overflow, and attention spreads the NaN to every row.

``remote_code=True`` copies the checkpoint-style modules of :mod:`.remote_code` into the directory
and sets ``auto_map`` (``config.json``) and ``processor_config.json``, so the reference loads it
with ``trust_remote_code`` as it loads the real checkpoint.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import numpy as np

from audioparity.dumping.artifacts import built_directory

log = logging.getLogger("audioparity")

#: Text the tokenizer is trained on (written for this project), English and Chinese.
CORPUS = (
    "<user_inst> - Reference(s): - Instruction: - Tokens: - Quality: - Sound Event: "
    "- Ambient Sound: - Language: - Text: </user_inst> None user assistant",
    "A small model can still check that two programs compute the same numbers.",
    "Calm, clear male narrator with an even tempo and precise articulation.",
    "Good morning everyone and welcome to the weekly meeting.",
    "Cheerful, energetic young host speaking quickly with a bright tone.",
    "Parity checks compare every stage of the port with the reference model.",
    "The weather is lovely today, so we walk slowly through the quiet park.",
    "English, Chinese, voice, speech, audio, language, instruction, warm, deep, soft, loud.",
    "今天天气很好，我们一起去公园散步吧。",
    "温柔的年轻女性声音，语速适中，语气亲切自然。",
    "请用平静的男声朗读这段文字，声音低沉而清晰。",
    "这是一个很小的模型，用来检查两个程序是否计算出相同的结果。",
    "中文，英文，声音，语言，文本，参考，质量，环境音，事件。",
)

#: Qwen2/Qwen3's pre-tokenizer split (contractions, letter runs, single digits, punctuation).
QWEN_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
#: Byte-level BPE vocabulary before the special tokens.
BPE_VOCAB_SIZE = 480
#: Special tokens, appended after the BPE vocabulary in this order (the config's token ids).
SPECIAL_TOKENS = {
    "pad_token_id": "<|endoftext|>",
    "im_start_token_id": "<|im_start|>",
    "im_end_token_id": "<|im_end|>",
    "audio_start_token_id": "<|audio_start|>",
    "audio_end_token_id": "<|audio_end|>",
    "audio_user_slot_token_id": "<|audio_user_slot|>",
    "audio_assistant_gen_slot_token_id": "<|audio_gen_slot|>",
    "audio_assistant_delay_slot_token_id": "<|audio_delay_slot|>",
}
#: The text vocabulary (head rows) is padded up to a multiple of this, as Qwen's is.
VOCAB_MULTIPLE = 64

#: Qwen ChatML without a default system turn; the generation prompt opens the assistant turn.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

N_VQ = 4
AUDIO_VOCAB_SIZE = 96
HIDDEN = 64
INTERMEDIATE = 160
LAYERS = 2
HEADS = 4
KV_HEADS = 2
HEAD_DIM = 16

#: Hidden channel held constant through the residual stream, used as the text head's bias.
BIAS_CHANNEL = 0
#: Value of :data:`BIAS_CHANNEL` in every text embedding row.
BIAS_VALUE = 4.0
#: Text-head weight on :data:`BIAS_CHANNEL`: every token, then the special tokens steering
#: greedy generation (open an audio segment, mix generation and delay slots, no early stop).
HEAD_BIAS = {"default": -1.0, "audio_start_token_id": 3.0,
             "audio_assistant_gen_slot_token_id": 0.3,
             "audio_assistant_delay_slot_token_id": 0.0, "im_end_token_id": -3.0}
#: Hidden channel receiving the massive activation; layer-0 SwiGLU channel producing it.
MASSIVE_CHANNEL = 7
MASSIVE_UNIT = 0
#: Scale of the massive unit's gate and up rows, and the fraction of ``|a|`` (the MLP input at
#: row 0) the gate must exceed: (1 - 0.75) * (8 * 80)^2 ~ 1e5 > 65504 at row 0.
MASSIVE_GAIN = 80.0
MASSIVE_THRESHOLD = 0.75


def train_tokenizer():
    """Byte-level BPE over :data:`CORPUS` plus :data:`SPECIAL_TOKENS` (``tokenizers.Tokenizer``)."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=BPE_VOCAB_SIZE, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(CORPUS, trainer=trainer)
    tokenizer.add_special_tokens(list(SPECIAL_TOKENS.values()))
    return tokenizer


def fixture_config(tokenizer) -> dict:
    """``config.json`` of the fixture (``MossTTSDelayConfig`` names; Qwen3 ``language_config``)."""
    ids = {key: tokenizer.token_to_id(token) for key, token in SPECIAL_TOKENS.items()}
    size = tokenizer.get_vocab_size()
    vocab = -(-size // VOCAB_MULTIPLE) * VOCAB_MULTIPLE
    return {
        "architectures": ["MossTTSDelayModel"],
        "model_type": "moss_tts_delay",
        "n_vq": N_VQ,
        "audio_vocab_size": AUDIO_VOCAB_SIZE,
        "audio_pad_code": AUDIO_VOCAB_SIZE,
        **ids,
        "sampling_rate": 24000,
        "initializer_range": 0.02,
        "torch_dtype": "bfloat16",
        "language_config": {
            "model_type": "qwen3",
            "vocab_size": vocab,
            "hidden_size": HIDDEN,
            "intermediate_size": INTERMEDIATE,
            "num_hidden_layers": LAYERS,
            "num_attention_heads": HEADS,
            "num_key_value_heads": KV_HEADS,
            "head_dim": HEAD_DIM,
            "hidden_act": "silu",
            "max_position_embeddings": 40960,
            "rms_norm_eps": 1e-6,
            "rope_theta": 1000000.0,
            "rope_scaling": None,
            "attention_bias": False,
            "attention_dropout": 0.0,
            "tie_word_embeddings": False,
            "use_sliding_window": False,
            "sliding_window": None,
            "max_window_layers": LAYERS,
            "initializer_range": 0.02,
            "bos_token_id": ids["pad_token_id"],
            "eos_token_id": ids["im_end_token_id"],
            "torch_dtype": "bfloat16",
        },
    }


def _linear(rng: np.random.Generator, out_features: int, in_features: int) -> np.ndarray:
    return rng.standard_normal((out_features, in_features)) / np.sqrt(in_features)


def _norm(rng: np.random.Generator, size: int) -> np.ndarray:
    return 1.0 + 0.1 * rng.standard_normal(size)


def draw_weights(config: dict, seed: int, massive_activation: bool) -> dict[str, np.ndarray]:
    """Seeded float32 weights under the checkpoint's names (``nn.Linear`` layout ``[out, in]``).

    Layer outputs (``o_proj``, ``down_proj``) never write :data:`BIAS_CHANNEL`, codebook
    embeddings never hold it, and every ``emb_ext`` pad row is zero.
    """
    lang = config["language_config"]
    vocab, hidden, inter = lang["vocab_size"], lang["hidden_size"], lang["intermediate_size"]
    q_dim = lang["num_attention_heads"] * lang["head_dim"]
    kv_dim = lang["num_key_value_heads"] * lang["head_dim"]
    audio_rows = config["audio_vocab_size"] + 1
    rng = np.random.default_rng(seed)
    w: dict[str, np.ndarray] = {}
    embed = rng.standard_normal((vocab, hidden))
    embed[:, BIAS_CHANNEL] = BIAS_VALUE
    w["language_model.embed_tokens.weight"] = embed
    for i in range(lang["num_hidden_layers"]):
        p = f"language_model.layers.{i}."
        w[p + "input_layernorm.weight"] = _norm(rng, hidden)
        w[p + "self_attn.q_proj.weight"] = _linear(rng, q_dim, hidden)
        w[p + "self_attn.k_proj.weight"] = _linear(rng, kv_dim, hidden)
        w[p + "self_attn.v_proj.weight"] = _linear(rng, kv_dim, hidden)
        w[p + "self_attn.o_proj.weight"] = _linear(rng, hidden, q_dim)
        w[p + "self_attn.q_norm.weight"] = _norm(rng, lang["head_dim"])
        w[p + "self_attn.k_norm.weight"] = _norm(rng, lang["head_dim"])
        w[p + "post_attention_layernorm.weight"] = _norm(rng, hidden)
        w[p + "mlp.gate_proj.weight"] = _linear(rng, inter, hidden)
        w[p + "mlp.up_proj.weight"] = _linear(rng, inter, hidden)
        w[p + "mlp.down_proj.weight"] = _linear(rng, hidden, inter)
        w[p + "self_attn.o_proj.weight"][BIAS_CHANNEL] = 0.0
        w[p + "mlp.down_proj.weight"][BIAS_CHANNEL] = 0.0
    w["language_model.norm.weight"] = _norm(rng, hidden)
    for i in range(config["n_vq"]):
        table = rng.standard_normal((audio_rows, hidden))
        table[:, BIAS_CHANNEL] = 0.0
        table[config["audio_pad_code"]] = 0.0
        w[f"emb_ext.{i}.weight"] = table
    text_head = _linear(rng, vocab, hidden)
    text_head[:, BIAS_CHANNEL] = HEAD_BIAS["default"]
    for key, value in HEAD_BIAS.items():
        if key != "default":
            text_head[config[key], BIAS_CHANNEL] = value
    w["lm_heads.0.weight"] = text_head
    for i in range(config["n_vq"]):
        w[f"lm_heads.{i + 1}.weight"] = _linear(rng, audio_rows, hidden)
    if massive_activation:
        _plant_massive_activation(w, config)
    return {name: array.astype(np.float32) for name, array in w.items()}


def _mlp_input_at_row0(w: dict[str, np.ndarray], config: dict) -> np.ndarray:
    """Layer 0's MLP input ``[H]`` at row 0 (``<|im_start|>``, which attends only to itself):
    ``post_attention_layernorm(x + o_proj(repeat_kv(v_proj(input_layernorm(x)))))``."""
    lang = config["language_config"]
    eps, p = lang["rms_norm_eps"], "language_model.layers.0."

    def norm(x: np.ndarray, weight: np.ndarray) -> np.ndarray:
        return x / np.sqrt(np.mean(x**2) + eps) * weight

    x = w["language_model.embed_tokens.weight"][config["im_start_token_id"]]
    v = w[p + "self_attn.v_proj.weight"] @ norm(x, w[p + "input_layernorm.weight"])
    group = lang["num_attention_heads"] // lang["num_key_value_heads"]
    heads = np.repeat(v.reshape(lang["num_key_value_heads"], -1), group, axis=0)
    return norm(x + w[p + "self_attn.o_proj.weight"] @ heads.ravel(),
                w[p + "post_attention_layernorm.weight"])


def _plant_massive_activation(w: dict[str, np.ndarray], config: dict) -> None:
    """Make layer 0's SwiGLU unit :data:`MASSIVE_UNIT` fire at row 0 only and write its ~1e5
    output to hidden channel :data:`MASSIVE_CHANNEL` (a "super weight").

    With ``h`` the MLP input and ``a`` its value at row 0 (:func:`_mlp_input_at_row0`), ``u =
    a / |a|``: ``up = g u.h`` and ``gate = g (u.h - t |a|)`` (``t`` = :data:`MASSIVE_THRESHOLD`,
    the offset carried by the constant :data:`BIAS_CHANNEL`); so ``silu(gate) * up ~ (1 - t) g^2
    |a|^2`` at row 0 and ~0 at rows less aligned with it.
    """
    p = "language_model.layers.0."
    anchor = _mlp_input_at_row0(w, config)
    direction = anchor / np.linalg.norm(anchor)
    gate = MASSIVE_GAIN * direction
    gate[BIAS_CHANNEL] -= (MASSIVE_GAIN * MASSIVE_THRESHOLD * np.linalg.norm(anchor)
                           / anchor[BIAS_CHANNEL])
    w[p + "mlp.gate_proj.weight"][MASSIVE_UNIT] = gate
    w[p + "mlp.up_proj.weight"][MASSIVE_UNIT] = MASSIVE_GAIN * direction
    w[p + "mlp.down_proj.weight"][:, MASSIVE_UNIT] = 0.0
    w[p + "mlp.down_proj.weight"][MASSIVE_CHANNEL, MASSIVE_UNIT] = 1.0


def _write_json(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n",
                    encoding="utf-8")


def _save_bf16(weights: dict[str, np.ndarray], path: Path) -> None:
    import torch
    from safetensors.torch import save_file

    tensors = {name: torch.from_numpy(array).to(torch.bfloat16)
               for name, array in sorted(weights.items())}
    save_file(tensors, str(path), metadata={"format": "pt"})


def build_fixture(output: Path, seed: int = 0, massive_activation: bool = False,
                  remote_code: bool = False) -> None:
    """Write the tiny checkpoint directory ``output`` (atomically:
    :func:`~audioparity.dumping.artifacts.built_directory`).

    The same arguments give the same bytes.

    Args:
        output: checkpoint directory to create (replaced if it exists).
        seed: seed of the weights.
        massive_activation: plant one activation channel beyond the float16 range.
        remote_code: also ship the checkpoint-style modeling code with ``auto_map``.

    Raises:
        AudioparityError: the parent directory cannot be written.
    """
    output = Path(output)
    with built_directory(output) as tmp:
        tokenizer = train_tokenizer()
        config = fixture_config(tokenizer)
        tokenizer.save(str(tmp / "tokenizer.json"))
        _write_json(tmp / "tokenizer_config.json", {
            "tokenizer_class": "Qwen2Tokenizer",
            "chat_template": CHAT_TEMPLATE,
            "bos_token": None,
            "eos_token": SPECIAL_TOKENS["im_end_token_id"],
            "pad_token": SPECIAL_TOKENS["pad_token_id"],
            "add_bos_token": False,
            "model_max_length": 40960,
        })
        if remote_code:
            from audioparity.models.moss_voicegen import remote_code as code

            for name in code.FILES:
                shutil.copyfile(code.SOURCE_DIR / name, tmp / name)
            config["auto_map"] = dict(code.AUTO_MAP)
            _write_json(tmp / "processor_config.json", {
                "auto_map": dict(code.PROCESSOR_AUTO_MAP),
                "processor_class": "MossTTSDelayProcessor",
            })
        _write_json(tmp / "config.json", config)
        _save_bf16(draw_weights(config, seed, massive_activation), tmp / "model.safetensors")
    log.info("moss fixture %s (seed %d%s%s)", output, seed,
             ", massive activation" if massive_activation else "",
             ", remote code" if remote_code else "")
