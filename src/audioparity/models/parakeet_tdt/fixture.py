"""A tiny, seeded Parakeet-TDT ``.nemo`` shaped like parakeet-tdt-0.6b-v3, for tests and the
default run.

The model is a plain NeMo ``EncDecRNNTBPEModel`` built from :func:`fixture_config` (generic NeMo
modules only: ``AudioToMelSpectrogramPreprocessor``, ``ConformerEncoder``, ``RNNTDecoder``,
``RNNTJoint``), with a SentencePiece BPE tokenizer trained here, offline, on :data:`CORPUS`.
Only the sizes differ from v3; every architectural switch (128 mels, ``dw_striding`` x8,
``rel_pos`` attention, no xscaling, ``use_bias: false``, batch-norm conv module, 2-layer LSTM
prediction net, TDT durations ``[0, 1, 2, 3, 4]``, 10 symbols per frame) is v3's. The sizes are
pairwise different (``D=64``, subsampling channels 24, LSTM 48, joint 56, vocabulary 96), so a
port that swaps two of them fails loudly. The options switch one thing at a time to what other
Parakeet checkpoints ship (``config/examples/variants.yaml``): xscaling, biases, the vocabulary,
local attention, and the decoders (:data:`HEADS`: RNNT, CTC as ``EncDecCTCModelBPE``, TDT and
CTC as ``EncDecHybridRNNTCTCBPEModel``).

NeMo's random init is degenerate for a parity target (the encoder output hardly varies in time
and greedy decoding repeats one token), so :func:`redraw_weights` replaces every parameter with
seeded draws at a larger gain, gives the norms random affine parameters and running statistics,
and nudges the blank and duration-0 biases of the joint output so that greedy decoding of speech
emits blanks, zero-duration tokens, and hits the 10-symbols-per-frame guard (and a CTC decoder's
blank bias, so that greedy CTC emits blanks and tokens).
"""

from __future__ import annotations

import logging
import math
import random
import shutil
import string
import time
from pathlib import Path

from audioparity.contract.errors import AudioparityError
from audioparity.dumping.artifacts import built_directory
from audioparity.models.parakeet_tdt.spec import SPEC

log = logging.getLogger("audioparity")

#: Text the SentencePiece tokenizer is trained on (written for this project).
CORPUS = (
    "The quick brown fox jumps over the lazy dog.",
    "A small model can still check that two programs compute the same numbers.",
    "Every layer of the encoder is compared against the reference, one frame at a time.",
    "She sells sea shells by the sea shore, and the shells she sells are surely sea shells.",
    "How much wood would a woodchuck chuck if a woodchuck could chuck wood?",
    "Please call Stella and ask her to bring these things with her from the store.",
    "Six spoons of fresh snow peas, five thick slabs of blue cheese, and maybe a snack.",
    "We also need a small plastic snake and a big toy frog for the kids.",
    "The rainbow is a division of white light into many beautiful colors.",
    "These take the shape of a long round arch, with its path high above.",
    "When the sunlight strikes raindrops in the air, they act as a prism and form a rainbow.",
    "Numbers, dates and names: seven, twelve, nineteen, Monday, October, Paris, Tokyo.",
    "Is it raining today? No, but the wind is cold and the sky is grey.",
    "Quiet voices carry further at night than during a busy afternoon.",
    "Jump, zip, vex, quiz, box, whiz, glyph, fjord, nymph, crypt, lynx.",
    "Ask not what your country can do for you, ask what you can do for your country.",
)

#: Tokenizer vocabulary size (without the blank, which NeMo appends as the last class).
VOCAB_SIZE = 96
#: TDT durations, as in v3.
DURATIONS = (0, 1, 2, 3, 4)

