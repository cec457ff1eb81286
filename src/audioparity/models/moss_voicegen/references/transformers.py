"""The second reference of a MOSS-VoiceGenerator checkpoint (implementation ``transformers``):
the backbone as transformers' own ``Qwen3Model``, everything around it plain torch ops on the
checkpoint's tensors; neither ``MossTTSDelayModel`` nor the checkpoint's modeling code runs.

Model (:func:`load_model`): ``Qwen3Model`` built from the checkpoint's ``language_config`` (a
``Qwen3Config``, eager attention, float32) with its ``language_model.*`` weights; the codebook
embeddings ``emb_ext.{k}.weight`` and the heads ``lm_heads.{j}.weight`` kept as tensors. All
read with the ``safetensors`` package (bfloat16 widened to float32 exactly); CPU, batch size 1.

Prompt: the rows come as the ``remote_code`` reference's (:func:`.reference.reference_prompt`):
they are the input, not what is compared. Stages, names and layouts: those of
:mod:`.reference` (:func:`.stages.prefill_outputs`, :func:`.stages.generation_outputs`, the
family's own greedy generation under the delay pattern); ``step_last_hidden`` and the
generation run through the ``DynamicCache`` that transformers' ``Qwen3Model`` makes and
returns. Importing this module imports neither torch nor ggml.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from audioparity.contract.errors import AudioparityError
from audioparity.contract.family import Case, Outputs, ReferenceLibrary
from audioparity.contract.taps import Taps
from audioparity.models.moss_voicegen.config import CONFIG_FILE, MossTTSDelayConfig
from audioparity.models.moss_voicegen.spec import Names
from audioparity.models.moss_voicegen.stages import Forward

#: The checkpoint's prefix of the backbone's weights (``MossTTSDelayModel.language_model``).
BACKBONE_PREFIX = "language_model."


@dataclass(frozen=True)
class Qwen3Reference:
    """What :func:`load_model` returns.

    Attributes:
        backbone: transformers' ``Qwen3Model`` (float32, eval, eager attention).
        codebook_embeddings: ``n_vq`` tensors ``[audio_vocab_size+1, H]`` (``emb_ext.{k}``).
        heads: ``1 + n_vq`` tensors ``[out, H]`` (``lm_heads.{j}``, ``nn.Linear`` layout): the
            text head ``[vocab_size, H]``, then one ``[audio_vocab_size+1, H]`` per codebook.
    """

    backbone: Any
    codebook_embeddings: tuple
    heads: tuple


def qwen3_config(model_dir: Path):
    """transformers' ``Qwen3Config`` of the checkpoint's ``language_config`` object, every key
    as the checkpoint spells it, eager attention (as ``MossTTSDelayConfig.__init__`` builds its
    ``language_config``).

    Raises:
        AudioparityError: ``config.json`` unreadable or without a ``language_config`` object.
    """
    from transformers import Qwen3Config

    path = Path(model_dir) / CONFIG_FILE
    try:
        language = json.loads(path.read_text())["language_config"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise AudioparityError(f"{path}: no readable language_config ({err!r})") from None
    if not isinstance(language, dict):
        raise AudioparityError(f"{path}: language_config is not an object")
    qwen = Qwen3Config(**language)
    qwen._attn_implementation = "eager"
    return qwen


def read_tensors(model_dir: Path, names: list[str]) -> dict[str, Any]:
    """The named tensors of the checkpoint's safetensors files (one file or an index's shards,
    :func:`~audioparity.checkpoints.safetensors.shard_files`), read with the ``safetensors``
    package as float32 torch tensors (bfloat16 and float16 widen exactly).

    Raises:
        AudioparityError: a name no file holds.
    """
    import torch
    from safetensors import safe_open

    from audioparity.checkpoints.safetensors import shard_files

    wanted, found = set(names), {}
    for path in shard_files(Path(model_dir)):
        with safe_open(str(path), framework="pt") as file:
            for name in wanted.intersection(file.keys()):
                found[name] = file.get_tensor(name).to(torch.float32)
    missing = sorted(wanted - set(found))
    if missing:
        raise AudioparityError(f"{model_dir}: missing weights {missing[:5]}")
    return found


def load_model(model_dir: Path, config: MossTTSDelayConfig) -> Qwen3Reference:
    """The checkpoint as :class:`Qwen3Reference`: a ``Qwen3Model`` (:func:`qwen3_config`), float32
    whatever dtype its config names, given the ``language_model.*`` weights strictly (every
    parameter, nothing else), and the ``emb_ext``/``lm_heads`` tensors (:mod:`.checkpoint`
    names and shapes, checked there).

    Raises:
        AudioparityError: a weight missing from the checkpoint, or one the model does not take.
    """
    import torch
    from transformers import Qwen3Model

    from audioparity.models.moss_voicegen.checkpoint import expected_shapes

    tensors = read_tensors(model_dir, list(expected_shapes(config)))
    backbone = Qwen3Model(qwen3_config(model_dir)).to(torch.float32)
    state = {name.removeprefix(BACKBONE_PREFIX): tensor for name, tensor in tensors.items()
             if name.startswith(BACKBONE_PREFIX)}
    result = backbone.load_state_dict(state, strict=False)
    if result.missing_keys or result.unexpected_keys:
        raise AudioparityError(f"{model_dir}: weights do not match transformers' Qwen3Model: "
                               f"missing {result.missing_keys[:5]}, unexpected "
                               f"{result.unexpected_keys[:5]}")
    return Qwen3Reference(
        backbone=backbone.eval(),
        codebook_embeddings=tuple(tensors[f"emb_ext.{k}.weight"] for k in range(config.n_vq)),
        heads=tuple(tensors[f"lm_heads.{j}.weight"] for j in range(1 + config.n_vq)),
    )


def input_embeddings(model: Qwen3Reference, rows):
    """``[1, n, 1+n_vq]`` long rows -> ``[1, n, H]``: the backbone's ``embed_tokens`` of column 0
    plus the row ``rows[..., k+1]`` of codebook ``k``'s embedding, added in codebook order
    (mirrors ``MossTTSDelayModel._compute_input_embeddings``; the pad code's row is data, added
    like any other)."""
    import torch.nn.functional as F

    embeddings = model.backbone.embed_tokens(rows[..., 0])
    for k, table in enumerate(model.codebook_embeddings):
        embeddings = embeddings + F.embedding(rows[..., k + 1], table)
    return embeddings


def decoder(model: Qwen3Reference, embeddings, cache):
    """transformers' ``Qwen3Model.forward`` on ``inputs_embeds`` ``[1, n, H]`` after ``cache``:
    None for a prefill (the model then makes its ``DynamicCache`` from its config), else the
    ``DynamicCache`` of the previous rows, positions continuing from them.

    Returns:
        ``(hidden [n, H], layers [n_layers, n, H], cache)``: the final (normed) hidden states,
        each ``Qwen3DecoderLayer``'s output (forward hooks; the last layer's before the final
        norm), and the ``DynamicCache`` after the rows.
    """
    layers = model.backbone.layers
    with Taps("decoder") as taps:
        taps.outputs(Names.LAYER, layers)
        # The cache is Qwen3Model.forward's 4th parameter (``past_key_values`` until
        # transformers 5.x renamed it ``cache``); passed by position to fit both.
        out = model.backbone(None, None, None, cache, inputs_embeds=embeddings, use_cache=True)
    layer_outputs = np.stack([taps.once(Names.LAYER.at(i))[0].numpy() for i in range(len(layers))])
    return (out.last_hidden_state[0], layer_outputs,
            out.cache if hasattr(out, "cache") else out.past_key_values)


def heads(model: Qwen3Reference, hidden) -> tuple[np.ndarray, np.ndarray]:
    """The heads at the last of ``hidden`` ``[n, H]``'s rows: text ``[vocab_size]`` and audio
    ``[n_vq, audio_vocab_size+1]`` with the pad logit ``-inf`` (mirrors ``lm_heads`` and the
    ``-inf`` of ``MossTTSDelayModel.forward``). Each head multiplies every row, as upstream does,
    and keeps the last: the same matmul shape as the ``remote_code`` reference, whose last row
    it then equals bitwise (the last row alone, ``[1, H]``, differs from it by float32 noise,
    ~2e-6 on the tiny fixtures: another GEMM kernel blocking)."""
    import torch
    import torch.nn.functional as F

    logits = [F.linear(hidden, weight)[-1] for weight in model.heads]
    audio = torch.stack(logits[1:])
    audio[:, -1] = float("-inf")
    return logits[0].numpy(), audio.numpy()


def forward(model: Qwen3Reference, rows, cache=None) -> tuple[Forward, Any]:
    """One forward of ``rows`` ``[1, n, 1+n_vq]`` after ``cache`` (a ``DynamicCache``; None for
    a prefill): :func:`input_embeddings`, :func:`decoder`, :func:`heads`.

    Returns:
        The :class:`~.stages.Forward` of the rows, and the cache after them.
    """
    embeddings = input_embeddings(model, rows)
    hidden, layers, cache = decoder(model, embeddings, cache)
    text, audio = heads(model, hidden)
    return Forward(embeddings=embeddings[0].numpy(), hidden=hidden.numpy(), layers=layers,
                   text_logits=text, audio_logits=audio), cache


def stages(model: Qwen3Reference, case: Case, generate_rows: int) -> Outputs:
    """The stages of one case (those of :func:`.reference.stages`, module docstring) with the
    loaded ``model``, through :func:`forward`.

    Raises:
        AudioparityError: a prompt of fewer than 3 rows.
    """
    import transformers

    from audioparity.models.moss_voicegen.references import remote_code as reference

    yield from reference.stages(
        model, case, generate_rows, run=forward, modeling="transformers Qwen3Model",
        note=f"transformers {transformers.__version__} Qwen3Model, float32, eager attention; "
             "codebook embeddings and heads as torch ops on the checkpoint's tensors")


class Transformers(ReferenceLibrary):
    """transformers' ``Qwen3Model`` and the checkpoint's tensors, without its modeling code
    (:func:`load_model`, :func:`stages`)."""

    @classmethod
    def check(cls, model: Path, config: Any, cases: list[Case], *, emulates: bool) -> None:
        """Refuse a quantization-aware reference: the embeddings and heads are tensors, not the
        modules :func:`~audioparity.dumping.emulation.emulating` rounds.

        Raises:
            AudioparityError: ``emulates``.
        """
        if emulates:
            raise AudioparityError(f"{model}: the {cls.name} reference of moss_voicegen has no "
                                   "quantization-aware form; emulate with remote_code")

    def __init__(self, model: Path, config: MossTTSDelayConfig, options: Mapping[str, Any]
                 ) -> None:
        super().__init__(model, config, options)
        self.loaded = load_model(model, config)

    @property
    def module(self) -> Any:
        return self.loaded.backbone

    def stages(self, case: Case) -> Outputs:
        return stages(self.loaded, case, case.options["generate_rows"])
