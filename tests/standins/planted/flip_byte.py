"""flip_byte.py FILE TENSOR BLOCK: in the GGUF FILE, flip the bits of one quantized value (the
third byte after the block's scale) of block BLOCK of TENSOR, in place."""

import sys

import gguf
import numpy as np

path, name, block = sys.argv[1], sys.argv[2], int(sys.argv[3])
reader = gguf.GGUFReader(path, "r+")
tensor = next(t for t in reader.tensors if t.name == name)
size = gguf.GGML_QUANT_SIZES[tensor.tensor_type][1]
data = np.asarray(tensor.data).reshape(-1).view(np.uint8)
data[block * size + 4] ^= 0x55
reader.data.flush()
