"""Property tests over everything that reads outside data: the audio reader, the dump reader
(manifest, ``.npy``, documents), the MOSS prompt reader, and the metrics. Whatever the input, the
only exception allowed is :class:`AudioparityError` (a documented, one-line error); what is
returned must be what the readers promise.

Examples per property come from the Hypothesis profile: ``HYPOTHESIS_PROFILE=ci`` runs 2000 each
(tests/conftest.py), the default a few dozen.
"""

from __future__ import annotations

import io
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from audioparity.compare import metrics as m
from audioparity.compare import sequences as seq
from audioparity.compare.cell import compare_cell
from audioparity.compare.documents import document_metrics
from audioparity.compare.stage import tensor_metrics
from audioparity.contract.errors import AudioparityError
from audioparity.dumping.artifacts import Dump, DumpWriter
from audioparity.dumping.audio import Audio, load_audio
from audioparity.models.moss_voicegen import text_processor

#: A warning fails too: the readers and metrics promise clean errors, no overflow warnings.
pytestmark = pytest.mark.filterwarnings("error")
#: Properties that write files each example.
FILE_SETTINGS = settings(suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One folder per module (function-scoped tmp_path does not mix with @given); examples
    overwrite the same files."""
    return tmp_path_factory.mktemp("fuzz")


#: What :func:`allowed` returns for a clean refusal.
REFUSED = object()


def allowed(call, *args, **kwargs):
    """``call(*args, **kwargs)``, or :data:`REFUSED` when it raises :class:`AudioparityError`
    with a one-line message (any other exception fails the test)."""
    try:
        return call(*args, **kwargs)
    except AudioparityError as err:
        assert str(err) and "\n" not in str(err), repr(err)
        return REFUSED


# --- the audio reader --------------------------------------------------------------------------

#: (format, subtype) pairs libsndfile writes; the reader must take each or refuse it cleanly.
WRITABLE = [(f, s) for f in ("WAV", "FLAC", "AIFF", "AU", "OGG")
            for s in sf.available_subtypes(f) if sf.check_format(f, s)]
RATES = st.sampled_from([1000, 8000, 11025, 16000, 22050, 44100, 48000, 96000])


def check_audio(audio: Audio | object, sample_rate: int = 16000) -> None:
    """What :func:`load_audio` promises of what it returns."""
    if audio is REFUSED:
        return
    assert audio.sample_rate == sample_rate
    assert audio.samples.dtype == np.float32 and audio.samples.ndim == 1
    assert audio.samples.size >= 1 and np.isfinite(audio.samples).all()
    assert audio.notes and audio.notes[0].startswith("read ")


@FILE_SETTINGS
@given(data=st.binary(max_size=4096))
def test_random_bytes_are_audio_or_a_clean_error(scratch, data):
    path = scratch / "random.wav"
    path.write_bytes(data)
    check_audio(allowed(load_audio, path))


@st.composite
def sound_files(draw) -> bytes:
    """A file soundfile writes: random format/subtype, channels, rate and samples (NaN and
    beyond-range values included for float subtypes)."""
    fmt, subtype = draw(st.sampled_from(WRITABLE))
    channels = draw(st.integers(1, 3))
    frames = draw(st.integers(0, 600))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    samples = rng.uniform(-1.5, 1.5, size=(frames, channels))
    if frames and draw(st.booleans()):
        samples[draw(st.integers(0, frames - 1)), 0] = draw(st.sampled_from([np.nan, np.inf]))
    buffer = io.BytesIO()
    try:
        sf.write(buffer, samples, draw(RATES), subtype=subtype, format=fmt)
    except (sf.LibsndfileError, RuntimeError, ValueError, TypeError, AssertionError):
        assume(False)  # what libsndfile refuses (or fails) to write is not an input
    return buffer.getvalue()


@FILE_SETTINGS
@given(data=sound_files(), cut=st.floats(0, 1), flips=st.lists(
    st.tuples(st.floats(0, 1), st.integers(0, 255)), max_size=3))
def test_written_truncated_and_damaged_files_are_audio_or_a_clean_error(scratch, data, cut,
                                                                         flips):
    """Valid files as written, cut at a random point, and with random bytes overwritten (the
    header lies in the first bytes, so a flip there damages the header)."""
    path = scratch / "written"
    path.write_bytes(data)
    check_audio(allowed(load_audio, path))
    damaged = bytearray(data[: max(0, min(len(data), round(cut * len(data))))])
    for where, value in flips:
        if damaged:
            damaged[min(len(damaged) - 1, int(where * min(len(damaged), 64)))] = value
    path.write_bytes(bytes(damaged))
    check_audio(allowed(load_audio, path, min_samples=160, purpose="one encoder frame"))


# --- the dump reader ---------------------------------------------------------------------------

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-2**40, 2**40) | st.floats(allow_nan=False)
    | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=12,
)
GATES = {"gates": [{"stage": "*", "from": "default", "cosine_min": 0.99}],
         "expected_failures": []}
LABELS = {"family": "parakeet_tdt", "model": "tiny", "case": "fuzz", "backend": "cpu",
          "weight_type": "f32"}


@pytest.fixture(scope="module")
def good_dump(scratch) -> Path:
    """A valid dump: two tensors, a document and its margins."""
    path = scratch / "good"
    with DumpWriter(path, producer="test", fields={"threads": 1}) as writer:
        writer.add_tensor("enc_out", np.arange(12, dtype=np.float32).reshape(4, 3), "[T, D]")
        writer.add_tensor("joint_logits", np.linspace(-3, 3, 10).reshape(2, 5), "[steps, V]")
        writer.add_json("decode", {"ids": [1, 2, 3], "text": "a b"})
        writer.add_tensor("decode_margins", np.ones(3, np.float32), "[positions]")
    return path


def read_everything(path: Path) -> None:
    """Every read a later stage makes of a dump; each either works or is a clean error."""
    dump = allowed(Dump, path)
    if dump is REFUSED:
        return
    assert isinstance(dump.status, str)
    for name in dump.tensor_names:
        assert isinstance(dump.layout(name), str)
        array = allowed(dump.tensor, name)
        if array is not REFUSED:
            assert list(array.shape) == dump.manifest["tensors"][name]["shape"]
    for name in dump.manifest.get("documents", {}):
        allowed(dump.json, name)


def fresh_copy(good_dump: Path, scratch: Path) -> Path:
    target = scratch / "damaged"
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(good_dump, target)
    return target


@FILE_SETTINGS
@given(manifest=JSON_VALUES | st.fixed_dictionaries(
    {"tensors": st.dictionaries(st.sampled_from(["enc_out", "joint_logits", "x"]), JSON_VALUES,
                                max_size=3)},
    optional={"documents": JSON_VALUES, "status": JSON_VALUES, "seconds": JSON_VALUES,
              "message": JSON_VALUES}))
def test_any_manifest_reads_or_is_a_clean_error(good_dump, scratch, manifest):
    path = fresh_copy(good_dump, scratch)
    (path / "manifest.json").write_text(json.dumps(manifest))
    read_everything(path)
    allowed(compare_cell, good_dump, path, GATES, LABELS, scratch / "cell.json")


@FILE_SETTINGS
@given(field=st.sampled_from(["file", "shape", "dtype", "layout"]), value=JSON_VALUES)
def test_any_tensor_entry_reads_or_is_a_clean_error(good_dump, scratch, field, value):
    path = fresh_copy(good_dump, scratch)
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["tensors"]["enc_out"][field] = value
    (path / "manifest.json").write_text(json.dumps(manifest))
    read_everything(path)
    allowed(compare_cell, good_dump, path, GATES, LABELS, scratch / "cell.json")


@FILE_SETTINGS
@given(target=st.sampled_from(["enc_out.npy", "joint_logits.npy", "decode.json",
                               "manifest.json"]),
       cut=st.floats(0, 1), flips=st.lists(st.tuples(st.floats(0, 1), st.integers(0, 255)),
                                           max_size=4),
       tail=st.binary(max_size=16))
def test_damaged_dump_files_read_or_are_a_clean_error(good_dump, scratch, target, cut, flips,
                                                      tail):
    """A file of a dump cut short, bytes overwritten (headers included) and junk appended."""
    path = fresh_copy(good_dump, scratch)
    data = bytearray((path / target).read_bytes())
    data = data[: round(cut * len(data))] if cut < 0.9 else data
    for where, value in flips:
        if data:
            data[int(where * (len(data) - 1))] = value
    (path / target).write_bytes(bytes(data) + tail)
    read_everything(path)
    allowed(compare_cell, good_dump, path, GATES, LABELS, scratch / "cell.json")


@FILE_SETTINGS
@given(array=hnp.arrays(hnp.scalar_dtypes(), hnp.array_shapes(min_dims=0, max_dims=3,
                                                              min_side=0, max_side=4)))
def test_any_npy_content_reads_or_is_a_clean_error(good_dump, scratch, array):
    """A valid ``.npy`` of any dtype and shape in place of a tensor the manifest describes."""
    path = fresh_copy(good_dump, scratch)
    np.save(path / "enc_out.npy", array)
    read_everything(path)
    allowed(compare_cell, good_dump, path, GATES, LABELS, scratch / "cell.json")


# --- the prompt reader -------------------------------------------------------------------------


def check_prompt(prompt: text_processor.Prompt | object) -> None:
    if prompt is REFUSED:
        return
    assert isinstance(prompt.text, str) and prompt.text.strip()
    assert prompt.instruction is None or isinstance(prompt.instruction, str)
    assert prompt.language is None or isinstance(prompt.language, str)
    rendered = text_processor.render(prompt)
    rendered.encode("utf-8")  # what the tokenizer is given is valid Unicode
    assert prompt.text in rendered


@FILE_SETTINGS
@given(data=st.binary(max_size=512))
def test_random_bytes_are_a_prompt_or_a_clean_error(scratch, data):
    path = scratch / "prompt.json"
    path.write_bytes(data)
    check_prompt(allowed(text_processor.load_prompt, path))


TEXTS = st.text(max_size=40) | st.sampled_from(["", " ", "\ud800", "Hello.", "你好"])


@FILE_SETTINGS
@given(value=JSON_VALUES | st.dictionaries(
    st.sampled_from([*text_processor.PROMPT_KEYS, "voice"]), JSON_VALUES | TEXTS, max_size=4))
def test_any_json_is_a_prompt_or_a_clean_error(scratch, value):
    path = scratch / "prompt.json"
    path.write_text(json.dumps(value), encoding="utf-8")  # ensure_ascii: lone surrogates too
    check_prompt(allowed(text_processor.load_prompt, path))


# --- the metrics -------------------------------------------------------------------------------

TENSOR_METRICS = (m.cosine, m.std_ratio, m.nmse, m.max_abs, m.mean_abs, m.max_rel, m.non_finite,
                  m.argmax, m.top1, m.kl)
SPECIAL = st.sampled_from([0.0, -0.0, np.nan, np.inf, -np.inf, 1e308, -1e308, 5e-324, 1e-300,
                           65504.0, 3.4e38])
SHAPES = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5)


@st.composite
def metric_pairs(draw) -> tuple[np.ndarray, np.ndarray]:
    """Candidate and reference: random dtypes, NaN, infinities, huge and subnormal values,
    empty arrays; usually one shape, sometimes two."""
    shape = draw(SHAPES)
    other = draw(SHAPES) if draw(st.integers(0, 9)) == 0 else shape

    def one(shape_):
        dtype = draw(st.sampled_from([np.float64, np.float32, np.float16]))
        elements = st.floats(width=np.finfo(dtype).bits) | SPECIAL
        values = draw(hnp.arrays(np.float64, shape_, elements=elements))
        with np.errstate(over="ignore"):
            return values.astype(dtype)

    return one(shape), one(other)


@settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(pair=metric_pairs())
def test_metrics_return_numbers_or_a_clean_shape_error(pair):
    cand, ref = pair
    for metric in TENSOR_METRICS:
        value = allowed(metric, cand, ref)
        if value is REFUSED:
            assert cand.shape != ref.shape, metric.__name__
            continue
        if metric is m.non_finite:
            assert isinstance(value, int) and 0 <= value <= cand.size
        elif metric is m.argmax:
            assert value is None or len(value.split(",")) == cand.ndim
        else:
            assert isinstance(value, float), metric.__name__
            if metric is m.cosine:
                assert math.isnan(value) or -1.0 <= value <= 1.0
            elif not math.isnan(value):
                assert value >= 0.0, (metric.__name__, value)
    if cand.shape == ref.shape:
        row = tensor_metrics("logits", cand, ref)
        assert row["non_finite"] == m.non_finite(cand, ref)


TOKENS = st.lists(st.integers(0, 5) | st.tuples(st.integers(0, 3), st.integers(0, 3)),
                  max_size=8)


@given(cand=TOKENS, ref=TOKENS, cand_text=st.text(max_size=30), ref_text=st.text(max_size=30),
       margins=hnp.arrays(np.float64, st.integers(0, 9), elements=st.floats() | SPECIAL))
def test_token_metrics_return_numbers_or_a_clean_error(cand, ref, cand_text, ref_text, margins):
    match = seq.token_match(cand, ref)
    assert 0.0 <= match <= 1.0
    divergence = seq.first_divergence(cand, ref)
    assert divergence is None or 0 <= divergence <= min(len(cand), len(ref))
    assert seq.wer(cand_text, ref_text) >= 0.0
    allowed(seq.logit_gap, cand, ref, margins)
    documents = ({"ids": cand, "text": cand_text}, {"ids": ref, "text": ref_text})
    allowed(document_metrics, *documents, ref_margins=margins, cand_margins=margins)
