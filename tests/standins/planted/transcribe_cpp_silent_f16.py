"""transcribe.cpp with a quantizer that keeps F16 when asked for q4_K: its preset F16 written
as the q4_K file, as a tool falling back silently would."""

from audioparity.candidates.transcribe_cpp import TranscribeCpp


class SilentF16(TranscribeCpp):
    name = "transcribe_cpp_silent_f16"
    title = "transcribe.cpp (asked q4_K, writes F16)"
    weight_types = ("q4_K",)

    def convert(self, model, weight_type, output, *, options):
        *converted, quantize = super().convert(model, "f16", output, options=options)
        quantize[-3] = str(self.model_files(output, options, weight_type)[0])
        return [*converted, quantize]

    def cannot_run(self, options, weight_type, backend):
        return None if weight_type == "q4_K" else f"it runs q4_K only, not {weight_type}"
