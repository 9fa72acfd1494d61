/*
 * pretok.c — byte-level BPE pre-tokenizers, chosen by tokenizer.ggml.pre.
 *
 * Each pre-tokenizer is a chain of regexes, applied like llama.cpp's unicode_regex_split: the first regex
 * splits the text into its matches and the runs between them; each following regex splits every piece again
 * (a piece's end is the end of the text for lookaheads and '$'). The regexes are llama.cpp's per pre type,
 * compiled once with PCRE2 (UTF + UCP, so \p{L}, \p{N}, \p{P} are Unicode categories) and JIT-compiled.
 * Two adjustments make PCRE2 agree with llama.cpp's own matcher: \s also matches U+0085 (llama.cpp's
 * whitespace set is Unicode White_Space, PCRE2's is Z plus ASCII spaces), and '$' only matches at the very end.
 * PCRE2's memory comes from kiln_malloc through a general context.
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "tokenizer/tok_internal.h"

#include <stdio.h>

#include "base/alloc.h"
#include "base/error.h"
#include "base/log.h"

/* \s as llama.cpp means it, for use inside a character class */
#define WS "\\s\\x{85}"

#define RE_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^" WS "\\p{L}\\p{N}]+|[" WS "]+(?![^" WS "])"
#define RE_LLAMA3_HEAD "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
#define RE_LLAMA3_TAIL \
    "| ?[^" WS "\\p{L}\\p{N}]+[\\r\\n]*|[" WS "]*[\\r\\n]+|[" WS "]+(?![^" WS "])|[" WS "]+"
/* [一-龥ࠀ-一가-퟿]+ ; llama.cpp turns non-ASCII whitespace into U+000B before matching these literal classes, so
 * the whitespace code points inside U+0800..U+4E00 are left out here */
#define RE_CJK                                                                                                \
    "[\\x{4E00}-\\x{9FA5}\\x{800}-\\x{167F}\\x{1681}-\\x{1FFF}\\x{200B}-\\x{2027}\\x{202A}-\\x{202E}"          \
    "\\x{2030}-\\x{205E}\\x{2060}-\\x{2FFF}\\x{3001}-\\x{4E00}\\x{AC00}-\\x{D7FF}]+"

/* deepseek-llm's letter class: llama.cpp's literal ranges, written as code points */
#define RE_DEEPSEEK_LETTERS                                                                                    \
    "[" WS "]?[A-Za-z\\x{B5}\\x{C0}-\\x{D6}\\x{D8}-\\x{F6}\\x{F8}-\\x{1BA}\\x{1BC}-\\x{1BF}\\x{1C4}-\\x{293}"   \
    "\\x{295}-\\x{2AF}\\x{370}-\\x{373}\\x{376}\\x{377}\\x{37B}-\\x{37D}\\x{37F}\\x{386}\\x{388}-\\x{38A}"       \
    "\\x{38C}\\x{38E}-\\x{3A1}\\x{3A3}-\\x{3F5}\\x{3F7}-\\x{481}\\x{48A}-\\x{52F}\\x{531}-\\x{556}"              \
    "\\x{10A0}-\\x{10C5}\\x{13A0}-\\x{13F5}\\x{13F8}-\\x{13FD}\\x{1C90}-\\x{1CBA}\\x{1CBD}-\\x{1CBF}"           \
    "\\x{1D00}-\\x{1D2B}\\x{1D6B}-\\x{1D77}\\x{1D79}-\\x{1D9A}\\x{1E00}-\\x{1F15}\\x{1F18}-\\x{1F1D}"           \
    "\\x{1F20}-\\x{1F45}\\x{1F48}-\\x{1F4D}\\x{1F50}-\\x{1F57}\\x{1F59}\\x{1F5B}\\x{1F5D}\\x{1F5F}-\\x{1F7D}"   \
    "\\x{1F80}-\\x{1FB4}\\x{1FB6}-\\x{1FBC}\\x{1FBE}\\x{1FC2}-\\x{1FC4}\\x{1FC6}-\\x{1FCC}\\x{1FD0}-\\x{1FD3}"  \
    "\\x{1FD6}-\\x{1FDB}\\x{1FE0}-\\x{1FEC}\\x{1FF2}-\\x{1FF4}\\x{1FF6}-\\x{1FFC}\\x{2102}\\x{2107}"            \
    "\\x{210A}-\\x{2113}\\x{2115}\\x{2119}-\\x{211D}\\x{2124}\\x{2126}\\x{2128}\\x{212A}-\\x{212D}"             \
    "\\x{212F}-\\x{2134}\\x{2139}\\x{213C}-\\x{213F}\\x{2145}-\\x{2149}\\x{214E}\\x{2183}\\x{2184}"             \
    "\\x{2C00}-\\x{2C7B}\\x{2C7E}-\\x{2CE4}\\x{2CEB}-\\x{2CEE}\\x{2CF2}\\x{2CF3}\\x{A640}-\\x{A66D}"            \
    "\\x{A680}-\\x{A69B}\\x{A722}-\\x{A76F}\\x{A771}-\\x{A787}\\x{A78B}-\\x{A78E}\\x{AB70}-\\x{ABBF}"           \
    "\\x{FB00}-\\x{FB06}\\x{FB13}-\\x{FB17}\\x{FF21}-\\x{FF3A}\\x{FF41}-\\x{FF5A}\\x{10400}-\\x{1044F}"         \
    "\\x{104B0}-\\x{104D3}\\x{104D8}-\\x{104FB}\\x{10C80}-\\x{10CB2}\\x{10CC0}-\\x{10CF2}\\x{118A0}-\\x{118DF}" \
    "\\x{1E900}-\\x{1E943}]+"
