"""transformers' Parakeet as the family's second reference (transformers_reference.py): every
stage against NeMo's own on the tiny fixtures (joint_hidden 48: transformers ties the joint's
size to the LSTM's) and the trained model, within bounds that float32 meets and that a planted
converter fault breaks; what it cannot express refused in one line; the command's dump."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from audioparity.contract.errors import AudioparityError
from audioparity.contract.family import Note, Phase
from audioparity.dumping.artifacts import Dump
from audioparity.models.parakeet_tdt.references import transformers as transformers_reference
from tests import RESOURCES
from tests.models.parakeet_tdt import PARAKEET

pytest.importorskip("nemo.collections.asr")
pytest.importorskip("transformers")

TRAINED = RESOURCES / "models" / "parakeet-tdt-espeak" / "model.nemo"
#: Fixture options of the variants both references run (config/examples/variants.yaml's; the
#: joint as wide as the LSTM, which transformers requires).
VARIANTS = {"v3": {}, "bias": {"use_bias": True}, "rnnt": {"head": "rnnt"},
            "ctc": {"head": "ctc"}, "tdt_ctc": {"head": "tdt_ctc"}}
#: The vocab1024 variant: its TDT decode of the clip reaches NeMo's 10-symbol limit.
VOCAB1024 = {"vocab_size": 1024, "blank_bias_nudge": 4.5}
#: NMSE bound of every tensor stage. Measured on these fixtures, the trained model and jfk.wav:
#: mel_features and pre_encode 0 (the same float32 ops), pos_emb <= 1e-12 (inverse frequencies
#: rounded apart), layers, enc_out and the logits <= 1e-12; a dropped bias or a transposed
#: projection gives 1e-4 and more.
NMSE_BOUND = 1e-9
#: Bound of the decodes' margins (logit units): float32 noise of the joint rows, ~1e-5.
MARGIN_BOUND = 1e-4


def outputs(family_outputs) -> tuple[dict, list[str]]:
    """``({stage: value}, notes)`` of what a family's dump yields."""
    stages, notes = {}, []
    for item in family_outputs:
        if isinstance(item, Note):
            notes.append(item.text)
        elif isinstance(item, tuple):
            stages[item[0]] = item[1]
        else:
            assert isinstance(item, Phase) or hasattr(item, "values"), item
    return stages, notes


def run(model: Path, audio: Path, implementation: str, loaded=None) -> tuple[dict, list[str]]:
    """The reference stages of ``implementation`` on ``audio``, as the dump computes them."""
    config = PARAKEET.config(model)
    options = {"implementation": implementation}
    loaded = loaded or PARAKEET.load_reference(model, config, options)
    return outputs(loaded.stages(PARAKEET.open_case(model, config, audio, options)))


def nmse(a: np.ndarray, b: np.ndarray) -> float:
    return float(((a.astype(np.float64) - b) ** 2).sum() / max((b.astype(np.float64) ** 2).sum(),
                                                               1e-300))


def disagreements(ours: dict, nemo: dict) -> dict[str, str]:
    """Each stage of NeMo's where transformers' is absent, shaped otherwise, beyond
    :data:`NMSE_BOUND` or (a document) different."""
    found = {}
    for name, expected in nemo.items():
        got = ours.get(name)
        if got is None:
            found[name] = "missing"
        elif isinstance(expected, dict):
            if got != expected:
                found[name] = f"{got} != {expected}"
        elif got.shape != expected.shape:
            found[name] = f"shape {got.shape} != {expected.shape}"
        elif name.endswith("_margins"):
            if expected.size and np.abs(got - expected).max() > MARGIN_BOUND:
                found[name] = f"max_abs {np.abs(got - expected).max():.3g}"
        elif nmse(got, expected) > NMSE_BOUND:
            found[name] = f"nmse {nmse(got, expected):.3g}"
    return found


