"""The Parakeet settings table against NeMo's own config schema, its page in docs/, the config
read as NeMo reads it, and each unsupported setting refused by name when the config is read."""

from __future__ import annotations

import copy
import dataclasses
import inspect
import re
from pathlib import Path

import pytest

from audioparity.contract.errors import AudioparityError
from audioparity.models.parakeet_tdt.config import from_nemo_config
from audioparity.models.parakeet_tdt.fixture import VOCAB_SIZE, fixture_config
from audioparity.models.parakeet_tdt.settings import LIMITED, SETTINGS, markdown

#: The fixture's (v3's) config as NeMo saves it (the sizes it fills in from the tokenizer and
#: the encoder), a plain dict (no NeMo needed).
BASE = fixture_config(Path("tokenizer"))
BASE["decoder"]["vocab_size"] = BASE["joint"]["num_classes"] = VOCAB_SIZE
BASE["joint"]["jointnet"].update(encoder_hidden=BASE["encoder"]["d_model"],
                                 pred_hidden=BASE["decoder"]["prednet"]["pred_hidden"])


def nemo_schema() -> dict[str, dict[str, object]]:
    """Section -> setting -> NeMo's default, from the NeMo modules and dataclasses a Parakeet
    config instantiates (``prednet`` and ``jointnet`` keys from the code that reads them)."""
    from nemo.collections.asr.modules import (
        ConformerEncoder,
        ConvASRDecoder,
        RNNTDecoder,
        RNNTJoint,
    )
    from nemo.collections.asr.modules.audio_preprocessing import (
        AudioToMelSpectrogramPreprocessorConfig,
    )
    from nemo.collections.asr.parts.submodules import rnnt_decoding, rnnt_greedy_decoding

    def signature(cls, *skip: str) -> dict[str, object]:
        return {name: p.default for name, p in inspect.signature(cls.__init__).parameters.items()
                if name not in ("self", *skip)}

    def dataclass_fields(*classes) -> dict[str, object]:
        return {f.name: f.default if f.default_factory is dataclasses.MISSING
                else f.default_factory() for cls in classes for f in dataclasses.fields(cls)}

    def read_keys(cls, mapping: str) -> dict[str, object]:
        keys = re.findall(rf"{mapping}(?:\.get\(|\[)[\"'](\w+)", inspect.getsource(cls))
        return dict.fromkeys(keys, inspect.Parameter.empty)

    greedy_source = inspect.getsource(rnnt_decoding.AbstractRNNTDecoding)
    aliases = dict.fromkeys(re.findall(r"cfg\.greedy\.get\('(\w+)'", greedy_source), 10)
    preprocessor = dataclass_fields(AudioToMelSpectrogramPreprocessorConfig)
    del preprocessor["_target_"]
    return {
        "preprocessor": preprocessor,
        "encoder": signature(ConformerEncoder),
        "decoder": signature(RNNTDecoder, "prednet"),
        "decoder.prednet": read_keys(RNNTDecoder, "prednet"),
        "joint": signature(RNNTJoint, "jointnet"),
        "joint.jointnet": read_keys(RNNTJoint, "jointnet"),
        "decoding": dataclass_fields(rnnt_decoding.RNNTDecodingConfig),
        "decoding.greedy": {**aliases, **dataclass_fields(
            rnnt_greedy_decoding.GreedyRNNTInferConfig,
            rnnt_greedy_decoding.GreedyBatchedRNNTInferConfig)},
        "ctc": signature(ConvASRDecoder),
    }


def test_the_table_lists_every_setting_of_nemos_schema_and_no_other():
    """A setting NeMo adds (or drops) shows up here: the table must say what the port does."""
    pytest.importorskip("nemo.collections.asr")
    schema = nemo_schema()
    assert set(schema) == set(SETTINGS)
    unlisted = {s: sorted(set(schema[s]) - set(SETTINGS[s])) for s in schema}
    stale = {s: sorted(set(SETTINGS[s]) - set(schema[s])) for s in schema}
    assert not any(unlisted.values()), f"NeMo settings the table does not list: {unlisted}"
    assert not any(stale.values()), f"listed settings NeMo does not take: {stale}"


def test_nemos_default_of_every_limited_setting_is_supported():
    """A model built with NeMo's defaults is never refused (-1, null and the named defaults)."""
    pytest.importorskip("nemo.collections.asr")
    schema = nemo_schema()
    refused = {f"{s}.{name}": schema[s][name] for s, table in SETTINGS.items()
               for name, setting in table.items()
               if setting.status == LIMITED and setting.supported is not None
               and schema[s][name] is not inspect.Parameter.empty
               and schema[s][name] not in setting.supported}
    assert not refused


def test_the_docs_page_is_the_table():
    page = Path(__file__).parents[3] / "docs" / "parakeet-settings.md"
    assert page.read_text() == markdown(), "regenerate: python -m " \
        "audioparity.models.parakeet_tdt.settings > docs/parakeet-settings.md"


def edited(*edits: tuple[str, object]) -> dict:
    """:data:`BASE` with ``(dotted path, value)`` edits applied."""
    cfg = copy.deepcopy(BASE)
    for path, value in edits:
        *parents, key = path.split(".")
        section = cfg
        for parent in parents:
            section = section.setdefault(parent, {})
        section[key] = value
    return cfg


