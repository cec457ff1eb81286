"""The transformers reference dump: every tensor equal to what transformers' own extractor and
encoder return here (``hidden_states``, ``last_hidden_state``), the manifest, one load for many
cases, and inputs refused before torch is imported, leaving nothing behind."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from audioparity.contract.errors import AudioparityError
from audioparity.dumping.artifacts import Dump
from audioparity.dumping.audio import load_audio
from audioparity.dumping.driver import dump_reference as drive_reference
from audioparity.models.whisper import Whisper

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def transformers_run(whisper_model: Path, clip_wav: Path) -> dict:
    """The extractor and ``WhisperModel``'s encoder run here without hooks, one thread, with
    ``output_hidden_states``."""
    extractor = transformers.WhisperFeatureExtractor.from_pretrained(whisper_model)
    model = transformers.WhisperModel.from_pretrained(whisper_model,
                                                      attn_implementation="eager").eval()
    samples = load_audio(clip_wav).samples
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        features = extractor(samples, sampling_rate=16000, return_tensors="pt").input_features
        with torch.inference_mode():
            out = model.encoder(features, output_hidden_states=True)
    finally:
        torch.set_num_threads(threads)
    return {"mel": features[0].T.numpy(), "hidden": [h[0].numpy() for h in out.hidden_states],
            "last": out.last_hidden_state[0].numpy(), "encoder": model.encoder}


def test_manifest_names_family_threads_layers_audio_and_versions(whisper_reference: Path):
    manifest = Dump(whisper_reference).manifest
    assert manifest["producer"] == "transformers" and manifest["status"] == "ok"
    assert manifest["family"] == "whisper"
    assert (manifest["threads"], manifest["cases_per_load"], manifest["n_layers"],
            manifest["n_decoder_layers"]) == (1, 1, 2, 2)
    assert manifest["audio"] == {"format": "WAV", "subtype": "PCM_16", "channels": 1,
                                 "sample_rate": 16000, "frames": 49459}
    assert {"torch", "transformers", "openai-whisper"} <= set(manifest["versions"])
    assert set(manifest["tensors"]) == {"mel_features", "conv_out", "layer_0", "layer_1",
                                        "enc_out", "decoder_layer_0", "decoder_layer_1",
                                        "decoder_logits", "decode_margins"}
    assert {manifest["tensors"][name]["layout"] for name in manifest["tensors"]} == {
        "[T, n_mels]", "[T, D]", "[S, D]", "[S, V]", "[positions]"}
    assert manifest["documents"] == {"decode": "decode.json"}
    assert (manifest["decoder_prompt"], manifest["language"], manifest["task"]) == (
        [57, 63], "", "transcribe")
    assert {"load", "mel_features", "conv_out", "decode", "decoder_layer_0"} <= set(
        manifest["seconds"])


def test_mel_is_the_extractors_output_time_major(whisper_reference: Path, transformers_run):
    mel = Dump(whisper_reference).tensor("mel_features")
    assert mel.shape == (3000, 80)
    np.testing.assert_array_equal(mel, transformers_run["mel"])


def test_tensors_are_the_encoders_hidden_states(whisper_reference: Path, transformers_run):
    """``hidden_states`` holds the layers' input, then each layer's output, the last one
    replaced by ``last_hidden_state`` (after ``layer_norm``)."""
    dump, run = Dump(whisper_reference), transformers_run
    hidden, encoder = run["hidden"], run["encoder"]
    assert len(hidden) == 3
    positions = encoder.embed_positions.weight.detach().numpy()
    conv_out = dump.tensor("conv_out")
    assert conv_out.shape == (1500, 64)
    np.testing.assert_array_equal(conv_out + positions, hidden[0])
    np.testing.assert_array_equal(dump.tensor("layer_0"), hidden[1])
    np.testing.assert_array_equal(dump.tensor("enc_out"), run["last"])
    np.testing.assert_array_equal(dump.tensor("enc_out"), hidden[2])
    with torch.inference_mode():
        normed = encoder.layer_norm(torch.from_numpy(dump.tensor("layer_1")))
    np.testing.assert_array_equal(normed.numpy(), dump.tensor("enc_out"))
    assert not np.allclose(dump.tensor("layer_1"), dump.tensor("enc_out"), atol=1e-2)


def test_conv_out_is_the_gelu_of_conv2_in_float64(whisper_reference: Path, transformers_run):
    """An independent float64 computation of the conv stack from the dump's own mel."""
    dump, encoder = Dump(whisper_reference), transformers_run["encoder"]
    x = torch.from_numpy(dump.tensor("mel_features").T.astype(np.float64))[None]
    with torch.no_grad():
        w1, b1 = encoder.conv1.weight.double(), encoder.conv1.bias.double()
        w2, b2 = encoder.conv2.weight.double(), encoder.conv2.bias.double()
        h = torch.nn.functional.gelu(torch.nn.functional.conv1d(x, w1, b1, padding=1))
        h = torch.nn.functional.gelu(torch.nn.functional.conv1d(h, w2, b2, stride=2, padding=1))
    expected = h[0].T.numpy()
    assert np.abs(dump.tensor("conv_out") - expected).max() < 1e-4 * np.abs(expected).max()