@pytest.fixture(scope="module")
def variant_model(fixture_model):
    return lambda name: fixture_model("parakeet_tdt", joint_hidden=48, **VARIANTS[name])


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_every_stage_of_every_variant_agrees_with_nemo(variant_model, clip_wav, name):
    model = variant_model(name)
    ours, notes = run(model, clip_wav, "transformers")
    nemo, _ = run(model, clip_wav, "nemo")
    assert set(ours) == set(nemo)
    assert not disagreements(ours, nemo)
    assert any("ParakeetFeatureExtractor" in note for note in notes)


@pytest.mark.parametrize("audio", ["clip.wav", "heldout.wav"])
def test_the_trained_model_agrees_with_nemo(audio):
    ours, _ = run(TRAINED, RESOURCES / "speech" / audio, "transformers")
    nemo, _ = run(TRAINED, RESOURCES / "speech" / audio, "nemo")
    assert not disagreements(ours, nemo)
    assert ours["decode"]["text"] and ours["decode"] == nemo["decode"]
    # the even mel count of heldout.wav (372) leaves a padded frame inside the subsampling;
    # with the attention mask it is zeroed as NeMo zeroes it: the last frame is exact
    np.testing.assert_array_equal(ours["pre_encode"][-1], nemo["pre_encode"][-1])


def test_tdt_generate_has_no_symbol_limit_where_nemo_moves_on(fixture_model, clip_wav):
    """The one disagreement measured: transformers' TDT ``generate()`` keeps a frame while the
    joint predicts duration 0 (ParakeetTDTGenerationMixin has no max_symbols_per_step guard),
    where NeMo moves on after 10 tokens; everything up to that token agrees."""
    model = fixture_model("parakeet_tdt", joint_hidden=48, **VOCAB1024)
    ours, notes = run(model, clip_wav, "transformers")
    nemo, _ = run(model, clip_wav, "nemo")
    assert set(disagreements(ours, nemo)) == {"joint_logits", "decode", "decode_margins",
                                              "decode_logits"}
    frames = nemo["decode"]["frames"]
    limit = next(k for k in range(10, len(frames)) if frames[k - 10] == frames[k - 1])
    assert ours["decode"]["ids"][:limit] == nemo["decode"]["ids"][:limit]
    assert ours["decode"]["frames"][: limit + 1] == frames[:limit] + [frames[limit - 1]]
    assert frames[limit] > frames[limit - 1]
    assert any("no max_symbols limit" in note for note in notes)


def _faulty(fault):
    """:func:`transformers_reference.state_dicts` with ``fault`` applied to its tensors."""
    converter = transformers_reference.state_dicts

    def converted(state, config):
        dicts = converter(state, config)
        for tensors in dicts.values():
            fault(tensors)
        return dicts

    return converted


@pytest.mark.parametrize(("name", "fault", "first"), [
    ("bias", lambda t: t.update({"encoder.layers.1.feed_forward1.linear1.bias":
                                 np.zeros_like(t["encoder.layers.1.feed_forward1.linear1.bias"])}),
     "layer_1"),
    ("v3", lambda t: t.update({"encoder.layers.0.self_attn.q_proj.weight":
                               t["encoder.layers.0.self_attn.q_proj.weight"].T.copy()}),
     "layer_0"),
])
def test_a_planted_converter_fault_breaks_the_bound_where_it_is(variant_model, clip_wav,
                                                                 monkeypatch, name, fault, first):
    model = variant_model(name)
    nemo, _ = run(model, clip_wav, "nemo")
    monkeypatch.setattr(transformers_reference, "state_dicts", _faulty(fault))
    ours, _ = run(model, clip_wav, "transformers")
    failing = disagreements(ours, nemo)
    assert first in failing and float(failing[first].split()[-1]) > 1e-4
    layers = [f"layer_{i}" for i in range(3)]
    assert not any(stage in failing for stage in layers[: layers.index(first)])