#: Gain of the re-drawn weights: std = GAIN / sqrt(fan_in).
GAIN = 2.0
#: Extra factor on the output projections of the conformer's residual branches (depth-scaled
#: init): at full gain the branches' per-channel offsets swamp the time-varying part of the
#: encoder output (std over time / overall std 0.32 at full gain, 0.50 at half, on the clip).
BRANCH_OUTPUT_SCALE = 0.5
#: Modules whose weights :data:`BRANCH_OUTPUT_SCALE` applies to, by their NeMo name.
BRANCH_OUTPUTS = ("linear2", "pointwise_conv2", "linear_out")
#: Added to the joint output bias of the blank class (index V) after the re-draw.
BLANK_BIAS_NUDGE = 10.5
#: Added to the joint output bias of duration 0 (index V + 1) after the re-draw.
DURATION0_BIAS_NUDGE = 2.5
#: Added to the CTC decoder's output bias of the blank class (index V) after the re-draw.
CTC_BLANK_BIAS_NUDGE = 4.0
#: The decoders a fixture can have (NeMo model class, decoders): ``tdt`` (v3's,
#: ``EncDecRNNTBPEModel``), ``rnnt`` (parakeet-rnnt: the same without durations), ``ctc``
#: (parakeet-ctc: ``EncDecCTCModelBPE``), ``tdt_ctc`` (parakeet-tdt_ctc:
#: ``EncDecHybridRNNTCTCBPEModel``, TDT and an auxiliary CTC decoder).
HEADS = {"tdt": "EncDecRNNTBPEModel", "rnnt": "EncDecRNNTBPEModel",
         "ctc": "EncDecCTCModelBPE", "tdt_ctc": "EncDecHybridRNNTCTCBPEModel"}


#: The fixture options that shape the model config (:func:`fixture_config`), with their
#: defaults: the family's fixture options (:data:`~.spec.SPEC`) but those only the build takes.
BUILD_OPTIONS = ("vocab_size", "blank_bias_nudge", "duration0_bias_nudge",
                 "ctc_blank_bias_nudge")
CONFIG_DEFAULTS = {option.name: option.default
                   for option in SPEC.options_for("fixture")
                   if option.name not in BUILD_OPTIONS}


def fixture_config(tokenizer_dir: Path, **options) -> dict:
    """The NeMo model config of the fixture (v3's structure at tiny sizes).

    Args:
        tokenizer_dir: directory holding ``tokenizer.model`` (SentencePiece BPE).
        options: any of :data:`CONFIG_DEFAULTS` (the family's fixture options, declared once in
            :data:`~.spec.SPEC`; ``--help`` and docs/ say what each sets), e.g. ``joint_hidden``,
            ``xscaling``, ``local_attention`` (0: full-context ``rel_pos``, else the window w of
            ``rel_pos_local_attn``), ``head`` (a key of :data:`HEADS`), and the shapes
            (``d_model``, ``n_heads``, ``n_layers``, ``conv_kernel_size``, ``subsampling*``,
            the frontend's ``sample_rate``, ``features``, ``window_*``, ``n_fft``, ``preemph``,
            the prediction net's ``pred_*``).

    Returns:
        A plain dict accepted by ``<HEADS[head]>(cfg=OmegaConf.create(...))``.

    Raises:
        AudioparityError: an unknown option, or shapes NeMo would refuse with a traceback
            (``d_model`` not a multiple of ``n_heads``, an even ``conv_kernel_size``,
            ``subsampling_conv_channels`` 0), one line naming the option.
    """
    o = _options(options)
    cfg = {
        "sample_rate": o["sample_rate"],
        "model_defaults": {
            "enc_hidden": o["d_model"],
            "pred_hidden": o["pred_hidden"],
            "joint_hidden": o["joint_hidden"],
            "tdt_durations": list(DURATIONS),
            "num_tdt_durations": len(DURATIONS),
        },
        "tokenizer": {"dir": str(tokenizer_dir), "type": "bpe"},
        "preprocessor": _preprocessor_section(o),
        "encoder": _encoder_section(o),
        **_transducer_sections(o),
        "optim": None,
    }
    _switch_head(cfg, o["head"], o["d_model"])
    return cfg


def _options(options: dict) -> dict:
    """:data:`CONFIG_DEFAULTS` updated with ``options``, checked as :func:`fixture_config`
    says."""
    unknown = sorted(set(options) - set(CONFIG_DEFAULTS))
    if unknown:
        raise AudioparityError(f"fixture parakeet-tdt: unknown option(s) {', '.join(unknown)}; "
                               f"expected some of {', '.join(CONFIG_DEFAULTS)}")
    o = {**CONFIG_DEFAULTS, **options}
    if o["d_model"] % o["n_heads"]:
        raise AudioparityError(f"fixture parakeet-tdt: d_model {o['d_model']} is not a multiple "
                               f"of n_heads {o['n_heads']}")
    if o["conv_kernel_size"] % 2 == 0:
        raise AudioparityError(f"fixture parakeet-tdt: conv_kernel_size {o['conv_kernel_size']} "
                               "is even; NeMo's conformer conv takes an odd kernel")
    if o["subsampling_conv_channels"] == 0:
        raise AudioparityError("fixture parakeet-tdt: subsampling_conv_channels 0; expected a "
                               "positive count or -1 (d_model)")
    return o


