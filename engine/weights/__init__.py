"""Weight formats: what a projection's weight is stored as, and how it becomes one.

A format is chosen once at load (`load_model(..., weights="q4")`) and every projection of the model is
packed into it; the embedding and the tied LM head too. One module per family of formats holds its
quantizer, its dequantize twin, its layouts and its record (WeightFormat):

    dense.py      fp32, fp16, bf16     the weight itself
    q8_0.py       int8, q8             GGUF Q8_0 blocks (q8: a q4 model's head, 16-bit activations on a CPU)
    q4_1.py       q4, q4_a8, q5_1      GGUF Q4_1 blocks: the default model's own, so lossless for it (q4_a8: the
                                       same blocks against 8-bit activations on a CPU, llama.cpp's recipe); Q5_1
    q4_0.py       q4_0, q5_0           GGUF Q4_0 / Q5_0 blocks (also held exactly by int8's)
    k_quants.py   q2_k, q3_k, q4_k,    GGUF K-quant super-blocks of 256
                  q5_k, q6_k
    k_bytes.py                         the K-quants' GGUF byte codecs (from_gguf, to_gguf)
    k_placed.py                        Q3_K's and Q6_K's panels with their quant bits placed for the CPU kernel
    gguf_bytes.py                      what the formats' GGUF byte codecs share

registry.py lists them by name; everything else (the loader, the ops, the app, the benchmarks) reads the
records through it. A new format: its record (quantizer, twin, layouts) in its module (a new module: one line
in registry.py), its row in csrc/format_list.h (the native modules' one list, checked against the records at
load), its CPU kernel (csrc/cpu/formats.h packed tensors + gemm.h) and its tests. A GGUF type whose CPU
panels are its file's bytes interleaved by 16 rows (panels.gguf_layout: q4_0, q5_0, q5_1, the K-quants) gets
pack_gguf with them: a file's tensor packs without Blocks. Q8_0's and Q4_1's panels are not their bytes (offset
codes, regrouped nibbles): their pack_gguf decodes and packs a chunk of rows at a time (panels.blocks_pack_gguf).
"""
from engine.weights.format import BLOCK, LAYOUTS, Blocks, Layout, Packed, Stacked, WeightFormat
from engine.weights.panels import PANEL
from engine.weights.q4_1 import pack_nibbles, unpack_nibbles
from engine.weights.registry import (BITS, BY_GGUF, DENSE_DTYPES, FORMATS, PANEL_FORMATS, QUANTIZED, REGISTRY,
                                     check_format, dequantize, from_panels, get, pack, place, quantize, reblock,
                                     rows, stack, to_device, to_panels, unpack)

__all__ = ["BITS", "BLOCK", "BY_GGUF", "Blocks", "DENSE_DTYPES", "FORMATS", "LAYOUTS", "Layout", "PANEL",
           "PANEL_FORMATS", "Packed", "QUANTIZED", "REGISTRY", "Stacked", "WeightFormat", "check_format",
           "dequantize", "from_panels", "get", "pack", "pack_nibbles", "place", "quantize", "reblock", "rows", "stack",
           "to_device", "to_panels", "unpack", "unpack_nibbles"]