def test_what_transformers_cannot_express_is_refused_in_one_line():
    config = PARAKEET.config(TRAINED)
    changes = {
        "joint.joint_hidden=56": dataclasses.replace(
            config, joint=dataclasses.replace(config.joint, joint_hidden=56)),
        "preprocessor.window='hamming'": dataclasses.replace(
            config, preprocessor=dataclasses.replace(config.preprocessor, window="hamming")),
        "encoder.self_attention_model='rel_pos_local_attn'": dataclasses.replace(
            config, encoder=dataclasses.replace(config.encoder,
                                                self_attention_model="rel_pos_local_attn")),
        r"decoding.durations=\[0, 1, 2, 4, 8\]": dataclasses.replace(config,
                                                                  durations=(0, 1, 2, 4, 8)),
    }
    transformers_reference.check_convertible(config, TRAINED)
    for message, changed in changes.items():
        with pytest.raises(AudioparityError, match=message):
            transformers_reference.check_convertible(changed, TRAINED)


def test_replay_needs_the_nemo_implementation():
    loaded = PARAKEET.load_reference(TRAINED, PARAKEET.config(TRAINED),
                                     {"implementation": "transformers"})
    with pytest.raises(AudioparityError, match="the transformers reference has no replay"):
        loaded.replay(None, None)


def test_a_hugging_face_directory_converts_to_what_from_pretrained_loads(tmp_path, clip_wav):
    """A random ``ParakeetForTDT`` saved by transformers, read back NeMo-named by the family
    and converted by ours, is the model ``from_pretrained`` loads: the same tensors, the same
    decode."""
    import torch
    import transformers
    from tokenizers import Tokenizer, models

    config = transformers.ParakeetTDTConfig(
        vocab_size=33, decoder_hidden_size=24, num_decoder_layers=1, durations=[0, 1, 2],
        blank_token_id=32, pad_token_id=32, encoder_config={
            "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
            "intermediate_size": 128, "conv_kernel_size": 9, "subsampling_conv_channels": 16,
            "num_mel_bins": 80, "scale_input": False, "layerdrop": 0.0})
    torch.manual_seed(3)
    transformers.ParakeetForTDT(config).save_pretrained(tmp_path)
    Tokenizer(models.WordLevel({f"w{i}": i for i in range(32)}, unk_token="w0")).save(
        str(tmp_path / "tokenizer.json"))
    theirs = transformers.ParakeetForTDT.from_pretrained(tmp_path).eval()
    loaded = PARAKEET.load_reference(tmp_path, PARAKEET.config(tmp_path),
                                     {"implementation": "transformers"})
    ours = loaded.transducer.state_dict()
    for name, tensor in theirs.state_dict().items():
        torch.testing.assert_close(ours[name], tensor, rtol=0, atol=0, msg=name)
    stages, _ = run(tmp_path, clip_wav, "transformers", loaded)
    features, mask = transformers_reference.features(loaded, PARAKEET.open_case(
        tmp_path, loaded.config, clip_wav, {}).data.samples)
    generated = theirs.generate(input_features=features, attention_mask=mask,
                                decoder_start_token_id=32)
    assert [i for i in generated.sequences[0, 1:].tolist() if i != 32] == stages["decode"]["ids"]


def test_the_command_dumps_every_stage_with_transformers(clip_wav, tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "audioparity.cli", "reference", "parakeet-tdt", "--implementation",
         "transformers", "--model", str(TRAINED), "--audio", str(clip_wav), "--output-dir",
         str(tmp_path / "clip")], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    dump = Dump(tmp_path / "clip")
    assert dump.manifest["producer"] == "transformers"
    nemo, _ = run(TRAINED, clip_wav, "nemo")
    ours = {name: dump.json(name) if isinstance(value, dict) else dump.tensor(name)
            for name, value in nemo.items()}
    assert not disagreements(ours, nemo)
