"""Parakeet-TDT checkpoints: every tensor NeMo-named, from a ``.nemo`` or a Hugging Face
Parakeet directory, checked against the shapes the config implies; nothing needs torch or ggml.

Sources:

- ``.nemo``: a tar (:mod:`audioparity.checkpoints.nemo`) holding ``model_config.yaml`` and
  ``model_weights.ckpt``, a state dict written by ``torch.save`` and read by
  :mod:`audioparity.checkpoints.torch_zip` (NeMo itself is not needed either).
- Hugging Face directory: ``config.json`` + ``model.safetensors`` (or a sharded
  ``model.safetensors.index.json``), read by :mod:`audioparity.checkpoints.safetensors`
  (bf16 widened exactly). Keys are mapped back to NeMo's by inverting transformers'
  ``convert_nemo_to_hf.py`` (``relative_k_proj`` -> ``linear_pos``, ``bias_u`` ->
  ``pos_bias_u``, ``q_proj`` -> ``linear_q``, ``encoder_projector`` -> ``joint.enc``, ...).

The NeMo reference (:func:`check_weights`, before NeMo loads the file) and the ggml side
(:func:`~.layout.checkpoint_weights`) check the tensors alike, so both refuse a bad checkpoint
with the same message.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

from audioparity.checkpoints import float_entries
from audioparity.checkpoints.floats import check_finite
from audioparity.checkpoints.nemo import copy_nemo_member
from audioparity.checkpoints.renames import Renames
from audioparity.checkpoints.torch_zip import torch_entries
from audioparity.contract.errors import AudioparityError
from audioparity.dumping.memory import reference_bytes, refuse_if_over
from audioparity.models.parakeet_tdt.config import EncoderConfig, ParakeetTDTConfig

#: NeMo parameter names against transformers' Parakeet names (transformers'
#: ``convert_nemo_to_hf.py``: ``ConvSubsampling`` -> ``ParakeetEncoderSubsamplingConv2D``,
#: ``RelPositionMultiHeadAttention`` -> ``ParakeetEncoderAttention``, the conv module's
#: ``batch_norm`` -> ``norm``, ``RNNTDecoder`` -> ``ParakeetRNNTDecoder``, ``RNNTJoint`` ->
#: ``encoder_projector``, ``decoder_projector`` and ``ParakeetRNNTJointNetwork.head``,
#: ``ConvASRDecoder`` -> ``ParakeetEncoderCTCHead``; no tensor changes shape or layout): the
#: one table of the pair, read NeMo -> transformers by the
#: transformers reference and transformers -> NeMo to read a Hugging Face directory. A CTC
#: decoder is ``decoder`` in ``EncDecCTCModelBPE`` and ``ctc_decoder`` in the hybrid, transformers'
#: ``ctc_head`` in both (its ``ParakeetForCTC`` is the former).
NEMO_TRANSFORMERS = Renames((
    ("^encoder.pre_encode.conv.", "^encoder.subsampling.layers."),
    ("^encoder.pre_encode.out.", "^encoder.subsampling.linear."),
    ("^encoder.pos_enc.", "^encoder.encode_positions."),
    (".conv.batch_norm.", ".conv.norm."),
    *((f".self_attn.linear_{x}.", f".self_attn.{x}_proj.") for x in "qkv"),
    (".self_attn.linear_out.", ".self_attn.o_proj."),
    (".self_attn.linear_pos.", ".self_attn.relative_k_proj."),
    *((f".self_attn.pos_bias_{x}$", f".self_attn.bias_{x}$") for x in "uv"),
    ("^decoder.prediction.embed.", "^decoder.embedding."),
    ("^decoder.prediction.dec_rnn.lstm.", "^decoder.lstm."),
    ("^joint.enc.", "^encoder_projector."),
    ("^joint.pred.", "^decoder.decoder_projector."),
    ("^joint.joint_net.2.", "^joint.head."),
    ("^decoder.decoder_layers.0.", "^ctc_head."),
    ("^ctc_decoder.decoder_layers.0.", "^ctc_head."),
))


def expected_shapes(config: ParakeetTDTConfig) -> dict[str, tuple[int, ...]]:
    """Checkpoint (NeMo) name -> shape of every tensor the port reads, from the config, in
    module order: the subsampling, the layers, a CTC decoder, a transducer.

    Mirrors the parameters of ``ConvSubsampling`` (dw_striding or striding), ``ConformerLayer``,
    ``RNNTDecoder`` and ``RNNTJoint`` (a transducer), ``ConvASRDecoder`` (a CTC decoder).
    Linear/conv biases of the layers only when ``use_bias``.
    """
    shapes = _subsampling_shapes(config.encoder)
    for i in range(config.encoder.n_layers):
        shapes.update({f"encoder.layers.{i}.{name}": shape
                       for name, shape in _layer_shapes(config.encoder).items()})
    if config.ctc is not None:
        prefix, classes = config.ctc.prefix, config.ctc.num_classes + 1
        shapes[f"{prefix}.decoder_layers.0.weight"] = (classes, config.ctc.feat_in, 1)
        shapes[f"{prefix}.decoder_layers.0.bias"] = (classes,)
    if config.transducer:
        shapes.update(_transducer_shapes(config))
    return shapes


def _subsampling_shapes(enc: EncoderConfig) -> dict[str, tuple[int, ...]]:
    """``encoder.pre_encode`` (``ConvSubsampling``): the first 3x3 conv, the ``out``
    projection, then per further stage a depthwise and a pointwise conv (``dw_striding``) or a
    full 3x3 conv (``striding``)."""
    d, c = enc.d_model, enc.subsampling_conv_channels
    n_sub = int(np.log2(enc.subsampling_factor))
    freq = enc.subsampled_length(enc.feat_in)
    shapes: dict[str, tuple[int, ...]] = {
        "encoder.pre_encode.conv.0.weight": (c, 1, 3, 3),
        "encoder.pre_encode.conv.0.bias": (c,),
        "encoder.pre_encode.out.weight": (d, c * freq),
        "encoder.pre_encode.out.bias": (d,),
    }
    for i in range(n_sub - 1):
        convs = {2 + 2 * i: (c, c, 3, 3)} if enc.subsampling == "striding" else \
            {2 + 3 * i: (c, 1, 3, 3), 3 + 3 * i: (c, c, 1, 1)}
        for index, shape in convs.items():
            shapes[f"encoder.pre_encode.conv.{index}.weight"] = shape
            shapes[f"encoder.pre_encode.conv.{index}.bias"] = (c,)
    return shapes


def _layer_shapes(enc: EncoderConfig) -> dict[str, tuple[int, ...]]:
    """One ``ConformerLayer``'s tensors, named within the layer (``self_attn.linear_q.weight``):
    feed-forwards, attention, conv module, norms, and the biases of ``use_bias``."""
    d, k = enc.d_model, enc.conv_kernel_size
    layer = {
        "feed_forward1.linear1.weight": (enc.d_ff, d),
        "feed_forward1.linear2.weight": (d, enc.d_ff),
        "self_attn.linear_q.weight": (d, d),
        "self_attn.linear_k.weight": (d, d),
        "self_attn.linear_v.weight": (d, d),
        "self_attn.linear_out.weight": (d, d),
        "self_attn.linear_pos.weight": (d, d),
        "self_attn.pos_bias_u": (enc.n_heads, enc.d_k),
        "self_attn.pos_bias_v": (enc.n_heads, enc.d_k),
        "conv.pointwise_conv1.weight": (2 * d, d, 1),
        "conv.depthwise_conv.weight": (d, 1, k),
        "conv.batch_norm.weight": (d,),
        "conv.batch_norm.bias": (d,),
        "conv.batch_norm.running_mean": (d,),
        "conv.batch_norm.running_var": (d,),
        "conv.pointwise_conv2.weight": (d, d, 1),
        "feed_forward2.linear1.weight": (enc.d_ff, d),
        "feed_forward2.linear2.weight": (d, enc.d_ff),
    }
    for norm in ("norm_feed_forward1", "norm_self_att", "norm_conv", "norm_feed_forward2",
                 "norm_out"):
        layer[f"{norm}.weight"] = (d,)
        layer[f"{norm}.bias"] = (d,)
    if enc.use_bias:
        for name in ("feed_forward1.linear1", "feed_forward2.linear1"):
            layer[f"{name}.bias"] = (enc.d_ff,)
        for name in ("feed_forward1.linear2", "feed_forward2.linear2", "self_attn.linear_q",
                     "self_attn.linear_k", "self_attn.linear_v", "self_attn.linear_out",
                     "conv.depthwise_conv", "conv.pointwise_conv2"):
            layer[f"{name}.bias"] = (d,)
        layer["conv.pointwise_conv1.bias"] = (2 * d,)
    return layer


def _transducer_shapes(config: ParakeetTDTConfig) -> dict[str, tuple[int, ...]]:
    """The prediction network (``decoder.prediction``: embedding, stacked LSTM) and the
    joint (``joint.pred``, ``joint.enc``, ``joint.joint_net.2``)."""
    dec, joint = config.decoder, config.joint
    h = dec.pred_hidden
    shapes = {"decoder.prediction.embed.weight": (dec.vocab_size + 1, h)}
    for layer_index in range(dec.pred_rnn_layers):
        for kind in ("ih", "hh"):
            shapes[f"decoder.prediction.dec_rnn.lstm.weight_{kind}_l{layer_index}"] = (4 * h, h)
            shapes[f"decoder.prediction.dec_rnn.lstm.bias_{kind}_l{layer_index}"] = (4 * h,)
    shapes["joint.pred.weight"] = (joint.joint_hidden, joint.pred_hidden)
    shapes["joint.pred.bias"] = (joint.joint_hidden,)
    shapes["joint.enc.weight"] = (joint.joint_hidden, joint.encoder_hidden)
    shapes["joint.enc.bias"] = (joint.joint_hidden,)
    shapes["joint.joint_net.2.weight"] = (config.n_joint_outputs, joint.joint_hidden)
    shapes["joint.joint_net.2.bias"] = (config.n_joint_outputs,)
    return shapes


class Checkpoint:
    """The float tensors of a ``.nemo`` file or Hugging Face directory, NeMo-named, from the
    headers; each read on demand. A context manager: a ``.nemo``'s ``model_weights.ckpt`` is
    read in place inside the tar, or, when the tar is compressed, extracted to a temporary file
    (so its zip can be read by random access) until :meth:`close`.

    Attributes:
        model: the checkpoint.
        entries: NeMo name -> entry (``.shape``, ``.kind`` ``f32|f16|bf16``, ``.read()``):
            :class:`TorchEntry` of a ``.nemo``, :class:`~audioparity.checkpoint.Entry` of a
            Hugging Face directory's F32/F16/BF16 tensors (others are left out).

    Raises:
        AudioparityError: an unreadable checkpoint (see
            :func:`~audioparity.checkpoints.float_entries`).
    """

    def __init__(self, model: Path) -> None:
        self.model = Path(model)
        self._scratch: tempfile.TemporaryDirectory | None = None
        where = f"{self.model}: model_weights.ckpt"
        entries = float_entries(self.model, where)  # None: a compressed .nemo
        if entries is not None:
            self.entries = ({NEMO_TRANSFORMERS.left(name): entry for name, entry in entries.items()}
                            if self.model.is_dir() else entries)
            return
        self._scratch = tempfile.TemporaryDirectory(prefix="audioparity_ckpt_")
        try:
            ckpt = Path(self._scratch.name) / "model_weights.ckpt"
            with open(ckpt, "wb") as out:
                copy_nemo_member(self.model, "model_weights.ckpt", out)
            self.entries = torch_entries(ckpt, where=where)
        except BaseException:
            self.close()
            raise

    @property
    def native(self) -> dict[str, str]:
        """Name -> stored dtype ``f32|f16|bf16``."""
        return {name: entry.kind for name, entry in self.entries.items()}

    def read(self, name: str) -> np.ndarray:
        """Tensor ``name`` as a new float32 array, checked finite.

        Raises:
            AudioparityError: the tensor holds NaN or infinity (named, with the counts).
        """
        array = self.entries[name].read()
        check_finite(name, array, self.model)
        return array

    def check_shapes(self, expected: dict[str, tuple[int, ...]]) -> None:
        """Every tensor of ``expected`` present with its shape (headers only).

        Raises:
            AudioparityError: a missing tensor, or a shape that differs (naming the key and
                both shapes).
        """
        missing = [name for name in expected if name not in self.entries]
        if missing:
            more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
            raise AudioparityError(f"{self.model}: missing tensor {missing[0]!r}{more}; "
                                   f"expected shape {list(expected[missing[0]])}")
        for name, shape in expected.items():
            if tuple(self.entries[name].shape) != shape:
                raise AudioparityError(f"{self.model}: tensor {name!r} has shape "
                                       f"{list(self.entries[name].shape)}, expected {list(shape)}")

    def close(self) -> None:
        """Remove the temporary copy of a ``.nemo``'s weights."""
        if self._scratch is not None:
            self._scratch.cleanup()
            self._scratch = None

    def __enter__(self) -> Checkpoint:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_state(model: Path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Every float tensor of a ``.nemo`` file or Hugging Face directory, NeMo-named, as float32,
    and each one's stored dtype (``f32|f16|bf16``); not checked (for tests and analysis)."""
    with Checkpoint(model) as checkpoint:
        return ({name: entry.read() for name, entry in checkpoint.entries.items()},
                checkpoint.native)


def check_weights(model: Path, config: ParakeetTDTConfig) -> None:
    """The checks of the ggml side's weights (:func:`~.layout.checkpoint_weights` and its
    ``blocks``), reading one tensor at a time and keeping none: every tensor of
    :func:`expected_shapes` present with its shape, and every float tensor finite. The
    reference dump runs them before NeMo loads the checkpoint, so both sides refuse a bad one
    with the same message.

    Raises:
        AudioparityError: an unreadable checkpoint, a missing tensor, a shape that differs from
            the config's (naming the key and both shapes), or a tensor holding NaN or infinity
            (naming it and the counts).
    """
    with Checkpoint(model) as checkpoint:
        checkpoint.check_shapes(expected_shapes(config))
        for name in checkpoint.entries:
            checkpoint.read(name)


def check_attention_memory(audio: Path, model: Path, encoder_config, n_frames: int,
                           emulates: bool = False) -> None:
    """Refuse a clip that would not fit the memory free, before NeMo is imported (a process
    killed for memory says nothing): the model as the reference holds it
    (:func:`~audioparity.dumping.memory.reference_bytes`: the stack, the float32 weights, their
    saved originals when it ``emulates`` a weight type, the checkpoint's tensors NeMo's restore
    leaves) and the encoder's activations over the clip's encoder frames
    (:meth:`~.config.EncoderConfig.attention_bytes`: attention in chunks of query rows, the rest
    linear in T' but for a few ``[T', T']`` bool masks).

    Raises:
        AudioparityError: that exceeds :func:`~audioparity.dumping.memory.host_free_bytes`.
    """
    refuse_if_over(reference_bytes(model, emulates) + encoder_config.attention_bytes(n_frames),
                   f"{audio}: T'={n_frames} encoder frames; the NeMo reference",
                   "the input is too long for this memory",
                   " (the model and the encoder's activations)")
