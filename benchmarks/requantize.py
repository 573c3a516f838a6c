"""Write a GGUF file's weight matrices again in another type, for speed comparisons on real shapes.

    python3 benchmarks/requantize.py [-m MODEL] [--type Q4_0] [--out PATH]

Every 2-D quantized tensor (the token embedding included) is dequantized and quantized again with
gguf-py's reference quantizer into ``--type`` (Q4_0, Q8_0, Q5_0, ...); float tensors (norms) and
every metadata field are copied as they are. The default model requantized to Q4_0 has the shape
of Google's QAT Gemma 3 270M Q4_0 file (its tied 262144 x 640 embedding in Q4_0): the vocabulary,
the tokenizer and the text are real, the weights lose precision (the text stays readable). Written
once into $XDG_CACHE_HOME/numawb/bench-models/ (reused when it exists); prints the path.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))


def requantize(src: str, dst: str, qtype) -> None:
    import gguf
    from gguf import GGMLQuantizationType as T

    reader = gguf.GGUFReader(src)
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    writer = gguf.GGUFWriter(dst, arch)
    ftype = gguf.LlamaFileType.__members__.get(f"MOSTLY_{qtype.name}")
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        if field.name == gguf.Keys.General.FILE_TYPE and ftype is not None:
            writer.add_file_type(ftype)
            continue
        vt = field.types[0]
        sub = field.types[-1] if vt == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), vt, sub_type=sub)
    block = gguf.GGML_QUANT_SIZES[qtype][0]
    datas = []
    for t in reader.tensors:
        data = t.data
        if t.tensor_type not in (T.F32, T.F16, T.BF16) and len(t.shape) == 2 and int(t.shape[0]) % block == 0:
            rows = int(np.prod(t.shape[1:]))
            f = gguf.quants.dequantize(data, t.tensor_type).reshape(rows, int(t.shape[0]))
            data = gguf.quants.quantize(f.astype(np.float32), qtype)
            writer.add_tensor_info(t.name, data.shape, data.dtype, data.nbytes, qtype)
        else:
            writer.add_tensor_info(t.name, data.shape, data.dtype, data.nbytes, t.tensor_type)
        datas.append(data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for data in datas:
        writer.write_tensor_data(data)
    writer.close()


def main() -> int:
    from gguf import GGMLQuantizationType as T

    from workbench.engine.engine import default_model_path
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-m", "--model", help="source GGUF file (default: the default model)")
    ap.add_argument("--type", default="Q4_0", help="the weight matrices' new type (default Q4_0)")
    ap.add_argument("--out")
    args = ap.parse_args()
    qtype = T.__members__.get(args.type.upper())
    if qtype is None:
        ap.error(f"unknown type {args.type!r}; e.g. Q4_0, Q8_0, Q5_0")
    src = args.model or default_model_path()
    if not os.path.exists(src):
        ap.error(f"no such model file: {src}")
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    name = os.path.splitext(os.path.basename(src))[0] + f"-requant-{qtype.name.lower()}.gguf"
    path = args.out or os.path.join(base, "numawb", "bench-models", name)
    if not os.path.exists(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        requantize(src, path + ".part", qtype)
        os.replace(path + ".part", path)
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