def _preprocessor_section(o: dict) -> dict:
    """``preprocessor``: v3's ``AudioToMelSpectrogramPreprocessor`` (128 mels by default)."""
    return {
        "_target_": "nemo.collections.asr.modules.AudioToMelSpectrogramPreprocessor",
        "sample_rate": o["sample_rate"],
        "normalize": "per_feature",
        "window_size": o["window_size"],
        "window_stride": o["window_stride"],
        "window": "hann",
        "features": o["features"],
        "n_fft": o["n_fft"] or None,
        "preemph": o["preemph"],
        "log": True,
        "frame_splicing": 1,
        "dither": 1.0e-05,
        "pad_to": 0,
        "pad_value": 0.0,
    }


def _encoder_section(o: dict) -> dict:
    """``encoder``: v3's ``ConformerEncoder`` with the shapes and switches of
    :func:`fixture_config`."""
    local_attention = o["local_attention"]
    return {
        "_target_": "nemo.collections.asr.modules.ConformerEncoder",
        "feat_in": o["features"],
        "feat_out": -1,
        "n_layers": o["n_layers"],
        "d_model": o["d_model"],
        "use_bias": o["use_bias"],
        "subsampling": o["subsampling"],
        "subsampling_factor": o["subsampling_factor"],
        "subsampling_conv_channels": o["subsampling_conv_channels"],
        "causal_downsampling": False,
        "ff_expansion_factor": 4,
        "self_attention_model": "rel_pos_local_attn" if local_attention else "rel_pos",
        "n_heads": o["n_heads"],
        "att_context_size": [local_attention] * 2 if local_attention else [-1, -1],
        "att_context_style": "regular",
        "xscaling": o["xscaling"],
        "untie_biases": True,
        "pos_emb_max_len": 5000,
        "conv_kernel_size": o["conv_kernel_size"],
        "conv_norm_type": "batch_norm",
        "conv_context_size": None,
        "dropout": 0.1,
        "dropout_pre_encoder": 0.1,
        "dropout_emb": 0.0,
        "dropout_att": 0.1,
    }


def _transducer_sections(o: dict) -> dict:
    """``decoder``, ``joint``, ``decoding`` and ``loss`` of v3's TDT transducer (LSTM
    prediction net of ``pred_rnn_layers``, 2 by default; durations :data:`DURATIONS`,
    ``max_symbols_per_step``, 10 by default as in v3)."""
    return {
        "decoder": {
            "_target_": "nemo.collections.asr.modules.RNNTDecoder",
            "normalization_mode": None,
            "random_state_sampling": False,
            "blank_as_pad": True,
            "prednet": {
                "pred_hidden": o["pred_hidden"],
                "pred_rnn_layers": o["pred_rnn_layers"],
                "t_max": None,
                "dropout": 0.2,
            },
        },
        "joint": {
            "_target_": "nemo.collections.asr.modules.RNNTJoint",
            "log_softmax": None,
            "preserve_memory": False,
            "fuse_loss_wer": False,
            "num_extra_outputs": len(DURATIONS),
            "jointnet": {"joint_hidden": o["joint_hidden"], "activation": "relu", "dropout": 0.2},
        },
        "decoding": {
            "strategy": "greedy_batch",
            "model_type": "tdt",
            "durations": list(DURATIONS),
            "greedy": {"max_symbols": o["max_symbols_per_step"]},
        },
        "loss": {
            "loss_name": "tdt",
            "tdt_kwargs": {
                "fastemit_lambda": 0.0,
                "clamp": -1.0,
                "durations": list(DURATIONS),
                "sigma": 0.02,
                "omega": 0.0,
            },
        },
    }


