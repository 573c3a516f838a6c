// Dump llama.cpp's intermediate tensors (every F32/F16 node of the graph) and its last logits for a
// prompt given as token ids, through the library of the vendored build (benchmarks/llamacpp_build.sh),
// when llama-cpp-python (scripts/dump_llama_tensors.py) is not installed. A numerics debugging aid.
//
//   L=~/.cache/numawb/llama.cpp-0.3.36
//   g++ -O2 -std=c++17 -I$L/src/include -I$L/src/ggml/include scripts/llama_dump.cpp -o /tmp/llama_dump \
//       $L/build/src/libllama.a $L/build/ggml/src/libggml.a $L/build/ggml/src/libggml-cpu.a \
//       $L/build/ggml/src/libggml-base.a -fopenmp -lpthread -ldl
//   /tmp/llama_dump MODEL OUT THREADS id id ... [-- decode ids]   (env FA=0|1 flash attention, default auto;
//                                                                  NCTX context size, default 512; SWAFULL=0|1;
//                                                                  DECODE_BATCH decode ids a batch, default 1)
//
// With decode ids, the prompt is evaluated, then the decode ids DECODE_BATCH at a time (each alone by
// default); only the last step is dumped. llama-server evaluates a prompt of an SWA model (Gemma 3) in
// two batches, the last 4 tokens apart (its context checkpoints, `--ctx-checkpoints`): ids[:-4] --
// ids[-4:] with DECODE_BATCH=4 is what it computes.
// OUT holds records: int32 name length, the name ("index:tensor name"; "logits" last), int64 ne[4],
// then ne0*ne1*ne2*ne3 float32 values in ggml order (ne0 fastest). numawb follows the non-flash
// attention (FA=0); llama-server's default (-fa auto) turns flash attention on for the CPU.
#include "llama.h"
#include "ggml.h"
#include "ggml-backend.h"
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>
static FILE *out = nullptr;
static int counter = 0;
static bool active = false;
static bool cb(struct ggml_tensor *t, bool ask, void *) {
    if (ask) return true;
    if (!active) return true;
    if (t->type != GGML_TYPE_F32 && t->type != GGML_TYPE_F16) return true;
    int64_t ne[4]; for (int i = 0; i < 4; i++) ne[i] = t->ne[i];
    int64_t n = ne[0]*ne[1]*ne[2]*ne[3];
    std::vector<float> buf(n);
    std::vector<uint8_t> raw(ggml_nbytes(t));
    ggml_backend_tensor_get(t, raw.data(), 0, raw.size());
    size_t k = 0;
    for (int64_t i3 = 0; i3 < ne[3]; i3++) for (int64_t i2 = 0; i2 < ne[2]; i2++)
    for (int64_t i1 = 0; i1 < ne[1]; i1++) for (int64_t i0 = 0; i0 < ne[0]; i0++) {
        size_t off = i0*t->nb[0] + i1*t->nb[1] + i2*t->nb[2] + i3*t->nb[3];
        if (t->type == GGML_TYPE_F32) buf[k++] = *(float*)(raw.data()+off);
        else buf[k++] = ggml_fp16_to_fp32(*(ggml_fp16_t*)(raw.data()+off));
    }
    char name[128]; snprintf(name, sizeof name, "%04d:%s", counter++, t->name);
    int32_t len = strlen(name);
    fwrite(&len, 4, 1, out); fwrite(name, 1, len, out);
    fwrite(ne, 8, 4, out); fwrite(buf.data(), 4, n, out);
    return true;
}
int main(int argc, char **argv) {
    // dump MODEL OUT THREADS ids... [-- decode ids]
    const char *model_path = argv[1]; out = fopen(argv[2], "wb"); int threads = atoi(argv[3]);
    std::vector<int> ids, dec; bool d = false;
    for (int i = 4; i < argc; i++) { if (!strcmp(argv[i], "--")) { d = true; continue; } (d ? dec : ids).push_back(atoi(argv[i])); }
    llama_backend_init();
    auto mp = llama_model_default_params();
    llama_model *m = llama_model_load_from_file(model_path, mp);
    auto cp = llama_context_default_params();
    cp.n_ctx = 512; cp.n_batch = 512; cp.n_ubatch = 512; cp.n_threads = threads; cp.n_threads_batch = threads;
    cp.cb_eval = cb; if (getenv("SWAFULL")) cp.swa_full = atoi(getenv("SWAFULL")); cp.cb_eval_user_data = nullptr;
    cp.flash_attn_type = getenv("FA") ? (atoi(getenv("FA")) ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED) : LLAMA_FLASH_ATTN_TYPE_AUTO; cp.n_ctx = getenv("NCTX") ? atoi(getenv("NCTX")) : 512;
    llama_context *ctx = llama_init_from_model(m, cp);
    active = dec.empty();
    llama_batch b = llama_batch_get_one(ids.data(), ids.size());
    if (llama_decode(ctx, b)) { fprintf(stderr, "decode failed\n"); return 1; }
    const size_t step = getenv("DECODE_BATCH") ? (size_t) atoi(getenv("DECODE_BATCH")) : 1;
    for (size_t i = 0; i < dec.size(); i += step) {
        const size_t n = std::min(step, dec.size() - i);
        active = (i + n == dec.size());
        llama_batch b1 = llama_batch_get_one(&dec[i], n);
        if (llama_decode(ctx, b1)) { fprintf(stderr, "decode failed\n"); return 1; }
    }
    int nv = llama_vocab_n_tokens(llama_model_get_vocab(m));
    float *lg = llama_get_logits_ith(ctx, -1);
    const char *nm = "logits"; int32_t len = 6; int64_t ne[4] = {nv, 1, 1, 1};
    fwrite(&len, 4, 1, out); fwrite(nm, 1, len, out); fwrite(ne, 8, 4, out); fwrite(lg, 4, nv, out);
    fclose(out);
    return 0;
}