def dump_reference(model: Path, cases: list, **kwargs) -> None:
    """The driver's reference dump of the Whisper family."""
    drive_reference(Whisper(), model, cases, options={}, **kwargs)


def test_one_model_load_dumps_every_case_as_separate_jobs_would(
    whisper_model: Path, clip_wav: Path, whisper_reference: Path, tmp_path: Path
) -> None:
    """Several cases share one import and load (the workflow's one job per model): the clip's
    tensors after another case are byte-identical to its own job's; audio past 30 s is
    trimmed, with a note."""
    samples, rate = sf.read(clip_wav, dtype="int16")
    long = tmp_path / "long.wav"
    sf.write(long, np.tile(samples, 11), rate, subtype="PCM_16")  # 34 s
    dump_reference(whisper_model, [(long, tmp_path / "long"), (clip_wav, tmp_path / "clip")])
    alone, shared = Dump(whisper_reference), Dump(tmp_path / "clip")
    assert shared.manifest["cases_per_load"] == 2
    assert sorted(shared.manifest["tensors"]) == sorted(alone.manifest["tensors"])
    for name in alone.manifest["tensors"]:
        assert shared.tensor(name).tobytes() == alone.tensor(name).tobytes(), name
    trimmed = Dump(tmp_path / "long")
    assert any("trimmed to n_samples=480000" in note for note in trimmed.manifest["notes"])
    assert trimmed.tensor("mel_features").shape == (3000, 80)


def test_failed_dump_leaves_no_directory(whisper_model: Path, tmp_path: Path) -> None:
    output = tmp_path / "out" / "dump"
    with pytest.raises(AudioparityError, match="no such file"):
        dump_reference(whisper_model, [(tmp_path / "missing.wav", output)])
    not_audio = tmp_path / "not_audio.wav"
    not_audio.write_bytes(b"RIFF0000WAVEjunk")
    with pytest.raises(AudioparityError, match="cannot read audio"):
        dump_reference(whisper_model, [(not_audio, output)])
    with pytest.raises(AudioparityError, match="no audio file given"):
        dump_reference(whisper_model, [])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["not_audio.wav"]