def _switch_head(cfg: dict, head: str, d_model: int) -> None:
    """Turn the TDT config ``cfg`` into the decoders ``head`` (a key of :data:`HEADS`), in
    place."""
    ctc = {"_target_": "nemo.collections.asr.modules.ConvASRDecoder", "feat_in": d_model,
           "num_classes": -1, "vocabulary": []}
    if head == "rnnt":  # parakeet-rnnt: no duration outputs, plain RNNT loss
        for key in ("tdt_durations", "num_tdt_durations"):
            del cfg["model_defaults"][key]
        cfg["joint"]["num_extra_outputs"] = 0
        cfg["decoding"] = {"strategy": "greedy_batch", "model_type": "rnnt",
                           "greedy": cfg["decoding"]["greedy"]}
        cfg["loss"] = {"loss_name": "default"}
    elif head == "ctc":  # parakeet-ctc: a 1x1 conv to V+1 classes, log-softmax
        for key in ("pred_hidden", "joint_hidden", "tdt_durations", "num_tdt_durations"):
            del cfg["model_defaults"][key]
        for key in ("joint", "loss"):
            del cfg[key]
        cfg["decoder"] = ctc
        cfg["decoding"] = {"strategy": "greedy_batch"}
    elif head == "tdt_ctc":  # parakeet-tdt_ctc: TDT and an auxiliary CTC decoder
        cfg["aux_ctc"] = {"ctc_loss_weight": 0.3, "use_cer": False,
                          "ctc_reduction": "mean_batch", "decoder": ctc,
                          "decoding": {"strategy": "greedy_batch"}}


def corpus(vocab_size: int, sentences: tuple[str, ...] = CORPUS) -> tuple[str, ...]:
    """The tokenizer's training text: ``sentences`` (:data:`CORPUS`), and for a vocabulary
    larger than :data:`VOCAB_SIZE` (which CORPUS has too few merges for) twice as many sentences
    as pieces of random lower-case words, drawn from a fixed seed (the same text every time)."""
    if vocab_size <= VOCAB_SIZE:
        return sentences
    rng = random.Random(0)
    words = (" ".join("".join(rng.choice(string.ascii_lowercase)
                              for _ in range(rng.randint(2, 9))) for _ in range(12))
             for _ in range(2 * vocab_size))
    return (*sentences, *words)


def min_vocab_size(sentences: tuple[str, ...] = CORPUS) -> int:
    """The fewest pieces SentencePiece BPE trains on ``sentences``: one per distinct character
    (``character_coverage=1.0`` keeps them all), the word marker and ``<unk>`` (45 for
    :data:`CORPUS`, the ``vocab_size`` option's minimum)."""
    return len(set("".join(sentences)) - {" "}) + 2


def check_vocab_size(vocab_size: int, sentences: tuple[str, ...] = CORPUS) -> None:
    """Refuse a ``vocab_size`` SentencePiece cannot train on ``sentences``.

    Raises:
        AudioparityError: fewer than :func:`min_vocab_size` pieces.
    """
    least = min_vocab_size(sentences)
    if vocab_size < least:
        raise AudioparityError(f"fixture parakeet-tdt: vocab_size {vocab_size} is below {least}, "
                               "the fixture text's characters, the word marker and <unk>")


def train_tokenizer(output_dir: Path, vocab_size: int = VOCAB_SIZE,
                    sentences: tuple[str, ...] = CORPUS) -> Path:
    """Train a SentencePiece BPE model of ``vocab_size`` pieces on :func:`corpus` of
    ``sentences`` (one thread: deterministic).

    Returns:
        The directory, now holding ``tokenizer.model``, ``tokenizer.vocab`` and ``vocab.txt``.

    Raises:
        AudioparityError: ``vocab_size`` below :func:`min_vocab_size`.
    """
    import sentencepiece as spm

    check_vocab_size(vocab_size, tuple(sentences))
    output_dir.mkdir(parents=True, exist_ok=True)
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus(vocab_size, tuple(sentences))),
        model_prefix=str(output_dir / "tokenizer"),
        vocab_size=vocab_size,
        model_type="bpe",
        character_coverage=1.0,
        num_threads=1,
        bos_id=-1,
        eos_id=-1,
        unk_id=0,
        minloglevel=2,
    )
    portable_tokenizer(output_dir / "tokenizer.model")
    # NeMo's ``create_spt_model`` convention, and a file ``EncDecRNNTBPEModel`` registers.
    lines = (output_dir / "tokenizer.vocab").read_text().splitlines()
    pieces = [line.split("\t")[0] for line in lines]
    vocab = [p[1:] or p if p.startswith("\u2581") else f"##{p}" for p in pieces if p != "<unk>"]
    (output_dir / "vocab.txt").write_text("".join(f"{token}\n" for token in vocab))
    return output_dir


