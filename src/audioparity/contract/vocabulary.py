"""The tool's vocabulary, in one place: every module, the CLI and the config schema take these
names from here (a test holds ``config/schema.yaml``'s enums to them)."""

from enum import StrEnum

#: ggml backends a dump can run on (``cpu``, ``cuda``, ``vulkan``); one not built into this ggml
#: gives an ``unavailable`` dump.
BACKENDS = ("cpu", "cuda", "vulkan")

#: Storage types of ggml weight tensors, widest first: the floats f32, f16 and bf16; q8_0 (blocks
#: of 32 int8 values with one f16 scale); the 32-value block types q4_0, q4_1, q5_0, q5_1,
#: iq4_nl (a non-linear 4-bit grid) and mxfp4 (OCP microscaling fp4); the k-quants q2_K to q6_K
#: (super-blocks of 256 values with quantized sub-block scales). ggml's names (``ggml_type_name``).
STORAGE_TYPES = ("f32", "f16", "bf16", "q8_0", "q6_K", "q5_1", "q5_0", "q5_K", "q4_1", "q4_0",
                 "q4_K", "iq4_nl", "mxfp4", "q3_K", "q2_K")

#: Storage types that keep a weight's values unquantized: the floats.
FLOAT_TYPES = ("f32", "f16", "bf16")

#: Storage types made of blocks of quantized values with their scales: all but the floats.
BLOCK_TYPES = tuple(t for t in STORAGE_TYPES if t not in FLOAT_TYPES)

#: The gate list every block type takes after its own (config ``gates: quantized:``): a
#: quantized cell is compared with its quantization-aware reference, and what parts them is the
#: same for every block type (float32 noise that flips a rounding of the 8-bit matmul input).
QUANTIZED = "quantized"

#: Joins a weight type and a precision recipe that keeps some of its weights wider:
#: ``q4_K+recipe`` (``audioparity precision``).
RECIPE_SEPARATOR = "+"

#: A quantized cell is judged in three parts (docs/quantization.md). Its row ``storage``: the
#: types the candidate's file stores each matmul weight in, against the weight type asked (a
#: weight left unquantized where the type fits, or another type where a uniform type was asked,
#: fails it; fallbacks are listed).
STORAGE = "storage"

#: Its row ``stored_weights``, the quantizer: the bytes the candidate stored, weight by weight,
#: against ggml's own quantization of the checkpoint at the same type (the quantization-aware or
#: storage-matched reference's): it fails on a weight stored wrong, however little that weight
#: moves the activations, naming the weight and block. Its stages are the third part, the
#: arithmetic: against a reference computing with the candidate's own stored weights.
STORED_WEIGHTS = "stored_weights"

#: The rows of a quantized cell that judge its weights rather than a stage.
STORAGE_ROWS = (STORAGE, STORED_WEIGHTS)

#: The row ``recipe`` of a cell of a precision recipe's weight type (``q4_0+recipe``): the
#: recipe's targets judged on the cell's own dump against the float32 reference, so the recipe
#: is verified on every case, candidate and backend it runs on; it fails too where the search
#: found no recipe that meets them (docs/quantization.md).
RECIPE_ROW = "recipe"

#: Mixes people ship, by the type most of their matmul weights take: a tool's own choice of
#: type tensor by tensor (llama.cpp's ``Q4_K_M``, transcribe.cpp's presets). Cells of a mix are
#: judged against the storage-matched reference of the file the tool wrote; its other types are
#: listed in the storage verdict, not failed.
MIXES = {"q5_K_M": "q5_K", "q5_K_S": "q5_K", "q4_K_M": "q4_K", "q4_K_S": "q4_K",
         "q3_K_L": "q3_K", "q3_K_M": "q3_K", "q3_K_S": "q3_K"}

#: Storage types every ggml op reads as floats: those of a KV cache or a convolution kernel.
FLOAT_STORAGE_TYPES = ("f32", "f16")

#: Weight types a dump is asked for: a storage type for the matmul weights, or ``native``, the
#: checkpoint's own dtype.
WEIGHT_TYPES = ("native", *STORAGE_TYPES)

#: The ``against`` label of a case run again in one process (after another case, or twice)
#: compared with the same candidate's fresh run of it (:mod:`audioparity.compare.reuse`).
FRESH = "fresh"

#: Status of a dump (its manifest): ``ok``, all tensors written; ``unavailable``, the backend is
#: not built into this ggml; ``crashed``, the producing process died (``audioparity guard``).
DUMP_STATUSES = ("ok", "unavailable", "crashed")

#: What of a stage a candidate's tensor may hold (manifest ``conventions``): ``row`` (one row
#: of its first axis), ``log_softmax`` (over its last axis, every class together).
VIEWS = ("row", "log_softmax")

#: Status of a stage in a cell (a summary row), in the order the report lists them.
STATUSES = ("pass", "fail", "xfail", "unavailable", "crashed", "missing")

#: Statuses given without comparing: the candidate has nothing to compare.
NOT_COMPARED = ("unavailable", "crashed", "missing")

class InputKind(StrEnum):
    """What a family's cases are: audio files (``--audio``) or prompt JSON files
    (``--prompt``)."""

    AUDIO = "audio"
    PROMPT = "prompt"


INPUT_KINDS = tuple(InputKind)

class StageKind(StrEnum):
    """What a stage is in a dump: a ``.npy`` tensor, a ``.npy`` of logits (last axis: classes;
    top-1 and KL are measured too) or a JSON document."""

    TENSOR = "tensor"
    LOGITS = "logits"
    DOCUMENT = "document"


STAGE_KINDS = tuple(StageKind)


class Side(StrEnum):
    """The sides of a comparison that run a family's code: the fixture builder, the reference
    dump (PyTorch/NeMo) and the ggml dump."""

    FIXTURE = "fixture"
    REFERENCE = "reference"
    GGML = "ggml"


SIDES = tuple(Side)

#: The candidate name of this project's own ggml port.
OUR_PORT = "audioparity"