def test_a_bad_checkpoint_is_refused_before_torch_is_imported(whisper_model: Path,
                                                              clip_wav: Path, tmp_path: Path):
    """The checks run first, in a process that has not imported torch, with the ggml side's
    message."""
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(whisper_model, broken)
    text = (broken / "config.json").read_text().replace('"gelu"', '"relu"')
    (broken / "config.json").write_text(text)
    code = (
        "import sys\n"
        "from audioparity.contract.errors import AudioparityError\n"
        "from audioparity.dumping.driver import dump_reference\n"
        "from audioparity.models.whisper import Whisper\n"
        "try:\n"
        f"    dump_reference(Whisper(), {str(broken)!r},\n"
        f"                   [({str(clip_wav)!r}, {str(tmp_path / 'd')!r})], options={{}})\n"
        "except AudioparityError as err:\n"
        "    print(err)\n"
        "print('torch' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True)
    message, imported = result.stdout.strip().splitlines()
    assert "activation_function='relu' is not supported" in message
    assert imported == "False"
    assert not (tmp_path / "d").exists()


# --- the decoder: the explicit greedy loop against generate, the teacher-forced stages ------------

def generated(model_dir: Path, audio: Path) -> tuple[list[int], np.ndarray]:
    """``model.generate`` greedy (``num_beams=1``, no sampling, no timestamps, the generation
    config's suppression) on ``audio``: the generated ids after the prompt, the ``<|endoftext|>``
    dropped, and the processed scores of each generated token's step."""
    extractor = transformers.WhisperFeatureExtractor.from_pretrained(model_dir)
    model = transformers.WhisperForConditionalGeneration.from_pretrained(
        model_dir, dtype=torch.float32, attn_implementation="eager").eval()
    features = extractor(load_audio(audio).samples, sampling_rate=16000,
                         return_tensors="pt").input_features
    with torch.inference_mode():
        out = model.generate(features, do_sample=False, num_beams=1, return_timestamps=False,
                             output_scores=True, return_dict_in_generate=True)
    ids = out.sequences[0].tolist()
    prompt = [model.generation_config.decoder_start_token_id,
              model.generation_config.no_timestamps_token_id]
    assert ids[:len(prompt)] == prompt
    ids = ids[len(prompt):]
    if ids and ids[-1] == model.generation_config.eos_token_id:
        ids = ids[:-1]
    scores = torch.stack(out.scores)[:, 0].numpy()  # [steps, V]
    return ids, scores[:len(ids)]


def margins_of(scores: np.ndarray) -> np.ndarray:
    """The top-1 minus runner-up of each row of ``scores`` (float64)."""
    top = np.sort(scores.astype(np.float64), axis=-1)
    return top[:, -1] - top[:, -2]


def test_the_greedy_loop_is_generates_greedy_decode(whisper_model: Path, clip_wav: Path,
                                                    whisper_reference: Path):
    """The dump's explicit KV-cached loop (prompt, suppression, stop at max_length here) gives
    ``generate``'s ids, its text is the tokenizer's, and its margins are the top-2 gaps of
    ``generate``'s processed scores (the suppression included)."""
    dump = Dump(whisper_reference)
    ids, scores = generated(whisper_model, clip_wav)
    decode = dump.json("decode")
    assert decode["ids"] == ids
    assert len(ids) == 32 - 2 and dump.manifest["decode_stopped"] == "max_length"
    tokenizer = transformers.AutoTokenizer.from_pretrained(whisper_model)
    assert decode["text"] == tokenizer.decode(ids, skip_special_tokens=True)
    np.testing.assert_allclose(dump.tensor("decode_margins"), margins_of(scores), rtol=1e-5,
                               atol=1e-6)


def test_teacher_forced_stages_are_the_models_forward(whisper_model: Path, clip_wav: Path,
                                                      whisper_reference: Path):
    """``decoder_layer_{i}`` and ``decoder_logits`` are what
    ``WhisperForConditionalGeneration`` computes on the prompt plus the decoded ids
    (``decoder_hidden_states``, ``logits``)."""
    dump = Dump(whisper_reference)
    extractor = transformers.WhisperFeatureExtractor.from_pretrained(whisper_model)
    model = transformers.WhisperForConditionalGeneration.from_pretrained(
        whisper_model, attn_implementation="eager").eval()
    features = extractor(load_audio(clip_wav).samples, sampling_rate=16000,
                         return_tensors="pt").input_features
    tokens = dump.manifest["decoder_prompt"] + dump.json("decode")["ids"]
    with torch.inference_mode():
        out = model(features, decoder_input_ids=torch.tensor([tokens]),
                    output_hidden_states=True)
    hidden = out.decoder_hidden_states  # the embeddings, layer 0's output, the final norm's
    np.testing.assert_allclose(dump.tensor("decoder_layer_0"), hidden[1][0].numpy(), rtol=0,
                               atol=1e-5)
    with torch.inference_mode():
        normed = model.model.decoder.layer_norm(torch.from_numpy(dump.tensor("decoder_layer_1")))
    np.testing.assert_allclose(normed.numpy(), hidden[2][0].numpy(), rtol=0, atol=1e-5)
    logits = dump.tensor("decoder_logits")
    assert logits.shape == (len(tokens), 64)
    np.testing.assert_allclose(logits, out.logits[0].numpy(), rtol=0, atol=1e-5)
