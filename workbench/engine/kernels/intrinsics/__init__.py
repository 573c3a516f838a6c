"""The kernels' LLVM-level primitives, exposed to Numba as intrinsics, grouped by what they compute
(built with `kernels.llvm_ir`; import each from its module):

- `scalars`: one value at a time (f16 / bf16 reads, rounding to f16, a fused multiply-add);
- `load_store`: vectors in and out of arrays (loads, gathers, stores, broadcasts, a byte copy);
- `lanes`: lane-wise arithmetic on ymm / zmm / 4-lane registers, the activations' quantization;
- `reductions`: sums across lanes in the order of the ggml reduction each stands for;
- `dots`: integer dot products of quants (``mode``: AVX2 or VNNI) and the steps that scale them;
- `quant_blocks`: quantized blocks unpacked into lanes (nibbles, fifth bits, Q4_0 / Q5_0 row
  pairs, K-quant super-blocks in 512-bit lanes);
- `regroup`: rows regrouped into lanes for the repacked prompt products;
- `streams`: how the one-token kernels read their rows (prefetch distances, two streams).

The vector primitives take a compile-time ``mode`` where the instruction set matters (PORTABLE,
AVX2, VNNI: `llvm_ir`); LLVM folds the unused branches away, so a kernel compiled for one mode
never contains the others' opcodes.
"""