#: An unsupported setting, its value, and the line that must name them.
REFUSALS = {
    "reduction pooling": (("encoder.reduction", "pooling"), ("encoder.reduction_factor", 2)),
    "reduction striding": (("encoder.reduction", "striding"), ("encoder.reduction_factor", 4)),
    "LSTM projection": (("decoder.prednet.rnn_hidden_size", 96),),
    "LayerNorm LSTM": (("decoder.normalization_mode", "layer"),),
    "blank not the padding row": (("decoder.blank_as_pad", False),),
    "vggnet subsampling": (("encoder.subsampling", "vggnet"),),
    "tied position biases": (("encoder.untie_biases", False),),
    "chunked_limited context": (("encoder.att_context_style", "chunked_limited"),),
    "causal conv context": (("encoder.conv_context_style", "dcc"),),
    "subsampling x3": (("encoder.subsampling_factor", 3),),
    "output projection": (("encoder.feat_out", 32),),
    "normalize all_features": (("preprocessor.normalize", "all_features"),),
    "window in samples": (("preprocessor.n_window_size", 400),),
    "frame splicing": (("preprocessor.frame_splicing", 3),),
    "gelu joint": (("joint.jointnet.activation", "gelu"),),
    "joint log_softmax": (("joint.log_softmax", True),),
    "n-gram LM": (("decoding.greedy.ngram_lm_model", "lm.nemo"),),
    "multi-blank": (("decoding.big_blank_durations", [2, 4]),),
    "decoding temperature": (("decoding.temperature", 0.5),),
}


@pytest.mark.parametrize("name", sorted(REFUSALS))
def test_an_unsupported_setting_is_refused_in_one_line_naming_it(name):
    edits = REFUSALS[name]
    path, value = edits[0]
    shown = {None: "null", False: "false", True: "true"}.get(value, value) \
        if not isinstance(value, list) else "[" + ", ".join(map(str, value)) + "]"
    with pytest.raises(AudioparityError) as caught:
        from_nemo_config(edited(*edits), where="model.nemo")
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"model.nemo: {path}: {shown} is not supported by the ggml port")


def test_a_ctc_heads_settings_are_refused_under_its_own_path():
    cfg = edited(("aux_ctc", {"decoder": {
        "_target_": "nemo.collections.asr.modules.ConvASRDecoder", "feat_in": 64,
        "num_classes": -1, "add_blank": False}}))
    with pytest.raises(AudioparityError, match=r"aux_ctc\.decoder\.add_blank: false is not"):
        from_nemo_config(cfg)


def test_an_unknown_guard_name_is_refused_by_name():
    with pytest.raises(AudioparityError,
                       match="preprocessor.log_zero_guard_value: 'huge' is neither a number"):
        from_nemo_config(edited(("preprocessor.log_zero_guard_value", "huge")))


def test_settings_nemo_defaults_or_nulls_are_read_as_nemo_reads_them():
    import numpy as np

    config = from_nemo_config(edited(
        ("encoder.subsampling_conv_channels", -1), ("preprocessor.preemph", None),
        ("preprocessor.log_zero_guard_value", "tiny"),
        ("decoding.greedy", {"max_symbols_per_step": 2})))
    assert config.encoder.subsampling_conv_channels == config.encoder.d_model
    assert config.preprocessor.preemph is None
    assert config.preprocessor.log_zero_guard_value == np.finfo(np.float32).tiny
    assert config.max_symbols == 2


def test_max_symbols_is_the_one_nemos_decoder_runs_with(parakeet_model):
    """NeMo's RNNTDecoding reads ``greedy.max_symbols``, then ``max_symbols_per_step`` (its
    dataclass default 10 merged in): the config gives the limit NeMo's greedy decoder holds."""
    pytest.importorskip("nemo.collections.asr")
    from nemo.collections.asr.models import ASRModel
    from omegaconf import OmegaConf, open_dict

    model = ASRModel.restore_from(str(parakeet_model), map_location="cpu").eval()
    for greedy in ({"max_symbols_per_step": 2}, {"max_symbols": 3, "max_symbols_per_step": 2},
                   {}):
        decoding = model.cfg.decoding.copy()
        with open_dict(decoding):
            decoding.greedy = greedy
        model.change_decoding_strategy(decoding, verbose=False)
        ours = from_nemo_config(OmegaConf.to_container(model.cfg, resolve=True))
        assert ours.max_symbols == model.decoding.decoding.max_symbols, greedy


@pytest.mark.parametrize("edit", [("preemph", None), ("log_zero_guard_value", "tiny"),
                                  ("log_zero_guard_value", "eps")], ids=str)
def test_the_mel_of_a_null_or_named_setting_is_nemos(edit, clip_wav):
    """``preemph: null`` (no pre-emphasis; dropped before, so 0.97 applied: NMSE 1.2e-2) and the
    guard names NeMo reads (a raw ValueError before), against NeMo's own preprocessor built
    with the same setting."""
    from nemo.collections.asr.modules import AudioToMelSpectrogramPreprocessor

    from audioparity.dumping.audio import load_audio
    from audioparity.models.parakeet_tdt.frontend import mel_features
    from tests.models.parakeet_tdt.test_frontend import agreement, nemo_mel

    cfg = edited((f"preprocessor.{edit[0]}", edit[1]))
    settings = {k: v for k, v in cfg["preprocessor"].items() if k != "_target_"}
    module = AudioToMelSpectrogramPreprocessor(**settings).eval()
    module.featurizer.dither = 0.0
    samples = load_audio(clip_wav).samples
    reference, _ = nemo_mel(module, samples)
    ours = mel_features(samples, from_nemo_config(cfg).preprocessor,
                        filterbank=module.featurizer.fb.numpy(),
                        window=module.featurizer.window.numpy())
    cosine, max_abs, nmse = agreement(ours, reference)
    assert nmse < 1e-9, (cosine, max_abs, nmse)