/* \s?[!-/:-~！-／：-～‘-‟　-。]+ */
#define RE_DEEPSEEK_PUNCT "[" WS "]?[!-/:-~\\x{FF01}-\\x{FF0F}\\x{FF1A}-\\x{FF5E}\\x{2018}-\\x{201F}\\x{3001}-\\x{3002}]+"   /* U+3000 is whitespace: see RE_CJK */

typedef enum {
    PRE_DEFAULT, PRE_LLAMA3, PRE_QWEN2, PRE_DEEPSEEK_LLM, PRE_DEEPSEEK_CODER, PRE_FALCON, PRE_STARCODER, PRE_GPT2,
    PRE_COUNT
} pre_set;

static const char *const pre_regexes[PRE_COUNT][TOK_MAX_REGEX] = {
    [PRE_DEFAULT] = {"[\\p{P}\\$\\+<=>\\^~\\|]+", RE_GPT2, "\\p{N}+", "[0-9][0-9][0-9]"},
    [PRE_LLAMA3] = {RE_LLAMA3_HEAD "\\p{N}{1,3}" RE_LLAMA3_TAIL},
    [PRE_QWEN2] = {RE_LLAMA3_HEAD "\\p{N}" RE_LLAMA3_TAIL},
    [PRE_DEEPSEEK_LLM] = {"[\r\n]", RE_DEEPSEEK_LETTERS, RE_DEEPSEEK_PUNCT, "[" WS "]+$", RE_CJK, "\\p{N}+"},
    [PRE_DEEPSEEK_CODER] = {"[\r\n]", "[" WS "]?\\p{L}+", "[" WS "]?\\p{P}+", RE_CJK, "\\p{N}"},
    [PRE_FALCON] = {"[\\p{P}\\$\\+<=>\\^~\\|`]+", RE_GPT2, "[0-9][0-9][0-9]"},
    [PRE_STARCODER] = {"\\p{N}", RE_GPT2},
    [PRE_GPT2] = {RE_GPT2},
};

/* tokenizer.ggml.pre names (llama.cpp's) and the regex set each uses; ignore_merges: a word that is a whole
 * token is taken as is (the llama3 family). */
