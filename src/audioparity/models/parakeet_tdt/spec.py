"""The Parakeet family's contract: its name table, its stages, options and what the tool knows
of it, as data (read by :class:`~audioparity.models.parakeet_tdt.ParakeetTdt`, the fixture
builder, the ggml port, both references, the replay and the seed export). Imports none of the
family's other modules, so any of them may name a stage."""

from __future__ import annotations

from audioparity.contract.family import reference_names
from audioparity.contract.spec import FamilySpec, Option, Stage, StageName
from audioparity.contract.vocabulary import FLOAT_STORAGE_TYPES, InputKind

#: The output heads of a Parakeet model (:attr:`Stage.head`): a transducer (TDT or RNNT
#: prediction network and joint) and a CTC decoder (``ConvASRDecoder``).
TRANSDUCER, CTC = "transducer", "ctc"


class Names(StageName):
    """Parakeet's name table: every name its spec's stages and forms are written with (a
    per-layer one with :data:`~audioparity.contract.spec.LAYER`, ``Names.LAYER.at(3)`` is
    ``layer_3``) and the decodes' margins; the code names a stage by its member, never by a
    literal."""

    MEL_FEATURES = "mel_features"
    PRE_ENCODE = "pre_encode"
    PRE_ENCODE_REPLAYED = "pre_encode_replayed"
    POS_EMB = "pos_emb"
    LAYER = "layer_{i}"
    LAYER_ISOLATED = "layer_{i}_isolated"
    LAYER_REPLAYED = "layer_{i}_replayed"
    ENC_OUT = "enc_out"
    JOINT_LOGITS = "joint_logits"
    LSTM_STATE_0 = "lstm_state_0"
    DECODE = "decode"
    DECODE_MARGINS = "decode_margins"
    DECODER_REPLAY = "decoder_replay"
    DECODE_REPLAYED = "decode_replayed"
    DECODE_LOGITS = "decode_logits"
    CTC_LOGITS = "ctc_logits"
    CTC_LOGITS_ISOLATED = "ctc_logits_isolated"
    CTC_DECODE = "ctc_decode"
    CTC_DECODE_MARGINS = "ctc_decode_margins"
    CTC_DECODER_REPLAY = "ctc_decoder_replay"



_STAGES = (
    Stage(Names.MEL_FEATURES, "tensor", "[T, n_mels]",
          "log-mel features, valid frames (NeMo AudioToMelSpectrogramPreprocessor)"),
    Stage(Names.PRE_ENCODE, "tensor", "[T, D]", "ConvSubsampling output, T' frames",
          replayed=Names.PRE_ENCODE_REPLAYED, inputs=(Names.MEL_FEATURES,)),
    Stage(Names.POS_EMB, "tensor", "[2T-1, D]",
          "relative positional encoding fed to the layers (RelPositionalEncoding; "
          "rel_pos_local_attn [w, w]: LocalAttRelPositionalEncoding's 2w+1 rows)"),
    Stage(Names.LAYER, "tensor", "[T, D]", "output of ConformerLayer i",
          isolated=Names.LAYER_ISOLATED, replayed=Names.LAYER_REPLAYED,
          inputs=(f"{Names.LAYER.previous}|{Names.PRE_ENCODE}", Names.POS_EMB)),
    Stage(Names.ENC_OUT, "tensor", "[T, D]", "encoder output", inputs=(Names.LAYER.last,)),
    Stage(Names.JOINT_LOGITS, "logits", "[steps, V+1+n_durations]",
          "raw joint outputs along the reference's greedy path, one row per evaluation",
          head=TRANSDUCER, reference_path=True, parts=(Names.LSTM_STATE_0,),
          reference_inputs=(Names.ENC_OUT,)),
    Stage(Names.LSTM_STATE_0, "tensor", "[layers, 2, H]",
          "prediction network state (h, c) after the blank/SOS step", head=TRANSDUCER),
    Stage(Names.DECODE, "document", "{ids, frames, durations, text}",
          "greedy TDT (RNNT: durations empty) decode of the whole pipeline",
          isolated=Names.DECODER_REPLAY, replayed=Names.DECODE_REPLAYED, head=TRANSDUCER,
          margins="[positions]", inputs=(Names.ENC_OUT, Names.DECODE_LOGITS),
          parts=(Names.JOINT_LOGITS,)),
    Stage(Names.DECODE_LOGITS, "logits", "[steps, V+1+n_durations]",
          "the whole pipeline's decode teacher-forced: the prediction network and joint along "
          "the reference's greedy path on the pipeline's own enc_out, one row per evaluation "
          "(each step judged alone: a flip costs that step, not the rest)",
          head=TRANSDUCER, reference_path=True, inputs=(Names.ENC_OUT,),
          parts=(Names.JOINT_LOGITS,)),
    Stage(Names.CTC_LOGITS, "logits", "[T, V+1]",
          "CTC decoder log-probabilities (ConvASRDecoder) of the encoder output",
          isolated=Names.CTC_LOGITS_ISOLATED, head=CTC, inputs=(Names.ENC_OUT,)),
    Stage(Names.CTC_DECODE, "document", "{ids, frames, text}",
          "greedy CTC decode of the whole pipeline (frames: each token's first frame)",
          isolated=Names.CTC_DECODER_REPLAY, head=CTC, margins="[positions]",
          inputs=(Names.CTC_LOGITS,), parts=(Names.CTC_LOGITS_ISOLATED,)),
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
    input=InputKind.AUDIO,
    model="a .nemo file or a Hugging Face Parakeet directory (config.json + "
          "model.safetensors)",
    stages=_STAGES,
    options=_OPTIONS,
    fixture_model="model.nemo",
    ggml_reads_reference=True,
    references=reference_names(__package__, primary="nemo"),
)