def portable_tokenizer(model_file: Path) -> None:
    """Rewrite a SentencePiece ``model_file`` with its ``trainer_spec.model_prefix`` reduced to
    the file's stem: the proto keeps the trainer's settings, and that one names the folder it
    was trained in, a path of this machine that a committed model must not carry. The pieces,
    scores and normalizer (what tokenizes) are untouched."""
    from sentencepiece import sentencepiece_model_pb2

    proto = sentencepiece_model_pb2.ModelProto.FromString(model_file.read_bytes())
    proto.trainer_spec.model_prefix = model_file.stem
    model_file.write_bytes(proto.SerializeToString())


def redraw_weights(model, seed: int, blank_bias_nudge: float = BLANK_BIAS_NUDGE,
                   duration0_bias_nudge: float = DURATION0_BIAS_NUDGE,
                   ctc_blank_bias_nudge: float = CTC_BLANK_BIAS_NUDGE) -> None:
    """Re-draw every parameter of ``model`` in place from a ``torch.Generator`` seeded ``seed``.

    Parameters are visited in ``named_parameters()`` order (fixed by the config):

    - matrices and conv kernels (``ndim >= 2``, LSTM ``weight_*`` included): normal,
      std ``GAIN / sqrt(fan_in)`` with fan_in = numel / shape[0], times
      :data:`BRANCH_OUTPUT_SCALE` for the encoder's residual-branch outputs
      (``feed_forward{1,2}.linear2``, ``conv.pointwise_conv2``, ``self_attn.linear_out``);
      ``pos_bias_u/v`` (``[heads, d_k]``) count as matrices here;
    - the prediction-net embedding: standard normal, blank (padding) row kept at zero, as NeMo's
      ``padding_idx`` keeps it;
    - norm weights (LayerNorm, BatchNorm): ``1 + 0.2 N(0, 1)``; other vectors (biases, LSTM
      biases included): ``0.2 N(0, 1)``.

    BatchNorm running statistics get ``running_mean ~ 0.2 N(0, 1)``, ``running_var ~ U(0.5, 1.5)``.
    Finally ``blank_bias_nudge`` and ``duration0_bias_nudge`` are added to the joint output bias
    at indices V (blank) and V + 1 (duration 0, when the joint has durations), and
    ``ctc_blank_bias_nudge`` to a CTC decoder's output bias at V (its blank). Preprocessor
    buffers (mel filterbank, window) are left as NeMo computed them.
    """
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        _redraw_parameters(model, generator)
        for module in model.modules():
            if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
                shape = module.running_mean.shape
                module.running_mean.copy_(0.2 * torch.randn(shape, generator=generator))
                module.running_var.copy_(0.5 + torch.rand(shape, generator=generator))
        _nudge_biases(model, blank_bias_nudge, duration0_bias_nudge, ctc_blank_bias_nudge)


def _redraw_parameters(model, generator) -> None:
    """Every parameter of ``model`` drawn from ``generator`` in ``named_parameters()`` order,
    as :func:`redraw_weights` says (under ``torch.no_grad``)."""
    import torch

    norm_weights = {
        f"{name}.weight"
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.LayerNorm | torch.nn.modules.batchnorm._BatchNorm)
    }
    joint = getattr(model, "joint", None)
    embedding = model.decoder.prediction["embed"] if joint is not None else None
    for name, param in model.named_parameters():
        draw = torch.randn(param.shape, generator=generator, dtype=param.dtype)
        if param.ndim >= 2 and (embedding is None or param is not embedding.weight):
            draw *= GAIN / math.sqrt(param.numel() / param.shape[0])
            module = name.rsplit(".", 2)[-2]
            if name.startswith("encoder.layers.") and module in BRANCH_OUTPUTS:
                draw *= BRANCH_OUTPUT_SCALE
        elif name in norm_weights:
            draw = 1.0 + 0.2 * draw
        elif param.ndim == 1:
            draw *= 0.2
        param.copy_(draw)