static const struct { const char *name; pre_set set; bool ignore_merges; } pre_names[] = {
    {"default", PRE_DEFAULT, false},
    {"llama3", PRE_LLAMA3, true}, {"llama-v3", PRE_LLAMA3, true}, {"llama-bpe", PRE_LLAMA3, true},
    {"falcon3", PRE_LLAMA3, true}, {"falcon-h1", PRE_LLAMA3, true}, {"pixtral", PRE_LLAMA3, true},
    {"midm-2.0", PRE_LLAMA3, true}, {"lfm2", PRE_LLAMA3, true},
    {"dbrx", PRE_LLAMA3, false}, {"smaug-bpe", PRE_LLAMA3, false}, {"chatglm-bpe", PRE_LLAMA3, false},
    {"glm4", PRE_LLAMA3, false},
    {"qwen2", PRE_QWEN2, false}, {"deepseek-r1-qwen", PRE_QWEN2, false}, {"kormo", PRE_QWEN2, false},
    {"f2llmv2", PRE_QWEN2, false}, {"megrez", PRE_QWEN2, false}, {"stablelm2", PRE_QWEN2, false},
    {"hunyuan", PRE_QWEN2, false}, {"solar-open", PRE_QWEN2, false},
    {"deepseek-llm", PRE_DEEPSEEK_LLM, false},
    {"deepseek-coder", PRE_DEEPSEEK_CODER, false},
    {"falcon", PRE_FALCON, false},
    {"starcoder", PRE_STARCODER, false}, {"refact", PRE_STARCODER, false}, {"command-r", PRE_STARCODER, false},
    {"smollm", PRE_STARCODER, false}, {"codeshell", PRE_STARCODER, false}, {"exaone", PRE_STARCODER, false},
    {"minerva-7b", PRE_STARCODER, false}, {"mellum2", PRE_STARCODER, false},
    {"gpt-2", PRE_GPT2, false}, {"phi-2", PRE_GPT2, false}, {"jina-es", PRE_GPT2, false},
    {"jina-de", PRE_GPT2, false}, {"gigachat", PRE_GPT2, false}, {"jina-v2-es", PRE_GPT2, false},
    {"jina-v2-de", PRE_GPT2, false}, {"a.x-4.0", PRE_GPT2, false}, {"mellum", PRE_GPT2, false},
    {"modern-bert", PRE_GPT2, false}, {"exaone4", PRE_GPT2, false}, {"jina-v1-en", PRE_GPT2, false},
    {"jina-v2-code", PRE_GPT2, false}, {"roberta-bpe", PRE_GPT2, false}, {"mpt", PRE_GPT2, false},
    {"olmo", PRE_GPT2, false}, {"jais", PRE_GPT2, false}, {"trillion", PRE_GPT2, false},
    {"granite-docling", PRE_GPT2, false},
};

struct tok_pretok {
    int n;
    pcre2_code *re[TOK_MAX_REGEX];
    pcre2_general_context *gctx;
    pcre2_match_data *md;     /* shared match data; a concurrent caller makes its own */
    atomic_flag md_busy;
};

static void *pcre_malloc(PCRE2_SIZE n, void *ud) { (void)ud; return kiln_malloc(n); }
static void pcre_free(void *p, void *ud) { (void)ud; kiln_free(p); }

void tok_pretok_close(tok_pretok *p) {
    if (!p) return;
    for (int i = 0; i < p->n; i++) pcre2_code_free(p->re[i]);
    pcre2_match_data_free(p->md);
    pcre2_general_context_free(p->gctx);
    kiln_free(p);
}

