"""The tool's vocabulary, in one place: every module, the CLI and the config schema take these
names from here (a test holds ``config/schema.yaml``'s enums to them)."""

#: ggml backends a dump can run on (``cpu``, ``cuda``, ``vulkan``); one not built into this ggml
#: gives an ``unavailable`` dump.
BACKENDS = ("cpu", "cuda", "vulkan")

#: Storage types of ggml weight tensors: f32, f16, bf16, and q8_0 (blocks of 32 int8 values with
#: one f16 scale).
STORAGE_TYPES = ("f32", "f16", "bf16", "q8_0")

#: Storage types every ggml op reads as floats: those of a KV cache or a convolution kernel.
FLOAT_STORAGE_TYPES = ("f32", "f16")

#: Weight types a dump is asked for: a storage type for the matmul weights, or ``native``, the
#: checkpoint's own dtype.
WEIGHT_TYPES = ("native", *STORAGE_TYPES)

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

#: What a family's cases are: audio files or prompt JSON files.
INPUT_KINDS = ("audio", "prompt")

#: What a stage is in a dump: a ``.npy`` tensor, a ``.npy`` of logits (last axis: classes; top-1
#: and KL are measured too) or a JSON document.
STAGE_KINDS = ("tensor", "logits", "document")

#: The sides of a comparison that run a family's code: the fixture builder, the reference dump
#: (PyTorch/NeMo) and the ggml dump.
SIDES = ("fixture", "reference", "ggml")

#: The candidate name of this project's own ggml port.
OUR_PORT = "audioparity"
