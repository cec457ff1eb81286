"""Parakeet (NeMo ``EncDecRNNTBPEModel`` TDT and RNNT, ``EncDecCTCModelBPE``,
``EncDecHybridRNNTCTCBPEModel``): tiny fixture, NeMo reference dump and ggml port."""

from audioparity.families import FamilySpec, Option, Stage
from audioparity.vocabulary import FLOAT_STORAGE_TYPES

SPEC = FamilySpec(
    name="parakeet_tdt",
    command="parakeet-tdt",
    title="Parakeet-TDT speech recogniser (NeMo EncDecRNNTBPEModel) against NeMo",
    input="audio",
    model="a .nemo file or a Hugging Face Parakeet directory (config.json + model.safetensors)",
    stages=(
        Stage("mel_features", "tensor", "[T, n_mels]",
              "log-mel features, valid frames (NeMo AudioToMelSpectrogramPreprocessor)"),
        Stage("pre_encode", "tensor", "[T, D]", "ConvSubsampling output, T' frames",
              replayed="pre_encode_replayed"),
        Stage("pos_emb", "tensor", "[2T-1, D]",
              "relative positional encoding fed to the layers (RelPositionalEncoding; "
              "rel_pos_local_attn [w, w]: LocalAttRelPositionalEncoding's 2w+1 rows)"),
        Stage("layer_{i}", "tensor", "[T, D]", "output of ConformerLayer i",
              isolated="layer_{i}_isolated", replayed="layer_{i}_replayed"),
        Stage("enc_out", "tensor", "[T, D]", "encoder output"),
        Stage("joint_logits", "tensor", "[steps, V+1+n_durations]",
              "raw joint outputs along the reference's greedy path, one row per evaluation",
              head="transducer", reference_path=True),
        Stage("lstm_state_0", "tensor", "[layers, 2, H]",
              "prediction network state (h, c) after the blank/SOS step", head="transducer"),
        Stage("decode", "document", "{ids, frames, durations, text}",
              "greedy TDT (RNNT: durations empty) decode of the whole pipeline",
              isolated="decoder_replay", replayed="decode_replayed", head="transducer"),
        Stage("ctc_logits", "tensor", "[T, V+1]",
              "CTC decoder log-probabilities (ConvASRDecoder) of the encoder output",
              isolated="ctc_logits_isolated", head="ctc"),
        Stage("ctc_decode", "document", "{ids, frames, text}",
              "greedy CTC decode of the whole pipeline (frames: each token's first frame)",
              isolated="ctc_decoder_replay", head="ctc"),
    ),
    entry_points={
        "fixture": "audioparity.models.parakeet_tdt.fixture:build_fixture",
        "reference": "audioparity.models.parakeet_tdt.reference:dump_reference",
        "ggml": "audioparity.models.parakeet_tdt.dump:dump_ggml",
        "weights": "audioparity.models.parakeet_tdt.weights:save_weights",
        "replay": "audioparity.models.parakeet_tdt.replay:dump_replay",
    },
    options=(
        Option("conv_weight_type", "f32", "storage type of the convolution kernels "
               "(subsampling, depthwise conv)", choices=FLOAT_STORAGE_TYPES,
               sides=("ggml", "weights")),
        Option("flash_attention", 0, "1: attention through ggml_flash_attn_ext",
               choices=(0, 1)),
        Option("vocab_size", 96, "tokenizer pieces (a port's loader may check them)",
               sides=("fixture",), minimum=8),
        Option("joint_hidden", 56, "the joint's hidden size (48: the prediction net's)",
               sides=("fixture",), minimum=1),
        Option("blank_bias_nudge", 10.5, "added to the blank's joint bias, so that greedy "
               "decoding emits blanks and tokens", sides=("fixture",)),
        Option("duration0_bias_nudge", 2.5, "added to duration 0's joint bias, so that tokens "
               "stay on a frame up to the symbol limit", sides=("fixture",)),
        Option("xscaling", False, "scale pre_encode by sqrt(d_model) before the layers "
               "(NeMo's default; v3 has it off)", sides=("fixture",)),
        Option("use_bias", False, "biases in the encoder's linear layers and convolutions "
               "(NeMo's default; v3 has them off)", sides=("fixture",)),
        Option("local_attention", 0, "window w of rel_pos_local_attn, att_context_size [w, w] "
               "(0: v3's full-context rel_pos)", sides=("fixture",), minimum=0),
        Option("head", "tdt", "the decoders: tdt (v3's), rnnt (no durations), ctc, tdt_ctc "
               "(TDT and an auxiliary CTC decoder)", sides=("fixture",),
               choices=("tdt", "rnnt", "ctc", "tdt_ctc")),
        Option("ctc_blank_bias_nudge", 4.0, "added to a CTC decoder's blank bias, so that greedy "
               "CTC decoding emits blanks and tokens", sides=("fixture",)),
    ),
    fixture_model="model.nemo",
    ggml_reads_reference=True,
)