def _nudge_biases(model, blank_bias_nudge: float, duration0_bias_nudge: float,
                  ctc_blank_bias_nudge: float) -> None:
    """The prediction-net embedding's blank row zeroed and the nudges of
    :func:`redraw_weights` added to the joint's and the CTC decoder's output biases (under
    ``torch.no_grad``)."""
    joint = getattr(model, "joint", None)
    if joint is not None:
        embedding = model.decoder.prediction["embed"]
        embedding.weight[embedding.padding_idx].zero_()
        output_bias = joint.joint_net[-1].bias
        vocab = joint.num_classes_with_blank - 1 - joint.num_extra_outputs
        output_bias[vocab] += blank_bias_nudge
        if joint.num_extra_outputs:
            output_bias[vocab + 1] += duration0_bias_nudge
    ctc = model.ctc_decoder if hasattr(model, "ctc_decoder") else (
        None if joint is not None else model.decoder)
    if ctc is not None:
        ctc.decoder_layers[0].bias[ctc.num_classes_with_blank - 1] += ctc_blank_bias_nudge


#: ``tokenizer.dir`` as a saved model's config holds it: the tokenizer travels in the ``.nemo``
#: as artifacts (``model_path``, ``vocab_path``: ``nemo:`` names), which NeMo restores from, so
#: the folder it was built in (a temporary one of this machine) is no path to keep.
SAVED_TOKENIZER_DIR = "tokenizer"


def save_model(model, path: Path) -> None:
    """``model.save_to(path)`` with ``tokenizer.dir`` set to :data:`SAVED_TOKENIZER_DIR`, so the
    ``.nemo`` names no folder of the machine that built it (NeMo's ``ModelPT.save_to``)."""
    from omegaconf import open_dict

    with open_dict(model.cfg):
        model.cfg.tokenizer.dir = SAVED_TOKENIZER_DIR
    model.save_to(str(path))


def build_fixture(output: Path, seed: int = 0, vocab_size: int = VOCAB_SIZE,
                  blank_bias_nudge: float = BLANK_BIAS_NUDGE,
                  duration0_bias_nudge: float = DURATION0_BIAS_NUDGE,
                  ctc_blank_bias_nudge: float = CTC_BLANK_BIAS_NUDGE, **options) -> None:
    """Build the tiny Parakeet-TDT model into the fixture directory ``output``, as
    ``output/model.nemo`` (the family spec's ``fixture_model``).

    The options make variants that a port's loader accepts (``config/examples/ports.yaml``,
    ``config/examples/variants.yaml``): the tokenizer's ``vocab_size`` (at least
    :func:`min_vocab_size`), the nudges of the blank and duration-0 biases
    (:func:`redraw_weights`) that keep its greedy decode exercising blanks, zero-duration tokens
    and the symbols-per-frame limit at those sizes, the nudge of a CTC decoder's blank bias; and
    ``options``, the model config's (:func:`fixture_config`): sizes, frontend settings, the
    switches v3 turns off and NeMo's defaults keep, the decoders.

    Offline and deterministic: the same seed gives the same ``state_dict``. Written atomically
    (:func:`~audioparity.dumping.artifacts.built_directory`): ``output`` is either absent or
    complete.

    Raises:
        AudioparityError: the parent directory cannot be written; an option
            :func:`fixture_config` or :func:`train_tokenizer` refuses (one line, before NeMo is
            imported).
    """
    config = fixture_config(Path(SAVED_TOKENIZER_DIR), **options)
    check_vocab_size(vocab_size)
    output = Path(output)
    with built_directory(output) as work:
        start = time.perf_counter()
        import nemo.collections.asr.models as nemo_models
        import torch
        from omegaconf import OmegaConf

        imported = time.perf_counter()
        log.info("fixture parakeet-tdt: NeMo imported in %.1f s; building seed %d -> %s",
                 imported - start, seed, output)
        tokenizer_dir = train_tokenizer(work / "tokenizer", vocab_size)
        torch.manual_seed(seed)
        config["tokenizer"]["dir"] = str(tokenizer_dir)
        head = HEADS[options.get("head", CONFIG_DEFAULTS["head"])]
        model = getattr(nemo_models, head)(cfg=OmegaConf.create(config))
        redraw_weights(model, seed, blank_bias_nudge, duration0_bias_nudge, ctc_blank_bias_nudge)
        model.eval()
        save_model(model, work / SPEC.fixture_model)
        shutil.rmtree(tokenizer_dir)
    log.info("fixture parakeet-tdt: wrote %s in %.2f s (after the import)", output,
             time.perf_counter() - imported)
