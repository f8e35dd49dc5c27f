// Greedy (pure argmax) generation with llama.cpp, used to record peer reference
// token ids for SparklingTree's real-weight tests. Driven by
// scripts/llamacpp-greedy.py, which builds it against a llama.cpp build made by
// scripts/build-llamacpp and turns its output into tests/data/llamacpp_greedy_*.json.
//
// Build (done by the .py driver):
//   cc -O2 -std=c11 scripts/llamacpp-greedy.c -I$LLAMA_SRC/include -I$LLAMA_SRC/ggml/include
//      -L$LLAMA_BUILD/bin -Wl,-rpath,$LLAMA_BUILD/bin -lllama -lggml -lggml-base -o llamacpp-greedy
//
// Usage: llamacpp-greedy MODEL.gguf PROMPT_FILE N_PREDICT SPECIAL(0|1) [KV_TYPE f32|f16] [THREADS] [FLASH_ATTN off|on|auto]
//   The prompt is the raw bytes of PROMPT_FILE. It is tokenized with
//   add_special=false (never a BOS) and parse_special=SPECIAL. Generation stops
//   after N_PREDICT tokens or at an end-of-generation token (which is recorded).
//
// Output (stdout, one record per line, all text hex-encoded):
//   version <llama_version()>
//   sysinfo_hex <hex of llama_print_system_info()>
//   meta add_bos <0|1> add_bos_key <value|-> n_vocab <n>
//   prompt_ids <id> <id> ...
//   step <i> <id> <logit1> <id2> <logit2> <piece_hex>
//   eog <0|1>
//   text_hex <hex of detokenized generated ids, specials not rendered>
#include "llama.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void hex_out(const char *buf, int n) {
    if (n <= 0) { fputs("-", stdout); return; }
    for (int i = 0; i < n; i++) printf("%02x", (unsigned char) buf[i]);
}

static char *read_file(const char *path, long *len) {
    FILE *f = fopen(path, "rb");
    if (!f) { perror(path); exit(2); }
    fseek(f, 0, SEEK_END);
    *len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t) *len + 1);
    if (fread(buf, 1, (size_t) *len, f) != (size_t) *len) { perror("fread"); exit(2); }
    buf[*len] = 0;
    fclose(f);
    return buf;
}

static void quiet_log(enum ggml_log_level level, const char *text, void *ud) {
    (void) ud;
    // WARN and ERROR only (CONT lines are the progress dots of the loader)
    if (level == GGML_LOG_LEVEL_WARN || level == GGML_LOG_LEVEL_ERROR) fputs(text, stderr);
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: %s MODEL PROMPT_FILE N_PREDICT SPECIAL(0|1) [f32|f16] [THREADS] [off|on|auto]\n", argv[0]);
        return 2;
    }
    const char *model_path = argv[1];
    long prompt_len = 0;
    char *prompt = read_file(argv[2], &prompt_len);
    const int n_predict = atoi(argv[3]);
    const bool special = atoi(argv[4]) != 0;
    const char *kv = argc > 5 ? argv[5] : "f32";
    const int n_threads = argc > 6 ? atoi(argv[6]) : 2;
    const char *fa = argc > 7 ? argv[7] : "off";

    llama_log_set(quiet_log, NULL);
    llama_backend_init();

    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    struct llama_model *model = llama_model_load_from_file(model_path, mp);
    if (!model) { fprintf(stderr, "failed to load %s\n", model_path); return 1; }
    const struct llama_vocab *vocab = llama_model_get_vocab(model);
    const int n_vocab = llama_vocab_n_tokens(vocab);

    printf("version %s\n", llama_version());
    const char *si = llama_print_system_info();
    printf("sysinfo_hex ");
    hex_out(si, (int) strlen(si));
    printf("\n");

    char keybuf[64];
    int kl = llama_model_meta_val_str(model, "tokenizer.ggml.add_bos_token", keybuf, sizeof keybuf);
    printf("meta add_bos %d add_bos_key %s n_vocab %d\n", llama_vocab_get_add_bos(vocab) ? 1 : 0,
           kl >= 0 ? keybuf : "-", n_vocab);

    // tokenize: no BOS/EOS (add_special=false), parse_special as requested
    int cap = (int) prompt_len + 16;
    llama_token *toks = malloc(sizeof(llama_token) * (size_t) (cap + n_predict));
    int n_prompt = llama_tokenize(vocab, prompt, (int32_t) prompt_len, toks, cap, false, special);
    if (n_prompt <= 0) { fprintf(stderr, "tokenize failed (%d)\n", n_prompt); return 1; }
    printf("prompt_ids");
    for (int i = 0; i < n_prompt; i++) printf(" %d", toks[i]);
    printf("\n");

    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t) (n_prompt + n_predict + 8);
    cp.n_batch = cp.n_ctx;
    cp.n_ubatch = cp.n_ctx;
    cp.n_seq_max = 1;
    cp.n_threads = n_threads;
    cp.n_threads_batch = n_threads;
    cp.no_perf = true;
    if (strcmp(kv, "f32") == 0) {
        cp.type_k = GGML_TYPE_F32;
        cp.type_v = GGML_TYPE_F32;
    } else if (strcmp(kv, "f16") == 0) {
        cp.type_k = GGML_TYPE_F16;
        cp.type_v = GGML_TYPE_F16;
    } else {
        fprintf(stderr, "bad kv type %s\n", kv);
        return 2;
    }
    if (strcmp(fa, "off") == 0) {
        cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    } else if (strcmp(fa, "on") == 0) {
        cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_ENABLED;
    } else if (strcmp(fa, "auto") == 0) {
        cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_AUTO;
    } else {
        fprintf(stderr, "bad flash_attn mode %s\n", fa);
        return 2;
    }
    struct llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) { fprintf(stderr, "failed to create context\n"); return 1; }

    llama_token *gen = toks + n_prompt;
    int n_gen = 0;
    bool eog = false;
    struct llama_batch batch = llama_batch_get_one(toks, n_prompt);
    char piece[256];
    for (int step = 0; step < n_predict; step++) {
        if (llama_decode(ctx, batch) != 0) { fprintf(stderr, "decode failed at step %d\n", step); return 1; }
        const float *logits = llama_get_logits_ith(ctx, -1);
        int b1 = 0, b2 = -1;
        for (int v = 1; v < n_vocab; v++) {
            if (logits[v] > logits[b1]) { b2 = b1; b1 = v; }
            else if (b2 < 0 || logits[v] > logits[b2]) b2 = v;
        }
        int pl = llama_token_to_piece(vocab, b1, piece, sizeof piece, 0, true);
        printf("step %d %d %.6f %d %.6f ", step, b1, logits[b1], b2, logits[b2]);
        hex_out(piece, pl);
        printf("\n");
        gen[n_gen++] = b1;
        if (llama_vocab_is_eog(vocab, b1)) { eog = true; break; }
        batch = llama_batch_get_one(&gen[n_gen - 1], 1);
    }
    printf("eog %d\n", eog ? 1 : 0);

    int tcap = 64 * n_gen + 64;
    char *text = malloc((size_t) tcap);
    int tl = llama_detokenize(vocab, gen, n_gen, text, tcap, false, false);
    printf("text_hex ");
    hex_out(text, tl);
    printf("\n");

    free(text);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    free(toks);
    free(prompt);
    return 0;
}
