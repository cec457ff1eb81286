"""The Parakeet family's contract: its stages, options and what the tool knows of it, as data
(read by :class:`~audioparity.models.parakeet_tdt.ParakeetTdt` and the fixture builder)."""

from __future__ import annotations

from audioparity.contract.family import reference_names
from audioparity.contract.spec import FamilySpec, Option, Stage
from audioparity.contract.vocabulary import FLOAT_STORAGE_TYPES

#: The output heads of a Parakeet model (:attr:`Stage.head`): a transducer (TDT or RNNT
#: prediction network and joint) and a CTC decoder (``ConvASRDecoder``).
TRANSDUCER, CTC = "transducer", "ctc"

_STAGES = (
    Stage("mel_features", "tensor", "[T, n_mels]",
          "log-mel features, valid frames (NeMo AudioToMelSpectrogramPreprocessor)"),
    Stage("pre_encode", "tensor", "[T, D]", "ConvSubsampling output, T' frames",
          replayed="pre_encode_replayed", inputs=("mel_features",)),
    Stage("pos_emb", "tensor", "[2T-1, D]",
          "relative positional encoding fed to the layers (RelPositionalEncoding; "
          "rel_pos_local_attn [w, w]: LocalAttRelPositionalEncoding's 2w+1 rows)"),
    Stage("layer_{i}", "tensor", "[T, D]", "output of ConformerLayer i",
          isolated="layer_{i}_isolated", replayed="layer_{i}_replayed",
          inputs=("layer_{i-1}|pre_encode", "pos_emb")),
    Stage("enc_out", "tensor", "[T, D]", "encoder output", inputs=("layer_{last}",)),
    Stage("joint_logits", "logits", "[steps, V+1+n_durations]",
          "raw joint outputs along the reference's greedy path, one row per evaluation",
          head=TRANSDUCER, reference_path=True, parts=("lstm_state_0",),
          reference_inputs=("enc_out",)),
    Stage("lstm_state_0", "tensor", "[layers, 2, H]",
          "prediction network state (h, c) after the blank/SOS step", head=TRANSDUCER),
    Stage("decode", "document", "{ids, frames, durations, text}",
          "greedy TDT (RNNT: durations empty) decode of the whole pipeline",
          isolated="decoder_replay", replayed="decode_replayed", head=TRANSDUCER,
          margins="[positions]", inputs=("enc_out", "decode_logits"),
          parts=("joint_logits",)),
    Stage("decode_logits", "logits", "[steps, V+1+n_durations]",
          "the whole pipeline's decode teacher-forced: the prediction network and joint along "
          "the reference's greedy path on the pipeline's own enc_out, one row per evaluation "
          "(each step judged alone: a flip costs that step, not the rest)",
          head=TRANSDUCER, reference_path=True, inputs=("enc_out",), parts=("joint_logits",)),
    Stage("ctc_logits", "logits", "[T, V+1]",
          "CTC decoder log-probabilities (ConvASRDecoder) of the encoder output",
          isolated="ctc_logits_isolated", head=CTC, inputs=("enc_out",)),
    Stage("ctc_decode", "document", "{ids, frames, text}",
          "greedy CTC decode of the whole pipeline (frames: each token's first frame)",
          isolated="ctc_decoder_replay", head=CTC, margins="[positions]",
          inputs=("ctc_logits",), parts=("ctc_logits_isolated",)),
)

_OPTIONS = (
    Option("conv_weight_type", "f32", "storage type of the convolution kernels "
           "(subsampling, depthwise conv)", choices=FLOAT_STORAGE_TYPES,
           sides=("ggml", "weights")),
    Option("flash_attention", 0, "1: attention through ggml_flash_attn_ext", choices=(0, 1)),
    Option("attention_mask", 1, "the transformers reference: 1 passes the feature extractor's "
           "attention mask to the model; 0 runs one utterance without it, as transformers "
           "allows (no padded frame is then zeroed inside the subsampling)",
           sides=("reference",), choices=(0, 1), implementations=("transformers",)),
    Option("vocab_size", 96, "tokenizer pieces (a port's loader may check them; at least 45, "
           "the fixture text's characters, the word marker and <unk>)",
           sides=("fixture",), minimum=45),
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
    # The fixture's shapes (fixture.fixture_config reads each by its name; v3's structure at
    # tiny sizes by default).
    Option("d_model", 64, "encoder width (encoder.d_model)", sides=("fixture",), minimum=1),
    Option("n_heads", 4, "attention heads (encoder.n_heads; d_model a multiple of it)",
           sides=("fixture",), minimum=1),
    Option("n_layers", 3, "conformer layers (encoder.n_layers)", sides=("fixture",), minimum=1),
    Option("conv_kernel_size", 9, "depthwise conv kernel of the conformer's conv module "
           "(encoder.conv_kernel_size, odd)", sides=("fixture",), minimum=1),
    Option("subsampling", "dw_striding", "encoder.subsampling: dw_striding (v3's, depthwise "
           "separable) or striding (full 2-D convolutions)", sides=("fixture",),
           choices=("dw_striding", "striding")),
    Option("subsampling_factor", 8, "encoder.subsampling_factor", sides=("fixture",),
           choices=(2, 4, 8, 16)),
    Option("subsampling_conv_channels", 24, "encoder.subsampling_conv_channels (-1: NeMo's "
           "default, d_model)", sides=("fixture",), minimum=-1),
    Option("sample_rate", 16000, "the model's sample rate in Hz (sample_rate, "
           "preprocessor.sample_rate)", sides=("fixture",), minimum=8000),
    Option("features", 128, "mel bins (preprocessor.features, encoder.feat_in)",
           sides=("fixture",), minimum=1),
    Option("window_size", 0.025, "STFT window in seconds (preprocessor.window_size)",
           sides=("fixture",)),
    Option("window_stride", 0.01, "STFT hop in seconds (preprocessor.window_stride)",
           sides=("fixture",)),
    Option("n_fft", 512, "FFT size (preprocessor.n_fft; 0: NeMo's default, the next power of "
           "two of the window)", sides=("fixture",), minimum=0),
    Option("preemph", 0.97, "pre-emphasis coefficient (preprocessor.preemph)",
           sides=("fixture",), nullable=True),
    Option("pred_hidden", 48, "prediction network width (decoder.prednet.pred_hidden)",
           sides=("fixture",), minimum=1),
    Option("pred_rnn_layers", 2, "prediction network LSTM layers (decoder.prednet."
           "pred_rnn_layers)", sides=("fixture",), minimum=1),
    Option("max_symbols_per_step", 10, "greedy decoding's symbols per encoder frame at most "
           "(decoding.greedy.max_symbols)", sides=("fixture",), minimum=1),
)

SPEC = FamilySpec(
    name="parakeet_tdt",
    command="parakeet-tdt",
    title="Parakeet-TDT speech recogniser (NeMo EncDecRNNTBPEModel) against NeMo",
    input="audio",
    model="a .nemo file or a Hugging Face Parakeet directory (config.json + "
          "model.safetensors)",
    stages=_STAGES,
    options=_OPTIONS,
    fixture_model="model.nemo",
    ggml_reads_reference=True,
    references=reference_names(__package__, primary="nemo"),
)
