"""transcribe.cpp with one byte of one block of its q8_0 file changed after its quantizer
wrote it (flip_byte.py): a quantizer fault the activations barely show."""

import sys
from pathlib import Path

from audioparity.candidates.transcribe_cpp import TranscribeCpp

#: The tensor of its file, and the block of it, whose byte is changed.
TENSOR, BLOCK = "enc.blocks.1.ff1.linear1.weight", 7


class ChangedByte(TranscribeCpp):
    name = "transcribe_cpp_changed_byte"
    title = "transcribe.cpp (one byte changed in its q8_0 file)"
    weight_types = ("q8_0",)

    def convert(self, model, weight_type, output, *, options):
        (path,) = self.model_files(output, options, weight_type)
        return [*super().convert(model, weight_type, output, options=options),
                [sys.executable, str(Path(__file__).with_name("flip_byte.py")), str(path),
                 TENSOR, str(BLOCK)]]
