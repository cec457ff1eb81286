"""transcribe.cpp with an arithmetic fault planted in its source (the .patch beside this file):
its encoder's layer 1 computes on its input plus 5 % of the input's positive part when that
layer's weights are q4_K (a change its norms do not undo), as a kernel wrong at one type only
would. Its q8_0 cells are the port's; at q4_K_M the layer alone is wrong."""

from dataclasses import replace
from pathlib import Path

from audioparity.candidates.transcribe_cpp import TranscribeCpp

PATCH = Path(__file__).with_suffix(".patch").resolve()


class LayerOneAtQ4K(TranscribeCpp):
    name = "transcribe_cpp_layer_1_q4_K"
    title = "transcribe.cpp (layer 1 wrong at q4_K)"
    port = replace(TranscribeCpp.port, patches=(str(PATCH),), vulkan=())