kiln_status tok_pretok_open(const char *pre, tok_pretok **out, bool *ignore_merges, const char **used_name) {
    *out = NULL;
    pre_set set = PRE_DEFAULT;
    *ignore_merges = false;
    *used_name = "default";
    bool found = false;
    for (size_t i = 0; i < sizeof pre_names / sizeof *pre_names; i++) {
        if (!strcmp(pre, pre_names[i].name)) {
            set = pre_names[i].set;
            *ignore_merges = pre_names[i].ignore_merges;
            *used_name = pre_names[i].name;
            found = true;
            break;
        }
    }
    if (!found) KILN_WARN("tokenizer: unknown tokenizer.ggml.pre '%s'; using the default pre-tokenizer", pre);

    tok_pretok *p = kiln_calloc(1, sizeof *p);
    if (!p) return kiln_fail(KILN_ERR_NOMEM, "tokenizer: out of memory");
    atomic_flag_clear(&p->md_busy);
    p->gctx = pcre2_general_context_create(pcre_malloc, pcre_free, NULL);
    pcre2_compile_context *cctx = p->gctx ? pcre2_compile_context_create(p->gctx) : NULL;
    if (!cctx) {
        tok_pretok_close(p);
        return kiln_fail(KILN_ERR_NOMEM, "tokenizer: out of memory for the pre-tokenizer");
    }
    kiln_status st = KILN_OK;
    for (int i = 0; i < TOK_MAX_REGEX && pre_regexes[set][i]; i++) {
        int err;
        PCRE2_SIZE erroff;
        pcre2_code *re = pcre2_compile((PCRE2_SPTR)pre_regexes[set][i], PCRE2_ZERO_TERMINATED,
                                       PCRE2_UTF | PCRE2_UCP | PCRE2_DOLLAR_ENDONLY, &err, &erroff, cctx);
        if (!re) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(err, msg, sizeof msg);
            st = kiln_fail(KILN_ERR_INTERNAL, "tokenizer: pre-tokenizer '%s' regex %d does not compile at %zu: %s",
                           *used_name, i, (size_t)erroff, (const char *)msg);
            break;
        }
        pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);   /* falls back to the interpreter when JIT is unavailable */
        p->re[p->n++] = re;
    }
    pcre2_compile_context_free(cctx);
    if (st == KILN_OK) {
        p->md = pcre2_match_data_create(4, p->gctx);
        if (!p->md) st = kiln_fail(KILN_ERR_NOMEM, "tokenizer: out of memory for the pre-tokenizer");
    }
    if (st != KILN_OK) {
        tok_pretok_close(p);
        return st;
    }
    *out = p;
    return KILN_OK;
}

static kiln_status split_level(const tok_pretok *p, pcre2_match_data *md, int level, const char *text, size_t s,
                               size_t e, tok_word_fn fn, void *ctx) {
    if (level == p->n) return fn(ctx, text + s, e - s);
    const char *sub = text + s;
    size_t n = e - s, pos = 0;
    while (pos < n) {
        int rc = pcre2_match(p->re[level], (PCRE2_SPTR)sub, n, pos, PCRE2_NO_UTF_CHECK | PCRE2_NOTEMPTY, md, NULL);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
            rc = pcre2_match(p->re[level], (PCRE2_SPTR)sub, n, pos, PCRE2_NO_UTF_CHECK | PCRE2_NOTEMPTY | PCRE2_NO_JIT,
                             md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return kiln_fail(KILN_ERR_INTERNAL, "tokenize: pre-tokenizer match failed at byte %zu: %s", s + pos,
                             (const char *)msg);
        }
        const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t ms = ov[0], me = ov[1];
        if (ms > pos) KILN_TRY(split_level(p, md, level + 1, text, s + pos, s + ms, fn, ctx));
        KILN_TRY(split_level(p, md, level + 1, text, s + ms, s + me, fn, ctx));
        pos = me;
    }
    if (pos < n) KILN_TRY(split_level(p, md, level + 1, text, s + pos, e, fn, ctx));
    return KILN_OK;
}

kiln_status tok_pretok_split(const tok_pretok *cp, const char *text, size_t len, tok_word_fn fn, void *ctx) {
    tok_pretok *p = (tok_pretok *)cp;   /* only the busy flag changes */
    pcre2_match_data *md = p->md;
    bool own = atomic_flag_test_and_set(&p->md_busy);
    if (own) {
        md = pcre2_match_data_create(4, p->gctx);
        if (!md) return kiln_fail(KILN_ERR_NOMEM, "tokenize: out of memory");
    }
    kiln_status st = len ? split_level(p, md, 0, text, 0, len, fn, ctx) : KILN_OK;
    if (own) pcre2_match_data_free(md);
    else atomic_flag_clear(&p->md_busy);
    return st;
}
